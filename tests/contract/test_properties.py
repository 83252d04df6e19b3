"""Property tests of the batching contract over all four containers and random nestings.

Every nesting comes from ``nnx_ppo.testing.strategies.container_nestings`` and mixes
the three example leaves (stateless, stateful, stats-bearing). Modules run eagerly
(one test also compiles them): each distinct nesting would otherwise compile anew,
while eager dispatch reuses the per-shape kernels that the strategies' few shapes
keep few.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from jaxtyping import Array, Float

from nnx_ppo.networks.containers import Concat
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput
from nnx_ppo.testing import strategies as nst
from nnx_ppo.testing.modules import (
    Linear,
    StatsRecorder,
    make_linear,
    make_running_sum,
)

# Permuting rows or slicing one out may change how XLA blocks a matmul.
RTOL = ATOL = 1e-5

_EMITTED: dict[int, list[Array]] = {}
"""What each SpyRecorder emitted, call by call, keyed by id (cleared per example)."""


class SpyRecorder(StatsRecorder):
    """A StatsRecorder that logs, outside the module, the extras each call emits."""

    def __call__(
        self, state: tuple[()], x: Float[Array, "B f"], rollout_extras: Any = None
    ) -> StatefulModuleOutput:
        out = super().__call__(state, x, rollout_extras)
        _EMITTED.setdefault(id(self), []).append(out.rollout_extras)
        return out


def make_spy(in_features: int, rngs: nnx.Rngs) -> SpyRecorder:
    del rngs
    return SpyRecorder(in_features)


def _per_sample_spec(batched: Any) -> Any:
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), batched)


def _random_state(data: st.DataObject, module: StatefulModule, batch_size: int) -> Any:
    """A carry with random values (a fresh one is all zeros and would hide mixing)."""
    spec = _per_sample_spec(module.initialize_state(1))
    return data.draw(nst.pytree_observations(spec, batch_size=batch_size), label="state")


def _rows(tree: Any, rows: Any) -> Any:
    return jax.tree.map(lambda a: a[rows], tree)


def _assert_trees_close(actual: Any, expected: Any) -> None:
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
        assert a.shape == e.shape and a.dtype == e.dtype, (a.shape, a.dtype, e.shape, e.dtype)
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=RTOL, atol=ATOL)


def _assert_same_layout(actual: Any, expected: Any) -> None:
    """Same tree structure, and leaf by leaf the same shape and dtype."""
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
        assert (a.shape, a.dtype) == (e.shape, e.dtype)


def _batched_rows(out: StatefulModuleOutput, rows: Any) -> StatefulModuleOutput:
    """Select ``rows`` of every batched part of a call's result; scalars stay as they are."""

    def select(a: Array) -> Array:
        return a if a.ndim == 0 else a[rows]

    return jax.tree.map(select, out)


@nnx.jit
def _compiled_step(module: StatefulModule, state: Any, x: Any) -> StatefulModuleOutput:
    # nnx.jit caches by the module's graph structure, so equal nestings share a compile.
    return module(state, x)


@given(nst.container_nestings(), nst.batch_sizes(), st.data())
def test_every_leaf_leads_with_the_batch_size_also_when_compiled(
    nesting: nst.Nesting, batch_size: int, data: st.DataObject
) -> None:
    module = nesting.module
    state = module.initialize_state(batch_size)
    x = data.draw(nst.pytree_observations(nesting.input_spec, batch_size=batch_size))

    out = _compiled_step(module, state, x)

    for part in (state, out.output, out.next_state, out.rollout_extras):
        assert all(leaf.shape[0] == batch_size for leaf in jax.tree.leaves(part))
    assert out.regularization_loss.shape in ((), (batch_size,))
    assert all(leaf.ndim == 0 or leaf.shape[0] == batch_size for leaf in jax.tree.leaves(out))


@given(nst.container_nestings(), nst.batch_sizes().filter(lambda b: b > 1), st.data())
def test_permuting_the_batch_permutes_every_output(
    nesting: nst.Nesting, batch_size: int, data: st.DataObject
) -> None:
    module = nesting.module
    state = _random_state(data, module, batch_size)
    x = data.draw(nst.pytree_observations(nesting.input_spec, batch_size=batch_size))
    permutation = np.asarray(data.draw(st.permutations(range(batch_size)), label="permutation"))

    out = module(state, x)
    permuted_out = module(_rows(state, permutation), _rows(x, permutation))

    _assert_trees_close(permuted_out, _batched_rows(out, permutation))


@given(nst.container_nestings(), nst.batch_sizes(), st.data())
def test_a_row_alone_gives_the_same_results_as_in_the_batch(
    nesting: nst.Nesting, batch_size: int, data: st.DataObject
) -> None:
    module = nesting.module
    state = _random_state(data, module, batch_size)
    x = data.draw(nst.pytree_observations(nesting.input_spec, batch_size=batch_size))
    row = data.draw(st.integers(0, batch_size - 1), label="row")
    one_row = slice(row, row + 1)

    out = module(state, x)
    alone = module(_rows(state, one_row), _rows(x, one_row))

    _assert_trees_close(alone, _batched_rows(out, one_row))


@given(nst.container_nestings(), nst.batch_sizes(), st.data())
def test_call_and_reset_preserve_the_carry_layout(
    nesting: nst.Nesting, batch_size: int, data: st.DataObject
) -> None:
    module = nesting.module
    fresh = module.initialize_state(batch_size)
    state = _random_state(data, module, batch_size)
    _assert_same_layout(state, fresh)
    x = data.draw(nst.pytree_observations(nesting.input_spec, batch_size=batch_size))

    next_state = module(state, x).next_state
    reset = module.reset_state(state)

    _assert_same_layout(next_state, state)
    _assert_same_layout(reset, state)
    if jax.tree.leaves(state):
        # reset_state also runs under vmap on one env's slice: same layout, same values.
        _assert_trees_close(jax.vmap(module.reset_state)(state), reset)
        one_env = _rows(state, 0)
        _assert_same_layout(module.reset_state(one_env), one_env)


@given(
    nst.container_nestings((make_linear, make_running_sum, make_spy)),
    nst.batch_sizes(),
    nst.time_lengths(),
    st.data(),
)
def test_update_statistics_gives_each_stats_leaf_exactly_its_history(
    nesting: nst.Nesting, batch_size: int, time_length: int, data: st.DataObject
) -> None:
    module = nesting.module
    recorders = [node for _, node in nnx.iter_graph(module) if isinstance(node, SpyRecorder)]
    assume(recorders)
    _EMITTED.clear()
    inputs = nst.pytree_observations(nesting.input_spec, batch_size=batch_size)
    state = module.initialize_state(batch_size)
    emitted = []
    for _ in range(time_length):
        out = module(state, data.draw(inputs))
        state = out.next_state
        emitted.append(out.rollout_extras)

    module.update_statistics(jax.tree.map(lambda *steps: jnp.stack(steps), *emitted))

    for recorder in recorders:
        history = np.stack([np.asarray(e) for e in _EMITTED[id(recorder)]])
        assert history.shape == (time_length, batch_size, recorder.features)
        assert int(recorder.updates[...]) == 1
        assert int(recorder.samples[...]) == time_length * batch_size
        np.testing.assert_allclose(
            np.asarray(recorder.total[...]), history.sum(axis=(0, 1)), rtol=RTOL, atol=ATOL
        )


def _numpy_linear(module: Linear, x: Any) -> np.ndarray:
    flat = np.asarray(x).reshape(len(x), -1).astype(np.float64)
    return flat @ np.asarray(module.kernel[...]) + np.asarray(module.bias[...])


def _concat_in_declared_order(
    spec: Any, rngs: nnx.Rngs, data: st.DataObject
) -> tuple[Concat, Callable[[Any], np.ndarray]]:
    """A Concat (nested like ``spec``, keys declared in a drawn order) applying a Linear to
    every observation leaf, and an independent NumPy reference that concatenates in the
    declared order (never in the order the container happens to keep)."""
    keys = data.draw(st.permutations(list(spec)), label="declared order")
    children: dict[str, StatefulModule] = {}
    parts: list[tuple[str, Callable[[Any], np.ndarray]]] = []
    for key in keys:
        if isinstance(spec[key], dict):
            children[key], part = _concat_in_declared_order(spec[key], rngs, data)
        else:
            linear = Linear(math.prod(spec[key].shape), 2, rngs=rngs)
            children[key], part = linear, functools.partial(_numpy_linear, linear)
        parts.append((key, part))

    def reference(x: Any) -> np.ndarray:
        return np.concatenate([part(x[key]) for key, part in parts], axis=-1)

    return Concat(children), reference


@nnx.jit
def _compiled_output(module: StatefulModule, state: Any, x: Any) -> Any:
    return module(state, x).output


@settings(max_examples=25)
@given(nst.pytree_observations(), st.integers(0, 2**16), st.data())
def test_concat_matches_numpy_in_declared_order_eager_compiled_and_merged(
    observation: Any, seed: int, data: st.DataObject
) -> None:
    module, reference = _concat_in_declared_order(
        _per_sample_spec(observation), nnx.Rngs(seed), data
    )
    batch_size = jax.tree.leaves(observation)[0].shape[0]
    state = module.initialize_state(batch_size)
    expected = reference(observation)

    eager = module(state, observation).output
    compiled = _compiled_output(module, state, observation)
    merged = nnx.merge(*nnx.split(module))(state, observation).output

    for actual in (eager, compiled, merged):
        np.testing.assert_allclose(np.asarray(actual), expected, rtol=RTOL, atol=ATOL)


_CARRY_EXAMPLE = {
    "keys": jax.ShapeDtypeStruct((), jax.random.key(0).dtype),
    "counts": jax.ShapeDtypeStruct((2,), jnp.int32),
    "done": jax.ShapeDtypeStruct((), jnp.bool_),
    "h": [jax.ShapeDtypeStruct((2, 3), jnp.float16)],
}


@given(nst.pytree_observations(_CARRY_EXAMPLE, batch_size=5))
def test_pytree_observations_follow_the_example_with_a_batch_axis(carry: Any) -> None:
    assert jax.tree.structure(carry) == jax.tree.structure(_CARRY_EXAMPLE)
    for leaf, spec in zip(jax.tree.leaves(carry), jax.tree.leaves(_CARRY_EXAMPLE), strict=True):
        assert (leaf.shape, leaf.dtype) == ((5, *spec.shape), spec.dtype)
    # Per-env keys must differ, or every env would draw the same random numbers.
    key_data = np.asarray(jax.random.key_data(carry["keys"]))
    assert len({row.tobytes() for row in key_data}) == 5


@pytest.mark.parametrize(
    ("batch_size", "error"), [(0, ValueError), (-1, ValueError), (2.0, TypeError)]
)
def test_pytree_observations_refuse_a_batch_size_that_is_no_positive_int(
    batch_size: Any, error: type
) -> None:
    with pytest.raises(error, match="pytree_observations: batch_size must be"):
        nst.pytree_observations(batch_size=batch_size)


class _NumPyCarry(StatefulModule):
    """Starts its carry with NumPy (``dtype``), and steps it (reversed) as JAX holds it."""

    def __init__(self, dtype: Any) -> None:
        self.dtype = dtype

    def initialize_state(self, batch_size: int) -> dict[str, Any]:
        return {"h": np.ones((batch_size, 2), self.dtype)}

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        h = jnp.flip(jnp.asarray(state["h"]), axis=-1)
        return StatefulModuleOutput({"h": h}, x, jnp.zeros(()), {}, None)

    def reset_state(self, prev_state: Any) -> Any:
        return jax.tree.map(jnp.zeros_like, prev_state)


@settings(max_examples=8)
@given(
    st.sampled_from([np.float64, np.int64, np.uint64, np.complex128, np.float32, np.bool_]),
    nst.batch_sizes(),
)
def test_a_numpy_carry_steps_eagerly_as_compiled(dtype: Any, batch_size: int) -> None:
    # A float64 NumPy carry stepped eagerly was refused (its next_state float32, as JAX
    # holds it), while under jit, where it is float32 from the start, it ran.
    module = _NumPyCarry(dtype)
    state = module.initialize_state(batch_size)
    x = jnp.zeros((batch_size, 1))
    eager = module(state, x).next_state
    compiled = nnx.jit(lambda m, s, x: m(s, x))(module, state, x).next_state
    assert eager["h"].dtype == compiled["h"].dtype == jax.dtypes.canonicalize_dtype(dtype)
    module.reset_state(state)
