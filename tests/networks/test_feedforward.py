"""Dense: numerics against NumPy, statelessness, and bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given
from hypothesis import strategies as st

import nnx_ppo
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.types import StatefulModuleOutput

IN, OUT = 3, 4


@nnx.jit
def _call(module: Dense, x: jax.Array) -> StatefulModuleOutput:
    return module((), x)


@pytest.fixture(scope="module")
def relu_dense() -> Dense:
    return Dense(IN, OUT, nnx.Rngs(0), activation=nnx.relu, bias_init=nnx.initializers.normal())


@given(batch=st.sampled_from([1, 2, 3, 5]), seed=st.integers(0, 2**16))
def test_dense_matches_numpy_affine_then_activation(relu_dense: Dense, batch: int, seed: int):
    assert nnx_ppo.checks_enabled()
    x = np.random.default_rng(seed).normal(size=(batch, IN)).astype(np.float32)
    kernel = np.asarray(relu_dense.linear.kernel[...])
    bias = np.asarray(relu_dense.linear.bias[...])
    expected = np.maximum(x @ kernel + bias, 0.0)

    out = _call(relu_dense, jnp.asarray(x))

    np.testing.assert_allclose(np.asarray(out.output), expected, rtol=1e-5, atol=1e-6)
    assert out.next_state == ()
    assert out.rollout_extras is None
    assert out.metrics == {}
    assert float(out.regularization_loss) == 0.0


def test_dense_without_activation_is_linear_and_forwards_linear_kwargs():
    dense = Dense(IN, OUT, nnx.Rngs(1), use_bias=False)
    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, IN)), jnp.float32)
    assert dense.linear.bias is None
    expected = np.asarray(x) @ np.asarray(dense.linear.kernel[...])
    np.testing.assert_allclose(np.asarray(_call(dense, x).output), expected, rtol=1e-5, atol=1e-6)
    assert dense.reset_state(()) == ()
    assert dense.initialize_state(3) == ()


def test_dense_rejects_wrong_input_width_naming_it(relu_dense: Dense):
    with pytest.raises(nnx_ppo.ContractError, match="in_features"):
        relu_dense((), jnp.zeros((2, IN + 1)))


@pytest.mark.parametrize(
    ("args", "kwargs", "error"),
    [
        ((0, 2), {}, ValueError),
        ((2, -1), {}, ValueError),
        ((2.0, 2), {}, TypeError),
        ((True, 2), {}, TypeError),
        ((2, 2), {"activation": "relu"}, TypeError),
    ],
)
def test_dense_rejects_bad_constructor_arguments(args, kwargs, error):
    with pytest.raises(error, match="Dense"):
        Dense(*args, nnx.Rngs(0), **kwargs)
