"""Dense's product: lax.dot_general's values, its weight gradient a row-major product on CPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import lax

from nnx_ppo._compile import training_compile_options
from nnx_ppo.networks._matmul import NARROWEST_ROUTED, dense_dot_general
from nnx_ppo.networks.feedforward import Dense

ROW_TIMES_MATRIX = (((1,), (0,)), ((), ()))


def _operands(batch: int, inputs: int, outputs: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    x_key, w_key, cotangent_key = jax.random.split(jax.random.key(0), 3)
    return (
        jax.random.normal(x_key, (batch, inputs)),
        jax.random.normal(w_key, (inputs, outputs)),
        jax.random.normal(cotangent_key, (batch, outputs)),
    )


def _loss(dot, x, w, cotangent):
    return jnp.sum(jnp.tanh(dot(x, w, ROW_TIMES_MATRIX)) * cotangent)


@pytest.mark.parametrize("shape", [(1280, 64, 64), (96, 5, 256), (7, 64, 2)])
def test_values_and_gradients_are_lax_dot_generals(shape):
    x, w, cotangent = _operands(*shape)
    forward = jax.jit(lambda x, w: dense_dot_general(x, w, ROW_TIMES_MATRIX))(x, w)
    assert (forward == lax.dot_general(x, w, ROW_TIMES_MATRIX)).all()

    def gradients(dot):
        return jax.jit(jax.grad(lambda x, w: _loss(dot, x, w, cotangent), (0, 1)))(x, w)

    (x_grad, w_grad), (x_reference, w_reference) = (
        gradients(dense_dot_general),
        gradients(lax.dot_general),
    )
    # The input gradient is the same product, in another program, whose fusions XLA may
    # choose differently on another CPU: float32 rounding, not bits. The weight gradient
    # is the same sum in another order.
    np.testing.assert_allclose(x_grad, x_reference, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(w_grad, w_reference, rtol=1e-5, atol=1e-4)


def test_forward_mode_and_vmap_go_through():
    x, w, cotangent = _operands(32, 16, 16)
    reference = jax.grad(lambda w: _loss(lax.dot_general, x, w, cotangent))(w)
    forward_mode = jax.jacfwd(lambda w: _loss(dense_dot_general, x, w, cotangent))(w)
    np.testing.assert_allclose(forward_mode, reference, rtol=1e-5, atol=1e-4)
    per_run = jax.vmap(jax.grad(lambda w: _loss(dense_dot_general, x, w, cotangent)))(
        jnp.stack([w, 2 * w])
    )
    np.testing.assert_allclose(per_run[0], reference, rtol=1e-5, atol=1e-4)


def _weight_gradient_hlo(dot, shape: tuple[int, int, int]) -> str:
    x, w, cotangent = _operands(*shape)
    program = jax.jit(
        jax.grad(lambda w, x: _loss(dot, x, w, cotangent)),
        compiler_options=training_compile_options(),
    )
    return program.lower(w, x).compile().as_text()


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the routing is CPU's")
def test_on_cpu_the_weight_gradient_contracts_a_row_major_left_operand():
    # lax.dot_general's weight gradient contracts the batch axis of both operands
    # (lhs_contracting_dims={0}), which XLA:CPU leaves to Eigen.
    assert "lhs_contracting_dims={0}" in _weight_gradient_hlo(lax.dot_general, (256, 64, 64))
    routed = _weight_gradient_hlo(dense_dot_general, (256, 64, 64))
    assert "lhs_contracting_dims={0}" not in routed


@pytest.mark.parametrize(
    "x, w, dimension_numbers",
    [
        (jnp.ones((4, 8)), jnp.ones((8, NARROWEST_ROUTED - 1)), ROW_TIMES_MATRIX),  # a head
        (jnp.ones((2, 4, 8)), jnp.ones((8, 16)), (((2,), (0,)), ((), ()))),  # 3-D input
        (jnp.ones((4, 8), jnp.bfloat16), jnp.ones((8, 16), jnp.bfloat16), ROW_TIMES_MATRIX),
    ],
)
def test_other_products_are_lax_dot_general_itself(x, w, dimension_numbers):
    def jaxpr(dot):
        return str(jax.make_jaxpr(jax.grad(lambda w: dot(x, w, dimension_numbers).sum()))(w))

    assert "custom_jvp" not in jaxpr(dense_dot_general)
    assert jaxpr(dense_dot_general) == jaxpr(lax.dot_general)


def test_a_program_over_several_devices_gets_lax_dot_general():
    x, w, _ = _operands(4, 16, 16)
    mesh = jax.sharding.AbstractMesh((2,), ("runs",), axis_types=(jax.sharding.AxisType.Explicit,))

    def jaxpr(dot):
        with jax.sharding.use_abstract_mesh(mesh):
            return str(jax.make_jaxpr(jax.grad(lambda w: dot(x, w, ROW_TIMES_MATRIX).sum()))(w))

    assert "custom_jvp" not in jaxpr(dense_dot_general)
    assert jaxpr(dense_dot_general) == jaxpr(lax.dot_general)


def test_dense_uses_it_unless_given_another():
    assert Dense(4, 16, nnx.Rngs(0)).linear.dot_general is dense_dot_general
    assert Dense(4, 16, nnx.Rngs(0), dot_general=lax.dot_general).linear.dot_general is (
        lax.dot_general
    )
