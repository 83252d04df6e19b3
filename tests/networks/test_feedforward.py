"""Dense and Stateless: numerics against NumPy, statelessness, and bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given
from hypothesis import strategies as st

import nnx_ppo
from nnx_ppo.networks.containers import Sequential
from nnx_ppo.networks.feedforward import Dense, Stateless
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


def test_stateless_wraps_an_nnx_module_or_a_function() -> None:
    linear = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    x = jnp.arange(12.0).reshape(4, 3)
    out = Stateless(linear)((), x)
    np.testing.assert_allclose(out.output, linear(x))
    assert out.next_state == () and out.rollout_extras is None
    np.testing.assert_allclose(Stateless(jnp.tanh)((), x).output, jnp.tanh(x))


def test_stateless_refuses_a_contract_module_and_a_non_callable() -> None:
    with pytest.raises(TypeError, match="already a StatefulModule"):
        Stateless(Dense(3, 2, nnx.Rngs(0)))
    with pytest.raises(TypeError, match="takes an NNX module or a function"):
        Stateless(3)
    with pytest.raises(TypeError, match="a class: pass an instance"):
        Stateless(nnx.Linear)


def test_a_graph_transform_or_frozen_module_given_a_plain_nnx_module_points_to_stateless():
    from nnx_ppo.networks import FrozenStatistics
    from nnx_ppo.networks.graph.connection import Connection

    with pytest.raises(TypeError, match=r"transform is a Linear, .*networks\.Stateless"):
        Connection("s", "h", nnx.Linear(3, 2, rngs=nnx.Rngs(0)), 0)
    with pytest.raises(TypeError, match=r"wraps is a PjitFunction, .*networks\.Stateless"):
        FrozenStatistics(jnp.tanh)


def test_a_container_given_a_plain_nnx_module_points_to_stateless() -> None:
    named = r"layer 0 is a Linear, not a StatefulModule; subclass .* nnx_ppo\.networks\.Stateless"
    with pytest.raises(TypeError, match=named):
        Sequential([nnx.Linear(3, 2, rngs=nnx.Rngs(0))])


def test_a_container_given_a_class_asks_for_an_instance() -> None:
    from nnx_ppo.networks.utils import Flattener

    asked = r"layer 0 is the class Flattener, not a module: did you mean Flattener\(\.\.\.\)\?"
    with pytest.raises(TypeError, match=asked):
        Sequential([Flattener, Dense(3, 2, nnx.Rngs(0))])
    with pytest.raises(TypeError, match="layer 0 is the class Linear, not a StatefulModule"):
        Sequential([nnx.Linear])
