"""Containers: layers given as any iterable, a carry or extras that does not hold one
entry per child, and Concat's children's outputs, each named."""

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import nnx_ppo
from nnx_ppo import ContractError
from nnx_ppo.networks import GRU, Concat, Dense, Filter, Parallel, Sequential, Stateless

B = 5


def test_sequential_reads_a_generator_of_layers() -> None:
    rngs = nnx.Rngs(0)
    net = Sequential(Dense(a, b, rngs) for a, b in [(3, 8), (8, 2)])
    assert len(net) == 2
    out = net(net.initialize_state(B), jnp.ones((B, 3)))
    assert out.output.shape == (B, 2)
    with pytest.raises(ValueError, match="at least one layer"):
        Sequential(layer for layer in ())


def _sequential() -> Sequential:
    rngs = nnx.Rngs(0)
    return Sequential([Dense(3, 4, rngs), GRU(4, 4, rngs)])


def _parallel() -> Parallel:
    rngs = nnx.Rngs(0)
    return Parallel(a=GRU(3, 2, rngs), b=GRU(3, 2, rngs))


X = jnp.ones((B, 3))
H = jnp.zeros((B, 2))


@pytest.mark.parametrize(
    ("call", "where", "leaf", "expected", "found"),
    [
        (
            lambda: _sequential()([()], X),
            "Sequential.__call__",
            "state",
            "a list of length 2, one entry per layer",
            "a list of length 1",
        ),
        (
            lambda: _sequential()([(), jnp.zeros((B, 4))], X, [None]),
            "Sequential.__call__",
            "rollout_extras",
            "a list of length 2, one entry per layer",
            "a list of length 1",
        ),
        (
            lambda: _sequential().reset_state([()]),
            "Sequential.reset_state",
            "prev_state",
            "a list of length 2, one entry per layer",
            "a list of length 1",
        ),
        (
            lambda: _sequential().update_statistics([None, None, None]),
            "Sequential.update_statistics",
            "rollout_extras",
            "a list of length 2, one entry per layer",
            "a list of length 3",
        ),
        (
            lambda: _parallel()({"a": H}, X),
            "Parallel.__call__",
            "state",
            "a dict with keys ['a', 'b'], one per child",
            "a dict with keys ['a']",
        ),
        (
            lambda: _parallel()({"a": H, "b": H}, X, {"a": None, "c": None}),
            "Parallel.__call__",
            "rollout_extras",
            "a dict with keys ['a', 'b'], one per child",
            "a dict with keys ['a', 'c']",
        ),
        (
            lambda: _parallel().reset_state({"b": H}),
            "Parallel.reset_state",
            "prev_state",
            "a dict with keys ['a', 'b'], one per child",
            "a dict with keys ['b']",
        ),
        (
            lambda: _parallel().update_statistics({"a": None}),
            "Parallel.update_statistics",
            "rollout_extras",
            "a dict with keys ['a', 'b'], one per child",
            "a dict with keys ['a']",
        ),
    ],
)
def test_a_carry_or_extras_without_one_entry_per_child_is_named(
    call: Callable[[], Any], where: str, leaf: str, expected: str, found: str
) -> None:
    with pytest.raises(ContractError) as raised:
        call()
    error = raised.value
    assert str(error).startswith(f"{where}: {leaf} does not hold one entry per child.")
    assert (error.leaf, error.expected, error.found) == (leaf, expected, found)
    assert error.rule is not None and "custom_containers.html#the-four-rules" in error.rule


def test_a_nested_container_s_mismatch_names_its_path_under_jit_and_without_checks() -> None:
    net = Sequential([Dense(3, 3, nnx.Rngs(0)), _parallel()])
    state = [(), {"a": H}]
    with pytest.raises(ContractError, match=r"^Sequential\.layers\[1\] \(Parallel\)\.__call__"):
        nnx.jit(lambda m, s, x: m(s, x))(net, state, X)
    # Read by the container itself, not by the contract checks: it holds without them,
    # where no annotation check stops a carry of the wrong kind first.
    with nnx_ppo.checks(False):
        with pytest.raises(ContractError, match=r"found: +a dict with keys \['a'\]"):
            net(state, X)
        with pytest.raises(ContractError, match=r"found: +a list of length 2"):
            net.reset_state([(), [H, H]])


@pytest.mark.parametrize(
    ("child", "found"),
    [
        (Stateless(lambda x: x[:, 0]), f"shape ({B},) float32"),
        (Filter({"p": lambda x: x}), "a dict with keys ['p']"),
        (Stateless(lambda x: x[:, :, None]), f"shape ({B}, 2, 1) float32"),
    ],
)
def test_concat_names_a_child_whose_output_is_not_a_b_n_array(child: Any, found: str) -> None:
    net = Concat(a=Stateless(lambda x: x), b=child)
    with pytest.raises(ContractError) as raised:
        net({"a": (), "b": ()}, {"a": jnp.ones((B, 2)), "b": jnp.ones((B, 2))})
    error = raised.value
    assert str(error).startswith("Concat.__call__: child 'b' does not output a (B, n) array")
    assert (error.leaf, error.expected, error.found) == (
        "components['b'] output",
        "(B, n) array",
        found,
    )


def test_concat_joins_its_children_s_b_n_outputs() -> None:
    net = Concat(a=Stateless(lambda x: 2 * x), b=Stateless(lambda x: x[:, :1]))
    x = {"a": jnp.ones((B, 2)), "b": jnp.arange(2.0 * B).reshape(B, 2)}
    out = net({"a": (), "b": ()}, x).output
    np.testing.assert_array_equal(out[:, :2], 2 * np.ones((B, 2)))
    np.testing.assert_array_equal(out[:, 2], np.arange(0.0, 2 * B, 2))
