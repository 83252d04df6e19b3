"""The factories' compiled weight initialiser: flax's values, few programs for many shapes."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_ppo._compile import fast_compile_options
from nnx_ppo.networks import factories
from nnx_ppo.networks._initializers import variance_scaling_uniform


# Matrices below, at and above the smallest shared draw, and a 3-D kernel (its own program).
@pytest.mark.parametrize("shape", [(5, 64), (64, 2), (64, 64), (4097, 1), (3, 4, 6)])
@pytest.mark.parametrize("scale", [1.0, 0.7])
def test_compiled_variance_scaling_draws_flax_values(shape, scale):
    # The same operations on the same bits; one program may round a product and a
    # sum once (fused) where op-by-op rounds twice: a few float32 ulps at most.
    key = jax.random.key(11)
    reference = nnx.initializers.variance_scaling(scale, "fan_in", "uniform")
    drawn = variance_scaling_uniform(scale)(key, shape)
    np.testing.assert_allclose(drawn, reference(key, shape), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("shape", [(64, 2), (64, 64), (4097, 1)])
def test_a_shared_draw_has_the_bits_of_a_program_for_its_own_shape(shape):
    # Entry i of a counter-based draw is the same whatever the draw's size. Two programs
    # may still round the scaling differently on another CPU, so float32 ulps, not bits;
    # a draw that took other entries would be off by the kernel's whole range.
    key = jax.random.key(3)
    own_program = jax.jit(
        nnx.initializers.variance_scaling(0.7, "fan_in", "uniform"),
        static_argnums=(1, 2),
        compiler_options=fast_compile_options(),
    )
    np.testing.assert_allclose(
        variance_scaling_uniform(0.7)(key, shape),
        own_program(key, shape, jnp.float32),
        rtol=1e-6,
        atol=1e-7,
    )


def test_a_factory_builds_the_network_flax_initialisers_would():
    def params(network):
        return jax.tree.leaves(nnx.state(network, nnx.Param))

    built = factories.make_mlp(
        [5, 16, 3],
        nnx.Rngs(2),
        kernel_init=nnx.initializers.variance_scaling(1.0, "fan_in", "uniform"),
    )
    made = factories.make_mlp_actor_critic(5, 3, [16], [16], nnx.Rngs(2), normalize_obs=False)
    # The actor's first layer is the first draw of the same stream in both.
    np.testing.assert_allclose(
        params(made.action.layers[0])[1], params(built.layers[0])[1], rtol=1e-6, atol=1e-7
    )


def test_small_layers_of_any_shape_share_one_initialiser_program(caplog):
    def initialiser_compiles(hidden: int) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="jax._src.dispatch"):
            factories.make_mlp_actor_critic(7, 2, [hidden], [hidden + 2], nnx.Rngs(hidden))
        messages = [r.getMessage() for r in caplog.records]
        # Flax's initialiser per shape is jit(init); the shared flat draw jit(_flat_uniform).
        drawn = ("XLA compilation of jit(init)", "XLA compilation of jit(_flat_uniform)")
        return [m for m in messages if any(program in m for program in drawn)]

    initialiser_compiles(13)  # compiles the shared draw, unless another test did
    # Six kernel shapes no other build used (7 x 19, 19 x 4, 19 x 1, 7 x 21, ...): all
    # drawn by the program the first build compiled.
    assert not initialiser_compiles(19)


def test_a_factory_builds_inside_nnx_jit_and_eval_shape():
    # Traced, the initialiser takes no compiler options (only the outermost program
    # may): the network built in a user's nnx.jit holds the eager build's values.
    def build(rngs: nnx.Rngs):
        return factories.make_mlp_actor_critic(5, 2, [8], [8], rngs)

    eager = jax.tree.leaves(nnx.state(build(nnx.Rngs(4)), nnx.Param))
    compiled = jax.tree.leaves(nnx.state(nnx.jit(build)(nnx.Rngs(4)), nnx.Param))
    for a, b in zip(eager, compiled, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    abstract = nnx.eval_shape(lambda: build(nnx.Rngs(4)))
    shapes = [leaf.shape for leaf in jax.tree.leaves(nnx.state(abstract, nnx.Param))]
    assert shapes == [leaf.shape for leaf in eager]
