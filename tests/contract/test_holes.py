"""Bugs whose shapes give them away, each caught at trace time with a message naming it.

Each test here failed on the contract as it stood before (a mixin escaped the
checks, a child's history was never compared with its emission, a write in
``__call__`` surfaced as Flax's error, ...), and asserts on the parts of the
message a user needs: the module and its path, the leaf, expected and found.
"""

from __future__ import annotations

import enum
import re
import typing
import warnings
from collections import OrderedDict
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from beartype import beartype
from flax import nnx
from jaxtyping import Array, Float, PyTree, TypeCheckError, jaxtyped

import nnx_ppo
from nnx_ppo import ContractError
from nnx_ppo.algorithms.ppo import new_training_state
from nnx_ppo.contract.checking import CallRecord, observe_calls, typechecked
from nnx_ppo.envs import make
from nnx_ppo.networks.containers import FrozenStatistics, Parallel, Sequential
from nnx_ppo.networks.delay import Delay
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.normalizer import Normalizer
from nnx_ppo.networks.recording import extract_activations, with_recording
from nnx_ppo.networks.recurrent import GRU
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput
from nnx_ppo.testing import check_module
from nnx_ppo.testing.modules import StatsRecorder


def call_split(network: StatefulModule, x: jax.Array, *, compiled: bool) -> Any:
    """``network``'s output for ``x``, called as training calls it: on its ``nnx.split``
    state merged inside the call (under ``jax.jit`` when ``compiled``)."""
    graphdef, variables = nnx.split(network)

    def call(variables: nnx.State, x: jax.Array) -> Any:
        module = nnx.merge(graphdef, variables)
        return module(module.initialize_state(x.shape[0]), x).output

    return (jax.jit(call) if compiled else call)(variables, x)


def history_of(module: StatefulModule, x: jax.Array, steps: int = 5) -> Any:
    """The module's emissions for input ``x``, stacked ``steps`` times: ``(T, B, *feat)``."""
    out = module(module.initialize_state(x.shape[0]), x)
    return jax.tree.map(lambda e: jnp.stack([e] * steps), out.rollout_extras)


# ------------------------------------------------------------------------------ mixins


class _CarryMixin:
    """Contract methods defined outside any StatefulModule; the last one drops B."""

    def initialize_state(self, batch_size: int) -> jax.Array:
        return jnp.zeros((batch_size, 3))

    def __call__(self, state: jax.Array, x: jax.Array, rollout_extras: Any = None) -> Any:
        return StatefulModuleOutput(state[0], x, jnp.zeros(()), {}, None)


class _MixedIn(_CarryMixin, StatefulModule):
    pass


def test_a_mixins_call_is_checked() -> None:
    module = _MixedIn()
    with pytest.raises(ContractError) as caught:
        module(module.initialize_state(4), jnp.zeros((4, 2)))
    assert caught.value.where == "_MixedIn.__call__"
    assert caught.value.leaf == "next_state"
    assert "dropped the leading (batch) axis" in str(caught.value)
    assert caught.value.found == "shape (3,) float32"


class _StatisticsMixin:
    def update_statistics(self, rollout_extras: Any) -> None:
        del rollout_extras


class _MixedInStatistics(_StatisticsMixin, StatefulModule):
    def __call__(self, state: Any, x: jax.Array, rollout_extras: Any = None) -> Any:
        return StatefulModuleOutput(state, x, jnp.zeros(()), {}, x)


class _Forgetful(Sequential):
    def update_statistics(self, rollout_extras: list[Any]) -> None:
        del rollout_extras


def test_a_mixins_statistics_are_seen_by_the_routing_check() -> None:
    network = _Forgetful([Dense(2, 2, nnx.Rngs(0)), _MixedInStatistics()])
    with pytest.raises(ContractError) as caught:
        network.update_statistics(history_of(network, jnp.ones((3, 2))))
    assert caught.value.leaf == "_Forgetful.layers[1] (_MixedInStatistics)"
    assert "never reached" in str(caught.value)


def test_a_method_assigned_after_class_creation_is_checked() -> None:
    class Late(StatefulModule):
        def __call__(self, state: Any, x: jax.Array, rollout_extras: Any = None) -> Any:
            return StatefulModuleOutput(state, x, jnp.zeros(()), {}, None)

    def sums_over_the_batch(self: Any, state: Any, x: jax.Array, rollout_extras: Any = None) -> Any:
        return StatefulModuleOutput(state, x.sum(0), jnp.zeros(()), {}, None)

    Late.__call__ = sums_over_the_batch  # type: ignore[method-assign]
    with pytest.raises(ContractError) as caught:
        Late()((), jnp.zeros((4, 2)))
    assert caught.value.leaf == "output"
    assert "B=4 (bound by x)" in str(caught.value.expected)


# ----------------------------------------------------------------- per-child histories


class _LastStepOnly(Sequential):
    def update_statistics(self, rollout_extras: list[Any]) -> None:
        for layer, extras in zip(self.layers, rollout_extras, strict=True):
            layer.update_statistics(jax.tree.map(lambda h: h[-1], extras))


def test_a_child_given_only_the_last_step_is_caught() -> None:
    # B=4 and feat=4 would have bound T and B afresh on the child's (B, feat) slice.
    network = _LastStepOnly([Normalizer(4), Dense(4, 2, nnx.Rngs(0))])
    with pytest.raises(ContractError) as caught:
        network.update_statistics(history_of(network, jnp.ones((4, 4)), steps=5))
    error = caught.value
    assert error.where == "_LastStepOnly.layers[0] (Normalizer).update_statistics"
    assert "passed by _LastStepOnly" in str(error)
    assert "has the size of B: did it lose its T axis?" in str(error)
    assert "T=5" in str(error.expected)
    assert error.found == "shape (4, 4) float32"


class _FirstStepDropped(Sequential):
    def update_statistics(self, rollout_extras: list[Any]) -> None:
        for layer, extras in zip(self.layers, rollout_extras, strict=True):
            layer.update_statistics(jax.tree.map(lambda h: h[1:], extras))


def test_a_nested_calls_axes_name_the_call_that_bound_them() -> None:
    # The child's argument has the top-level call's name: the axis names whose leaf it is.
    network = _FirstStepDropped([Normalizer(4), Dense(4, 2, nnx.Rngs(0))])
    with pytest.raises(ContractError) as caught:
        network.update_statistics(history_of(network, jnp.ones((4, 4)), steps=6))
    error = caught.value
    assert error.where == "_FirstStepDropped.layers[0] (Normalizer).update_statistics"
    assert "was cut to 5 of 6 (a slice such as [-1:])" in str(error)
    bound = "T=6 (bound by rollout_extras[0] of _FirstStepDropped.update_statistics)"
    assert bound in str(error) and bound in str(error.expected)


class _WholeDictToEach(Parallel):
    def update_statistics(self, rollout_extras: dict[str, Any]) -> None:
        for _, child in self.children():
            child.update_statistics(rollout_extras)


def test_a_child_given_the_whole_extras_dict_is_caught() -> None:
    network = _WholeDictToEach(a=Normalizer(3), b=Normalizer(3))
    with pytest.raises(ContractError) as caught:
        network.update_statistics(history_of(network, jnp.ones((2, 3))))
    error = caught.value
    assert error.where == "_WholeDictToEach.components['a'] (Normalizer).update_statistics"
    assert "called by _WholeDictToEach" in str(error)
    assert "unexpected rollout_extras['a'], rollout_extras['b']" in str(error.found)


class _SwappedChildren(Parallel):
    def update_statistics(self, rollout_extras: dict[str, Any]) -> None:
        self.components["a"].update_statistics(rollout_extras["b"])
        self.components["b"].update_statistics(rollout_extras["a"])


def test_swapped_children_histories_are_caught() -> None:
    network = _SwappedChildren(
        a=Sequential([Dense(3, 2, nnx.Rngs(0)), Normalizer(2)]), b=Normalizer(3)
    )
    with pytest.raises(ContractError) as caught:
        network.update_statistics(history_of(network, jnp.ones((2, 3))))
    error = caught.value
    assert "(Sequential).update_statistics" in str(error.where)
    assert "called by _SwappedChildren" in str(error)


def test_a_history_with_another_feature_size_is_caught() -> None:
    network = Sequential([Normalizer(3)])
    network(network.initialize_state(2), jnp.ones((2, 3)))
    history = [jnp.ones((5, 2, 4))]
    with pytest.raises(ContractError) as caught:
        network.update_statistics(history)
    error = caught.value
    assert error.where == "Sequential.update_statistics"  # caught at the top, before routing
    assert error.leaf == "rollout_extras[0]"
    assert error.expected == "(T, B, 3) float32 with T=5, B=2"
    assert error.found == "shape (5, 2, 4) float32"


class _PerEntity(StatefulModule):
    """One Normalizer on each env's 3 entities, folded into its batch; ``rows`` picks
    how the history is handed on: all of them, or half the envs'."""

    def __init__(self, rows: str = "all") -> None:
        self.norm = Normalizer(2)
        self.rows = rows

    def __call__(self, state: Any, x: jax.Array, rollout_extras: Any = None) -> Any:
        out = self.norm((), x.reshape(-1, 2))
        extras = out.rollout_extras.reshape(x.shape)
        return StatefulModuleOutput((), out.output.reshape(x.shape), jnp.zeros(()), {}, extras)

    def update_statistics(self, rollout_extras: jax.Array) -> None:
        steps, envs = rollout_extras.shape[:2]
        kept = envs if self.rows == "all" else envs // 2
        self.norm.update_statistics(rollout_extras[:, :kept].reshape(steps, -1, 2))


def test_a_child_on_entities_folded_into_the_batch_gets_its_folded_history() -> None:
    network = _PerEntity()
    network.update_statistics(history_of(network, jnp.ones((4, 3, 2))))  # (5, 12, 2)
    assert float(network.norm.counter[...]) == 5 * 4 * 3
    check_module(network, jnp.zeros((3, 2)), max_examples=3)


def test_a_nested_history_of_fewer_rows_than_envs_is_caught() -> None:
    network = _PerEntity(rows="half")  # B=4: the child gets 2 envs x 3 entities = 6 rows
    with pytest.raises(ContractError) as caught:
        network.update_statistics(history_of(network, jnp.ones((4, 3, 2))))
    error = caught.value
    assert error.where == "_PerEntity.norm (Normalizer).update_statistics"
    assert "B=6 on axis 1, which is not a multiple of the top-level call's B=4" in str(error)
    assert error.found == "shape (5, 6, 2) float32"


def test_without_a_checked_call_update_statistics_falls_back_to_the_axis_checks() -> None:
    class NeverCalled(StatefulModule):
        def __call__(self, state: Any, x: jax.Array, rollout_extras: Any = None) -> Any:
            return StatefulModuleOutput(state, x, jnp.zeros(()), {}, x)

        def update_statistics(self, rollout_extras: Any) -> None:
            del rollout_extras

    module = NeverCalled()
    with nnx_ppo.checks(False):
        module((), jnp.ones((2, 3)))
    module.update_statistics(jnp.ones((5, 2, 7)))  # nothing recorded: any (T, B, *feat)
    with pytest.raises(ContractError, match="no leading"):
        module.update_statistics(jnp.ones(()))


class _ResetsCrosswise(Parallel):
    """Resets each child's slot through the other child's reset_state."""

    def reset_state(self, prev_state: dict[str, Any]) -> dict[str, Any]:
        a, b = self.components["a"], self.components["b"]
        return {"a": b.reset_state(prev_state["a"]), "b": a.reset_state(prev_state["b"])}


def test_a_child_reset_with_another_childs_carry_is_caught() -> None:
    network = _ResetsCrosswise(a=GRU(2, 2, nnx.Rngs(0)), b=Delay(jnp.zeros(2), 3))
    carry = network.initialize_state(4)
    with pytest.raises(ContractError) as caught:
        network.reset_state(carry)
    error = caught.value
    assert error.where == "_ResetsCrosswise.components['b'] (Delay).reset_state"
    assert "was given a carry that is not the one its initialize_state builds" in str(error)
    assert "called by _ResetsCrosswise" in str(error)
    assert "prev_state['buffer'] (..., 3, 2) float32" in str(error.expected)
    # Two delay lines of one length and other widths: their shapes are settings, not
    # variables, and told them apart only once they entered the structure's key.
    network = _ResetsCrosswise(a=Delay(jnp.zeros(2), 2), b=Delay(jnp.zeros(5), 2))
    with pytest.raises(ContractError, match="was given a carry that is not the one"):
        network.reset_state(network.initialize_state(4))
    assert error.found == "prev_state shape (4, 2) float32"


def test_a_childs_own_carry_is_accepted_with_any_leading_axes() -> None:
    network = Parallel(a=GRU(2, 2, nnx.Rngs(0)), b=Delay(jnp.zeros(2), 3))
    carry = network.initialize_state(4)
    network.reset_state(carry)
    jax.vmap(network.reset_state)(carry)  # one env's slice
    network.reset_state(jax.tree.map(lambda leaf: leaf.reshape(2, 2, *leaf.shape[1:]), carry))


# ------------------------------------------------------------------------ frozen stats


class _DropsTheNormalizer(Sequential):
    def update_statistics(self, rollout_extras: list[Any]) -> None:
        self.layers[0].update_statistics(rollout_extras[0])


def test_a_frozen_normalizer_is_not_expected_and_a_live_one_still_is() -> None:
    frozen = Normalizer(3)
    network = Sequential([FrozenStatistics(frozen), Normalizer(3), Dense(3, 2, nnx.Rngs(0))])
    network.update_statistics(history_of(network, jnp.ones((4, 3))))
    assert float(frozen.counter[...]) == 0.0
    assert float(network.layers[1].counter[...]) == 20.0

    dropping = _DropsTheNormalizer(list(network.layers))
    with pytest.raises(ContractError) as caught:
        dropping.update_statistics(history_of(dropping, jnp.ones((4, 3))))
    assert caught.value.leaf == "_DropsTheNormalizer.layers[1] (Normalizer)"


def test_frozen_statistics_wraps_only_contract_modules() -> None:
    with pytest.raises(TypeError, match="FrozenStatistics wraps is a Linear, not a StatefulModule"):
        FrozenStatistics(nnx.Linear(2, 2, rngs=nnx.Rngs(0)))  # type: ignore[arg-type]


# ---------------------------------------------------------------------- variable kinds


class _WritesStatisticsInCall(StatefulModule):
    def __init__(self) -> None:
        self.mean = nnx.BatchStat(jnp.zeros(3))

    def __call__(self, state: Any, x: jax.Array, rollout_extras: Any = None) -> Any:
        self.mean[...] = x.mean(0)
        return StatefulModuleOutput(state, x - self.mean[...], jnp.zeros(()), {}, None)


def test_a_statistic_written_in_call_is_named_eagerly() -> None:
    network = Sequential([Dense(3, 3, nnx.Rngs(0)), _WritesStatisticsInCall()])
    with pytest.raises(ContractError) as caught:
        network(network.initialize_state(2), jnp.ones((2, 3)))
    error = caught.value
    assert error.leaf == "Sequential.layers[1].mean (BatchStat)"
    assert error.found == "Sequential.layers[1].mean (BatchStat) written during the call"
    assert "statistics only in update_statistics" in str(error.rule)


def test_a_statistic_written_in_call_under_a_transform_is_named() -> None:
    module = _WritesStatisticsInCall()

    def scanned(x: jax.Array) -> jax.Array:
        def body(carry: jax.Array, _: None) -> tuple[jax.Array, None]:
            return module((), carry).output, None

        return jax.lax.scan(body, x, None, length=2)[0]

    with pytest.raises(ContractError) as caught:
        scanned(jnp.ones((2, 3)))
    error = caught.value
    assert error.where == "_WritesStatisticsInCall.__call__"
    assert error.leaf == "_WritesStatisticsInCall.mean (BatchStat)"
    assert "inside a JAX transform" in str(error)


class _CountsInAnArrayAttribute(StatefulModule):
    """A statistic held as a plain array attribute (no nnx.Variable), written in __call__."""

    def __init__(self) -> None:
        self.seen = jnp.zeros(())

    def __call__(self, state: Any, x: jax.Array, rollout_extras: Any = None) -> Any:
        self.seen = self.seen + x.shape[0]
        return StatefulModuleOutput(state, x, jnp.zeros(()), {}, None)


@pytest.mark.parametrize("compiled", [False, True])
def test_an_array_attribute_written_in_call_is_named(compiled: bool) -> None:
    network = Sequential([Dense(3, 3, nnx.Rngs(0)), _CountsInAnArrayAttribute()])

    with pytest.raises(ContractError) as caught:
        call_split(network, jnp.ones((2, 3)), compiled=compiled)
    error = caught.value
    assert error.where == "Sequential.layers[1] (_CountsInAnArrayAttribute).__call__"
    assert error.leaf == "Sequential.layers[1].seen (an array attribute)"
    assert "in a compiled call the change is lost" in str(error)
    # Unchanged parameters are the very tracers they were: no transform wrote them back.
    assert "NNX transform inside the call" not in str(error)


class _CountsEpisodes(StatefulModule):
    """Counts episodes in ``reset_state``: in a BatchStat, a plain array attribute, or
    by a draw from an nnx.Rngs stream."""

    def __init__(self, held: str) -> None:
        self.held = held
        self.episodes = nnx.BatchStat(jnp.zeros(()))
        self.plain = jnp.zeros(())
        self.rngs = nnx.Rngs(0)

    def initialize_state(self, batch_size: int) -> Any:
        return jnp.zeros((batch_size, 2))

    def __call__(self, state: Any, x: jax.Array, rollout_extras: Any = None) -> Any:
        return StatefulModuleOutput(state + 1.0, x, jnp.zeros(()), {}, None)

    def reset_state(self, prev: Any) -> Any:
        if self.held == "BatchStat":
            self.episodes[...] = self.episodes[...] + 1.0
        elif self.held == "array attribute":
            self.plain = self.plain + 1.0
        else:
            return jax.random.normal(self.rngs(), prev.shape)
        return jnp.zeros_like(prev)


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize(
    ("held", "leaf", "said"),
    [
        ("BatchStat", "episodes (BatchStat)", "reset_state wrote the variable"),
        ("array attribute", "plain (an array attribute)", "in a compiled call the change is lost"),
        ("Rngs", "rngs.default.count (RngCount)", "reset_state drew from an nnx.Rngs stream"),
    ],
)
def test_a_variable_written_in_reset_state_is_named(
    compiled: bool, held: str, leaf: str, said: str
) -> None:
    network = Sequential([Dense(3, 3, nnx.Rngs(0)), _CountsEpisodes(held)])
    graphdef, variables = nnx.split(network)

    def reset(variables: nnx.State, carry: Any) -> Any:
        return nnx.merge(graphdef, variables).reset_state(carry)

    carry = network.initialize_state(2)
    with pytest.raises(ContractError) as caught:
        (jax.jit(reset) if compiled else reset)(variables, carry)
    error = caught.value
    assert error.where == "Sequential.layers[1] (_CountsEpisodes).reset_state"
    assert error.leaf == f"Sequential.layers[1].{leaf}"
    assert said in str(error)


def test_a_variable_written_in_reset_state_under_vmap_is_named() -> None:
    module = _CountsEpisodes("BatchStat")
    with pytest.raises(ContractError) as caught:
        jax.vmap(module.reset_state)(module.initialize_state(2))
    assert "reset_state wrote the variable" in str(caught.value)
    assert "inside a JAX transform" in str(caught.value)


class _CountsOutsideVariables(StatefulModule):
    """A count held outside any nnx.Variable, written in __call__: an element of an
    nnx.List or nnx.Dict, or a NumPy array changed in place; and a NumPy constant read
    only, which is no write."""

    def __init__(self, held: str) -> None:
        self.held = held
        self.counts = nnx.List([jnp.zeros(()), jnp.zeros(())])
        self.named = nnx.Dict(seen=jnp.zeros(()))
        self.host_count = np.zeros(())
        self.scale = np.full((3,), 2.0, np.float32)

    def __call__(self, state: Any, x: jax.Array, rollout_extras: Any = None) -> Any:
        if self.held == "nnx.List":
            self.counts[1] = self.counts[1] + x.shape[0]
        elif self.held == "nnx.Dict":
            self.named["seen"] = self.named["seen"] + x.shape[0]
        elif self.held == "NumPy":
            self.host_count += x.shape[0]
        return StatefulModuleOutput(state, x * self.scale, jnp.zeros(()), {}, None)


@pytest.mark.parametrize(
    ("held", "leaf", "compiled"),
    [
        ("nnx.List", "counts[1]", False),
        ("nnx.List", "counts[1]", True),
        ("nnx.Dict", "named['seen']", False),
        ("nnx.Dict", "named['seen']", True),
        ("NumPy", "host_count", False),  # compiled, NumPy refuses the traced count itself
    ],
)
def test_an_array_outside_variables_written_in_call_is_named(
    held: str, leaf: str, compiled: bool
) -> None:
    network = Sequential([Dense(3, 3, nnx.Rngs(0)), _CountsOutsideVariables(held)])

    with pytest.raises(ContractError) as caught:
        call_split(network, jnp.ones((2, 3)), compiled=compiled)
    error = caught.value
    assert error.where == "Sequential.layers[1] (_CountsOutsideVariables).__call__"
    assert error.leaf.startswith(f"Sequential.layers[1].{leaf}")
    assert "(an array attribute)" in error.leaf


@pytest.mark.parametrize("compiled", [False, True])
def test_arrays_outside_variables_read_only_pass(compiled: bool) -> None:
    network = Sequential([Dense(3, 3, nnx.Rngs(0)), _CountsOutsideVariables("none")])

    out = call_split(network, jnp.ones((2, 3)), compiled=compiled)
    assert out.shape == (2, 3)


class _Adds(StatefulModule):
    """Adds state in __call__ and reset_state: a new attribute, an array where None was,
    an element appended to an nnx.List, a new entry of a dict held with nnx.data."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.cache = nnx.data(None)
        self.items = nnx.List([])
        self.table = nnx.data({"keys": jnp.zeros(2)})

    def initialize_state(self, batch_size: int) -> Any:
        return jnp.zeros((batch_size, 2))

    def _add(self, value: jax.Array) -> None:
        if self.kind == "new attribute":
            self.last = value
        elif self.kind == "None replaced":
            self.cache = value
        elif self.kind == "nnx.List append":
            self.items.append(value)
        elif self.kind == "dict entry":
            self.table["values"] = value

    def __call__(self, state: Any, x: jax.Array, rollout_extras: Any = None) -> Any:
        self._add(x.sum(0))
        return StatefulModuleOutput(state, x, jnp.zeros(()), {}, None)

    def reset_state(self, prev: Any) -> Any:
        self._add(prev.sum(0))
        return jnp.zeros_like(prev)


@pytest.mark.parametrize("method", ["__call__", "reset_state"])
@pytest.mark.parametrize(
    ("kind", "leaf"),
    [
        ("new attribute", "_Adds.last"),
        ("None replaced", "_Adds.cache"),
        ("nnx.List append", "_Adds.items[0]"),
        ("dict entry", "_Adds.table['values']"),
    ],
)
def test_state_added_in_a_call_is_named(method: str, kind: str, leaf: str) -> None:
    module = _Adds(kind)
    carry = module.initialize_state(2)
    with pytest.raises(ContractError) as caught:
        if method == "__call__":
            module(carry, jnp.ones((2, 2)))
        else:
            module.reset_state(carry)
    assert f"{method} added {leaf} (an array attribute)" in str(caught.value)


class _Phase(enum.Enum):
    EXPLORE = 1
    EXPLOIT = 2


class _PythonValues(StatefulModule):
    """Python numbers and strings, which NNX keeps static, set in a method: the count of
    calls a researcher might keep, a float, a string, a value added; a NaN fill kept."""

    def __init__(self, kind: str, method: str) -> None:
        self.kind = kind
        self.method = method
        self.calls = 0
        self.temperature = 1.0
        self.mode = "explore"
        self.fill = float("nan")
        self.decay = np.float32(1.0)
        self.phase = _Phase.EXPLORE

    def _set(self, method: str) -> None:
        if method != self.method:
            return
        if self.kind == "int":
            self.calls += 1
        elif self.kind == "float":
            self.temperature *= 0.5
        elif self.kind == "str":
            self.mode = "exploit"
        elif self.kind == "added":
            self.seen_batch = 2
        elif self.kind == "NumPy scalar":
            self.decay = self.decay * np.float32(0.5)
        elif self.kind == "enum":
            self.phase = _Phase.EXPLOIT

    def initialize_state(self, batch_size: int) -> Any:
        self._set("initialize_state")
        return jnp.zeros((batch_size, 2))

    def __call__(self, state: Any, x: jax.Array, rollout_extras: Any = None) -> Any:
        self._set("__call__")
        return StatefulModuleOutput(state, x * self.temperature, jnp.zeros(()), {}, None)

    def reset_state(self, prev: Any) -> Any:
        self._set("reset_state")
        return jnp.zeros_like(prev)


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("method", ["__call__", "reset_state", "initialize_state"])
@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("int", "wrote _PythonValues.calls (a Python int attribute)"),
        ("float", "wrote _PythonValues.temperature (a Python float attribute)"),
        ("str", "wrote _PythonValues.mode (a Python str attribute)"),
        ("added", "added _PythonValues.seen_batch (a Python int attribute)"),
        ("NumPy scalar", "wrote _PythonValues.decay (a static attribute of type float32)"),
        ("enum", "wrote _PythonValues.phase (a static attribute of type _Phase)"),
    ],
)
def test_python_values_set_in_a_call_are_named(
    method: str, kind: str, message: str, compiled: bool
) -> None:
    module = _PythonValues(kind, method)
    graphdef, variables = nnx.split(module)

    def run(variables: nnx.State, x: jax.Array) -> Any:
        module = nnx.merge(graphdef, variables)
        carry = module.initialize_state(2)
        return module(carry, x).output, module.reset_state(carry)

    with pytest.raises(ContractError) as caught:
        (jax.jit(run) if compiled else run)(variables, jnp.ones((2, 2)))
    assert f"{method} {message}" in str(caught.value)
    assert "once per compilation" in str(caught.value)


def test_python_values_read_only_pass() -> None:
    module = _PythonValues("none", "__call__")
    carry = module.initialize_state(2)
    output = module(carry, jnp.ones((2, 2))).output
    np.testing.assert_array_equal(output, np.ones((2, 2)))
    assert module.reset_state(carry).shape == (2, 2)


class _JitBlock(nnx.Module):
    """A Flax layer whose __call__ is one nnx.jit shared by every instance."""

    def __init__(self, param_dtype: Any) -> None:
        self.linear = nnx.Linear(2, 2, param_dtype=param_dtype, rngs=nnx.Rngs(0))

    @nnx.jit
    def __call__(self, x: jax.Array) -> jax.Array:
        return self.linear(x)


class _TwoJitBlocks(StatefulModule):
    def __init__(self) -> None:
        self.first, self.second = _JitBlock(jnp.float32), _JitBlock(np.float32)

    def __call__(self, state: Any, x: jax.Array, rollout_extras: Any = None) -> Any:
        return StatefulModuleOutput(state, self.second(self.first(x)), jnp.zeros(()), {}, None)


def test_equal_static_values_a_shared_nnx_jit_hands_back_are_no_write() -> None:
    # The second block reuses the first's compilation, and Flax hands it back the first
    # block's param_dtype: jnp.float32 for np.float32, equal, of another type.
    module = _TwoJitBlocks()
    assert module((), jnp.ones((2, 2))).output.shape == (2, 2)


class _StatisticsOutsideBatchStat(StatefulModule):
    """A running mean updated by update_statistics, with one mistake by ``kind``: a
    Python flag set there, a BatchStat made there, a per-env axis kept in an array
    attribute; or none, the mean held as a plain array."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.mean = jnp.zeros(2)
        self.warmed_up = False

    def __call__(self, state: Any, x: jax.Array, rollout_extras: Any = None) -> Any:
        return StatefulModuleOutput(state, x - self.mean, jnp.zeros(()), {}, x)

    def update_statistics(self, rollout_extras: jax.Array) -> None:
        if self.kind == "per-env axis kept":
            self.mean = rollout_extras.mean(0)
        else:
            self.mean = rollout_extras.mean((0, 1))
        if self.kind == "Python flag":
            self.warmed_up = True
        elif self.kind == "BatchStat made":
            self.count = nnx.BatchStat(jnp.ones(()))
        elif self.kind == "sown":
            self.sow(nnx.Intermediate, "seen", self.mean[...])


@pytest.mark.filterwarnings("ignore:Using 'Module.sow\\(\\)' outside")  # Flax's, on "sown"
@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("Python flag", "update_statistics wrote _StatisticsOutsideBatchStat.warmed_up (a Python"),
        (
            "BatchStat made",
            "update_statistics added the variable _StatisticsOutsideBatchStat.count",
        ),
        ("per-env axis kept", "_StatisticsOutsideBatchStat.mean (an array attribute)"),
        ("sown", "update_statistics added the variable _StatisticsOutsideBatchStat.seen"),
    ],
)
def test_update_statistics_state_beyond_its_statistics_is_named(
    kind: str, message: str, compiled: bool
) -> None:
    module = _StatisticsOutsideBatchStat(kind)
    history = history_of(module, jnp.arange(6.0).reshape(3, 2), steps=4)
    graphdef, variables = nnx.split(module)

    def update(variables: nnx.State, history: jax.Array) -> None:
        nnx.merge(graphdef, variables).update_statistics(history)

    with pytest.raises(ContractError, match=re.escape(message)):
        (jax.jit(update) if compiled else update)(variables, history)


def test_a_statistic_held_as_a_plain_array_is_updated() -> None:
    module = _StatisticsOutsideBatchStat("none")
    module.update_statistics(history_of(module, jnp.arange(6.0).reshape(3, 2), steps=4))
    np.testing.assert_array_equal(module.mean, [2.0, 3.0])


class _Constants(StatefulModule):
    """Read-only state held outside variables: a NumPy table with a NaN (missing
    entries), a dict whose keys are named like dict methods, and a child holding a NumPy
    scale, called through an NNX transform."""

    def __init__(self, transform: str) -> None:
        self.transform = transform
        self.fill = np.array([np.nan, 1.0], np.float32)
        self.table = nnx.data({"keys": jnp.ones(2), "values": jnp.full(2, 2.0)})
        self.child = _ScaledByNumPy()

    def initialize_state(self, batch_size: int) -> Any:
        return jnp.zeros((batch_size, 2))

    def _apply(self, x: jax.Array) -> jax.Array:
        scaled = {
            "nnx.jit": lambda: nnx.jit(lambda child, x: child(x))(self.child, x),
            "nnx.cond": lambda: nnx.cond(
                True, lambda c, x: c(x), lambda c, x: -c(x), self.child, x
            ),
            "none": lambda: self.child(x),
        }[self.transform]()
        return scaled * self.table["keys"] + jnp.nan_to_num(self.fill) * self.table["values"]

    def __call__(self, state: Any, x: jax.Array, rollout_extras: Any = None) -> Any:
        return StatefulModuleOutput(state, self._apply(x), jnp.zeros(()), {}, None)

    def reset_state(self, prev: Any) -> Any:
        return self._apply(prev) * 0.0


class _ScaledByNumPy(nnx.Module):
    def __init__(self) -> None:
        self.scale = np.full(2, 0.5, np.float32)
        self.weight = nnx.Param(jnp.ones(2))

    def __call__(self, x: jax.Array) -> jax.Array:
        return x * self.scale * self.weight


@pytest.mark.parametrize(
    ("transform", "compiled"),
    # nnx.jit under jax.jit hands back traced values that cannot be compared: the
    # documented write, tested with nnx.remat elsewhere.
    [("none", False), ("none", True), ("nnx.jit", False), ("nnx.cond", False), ("nnx.cond", True)],
)
def test_constants_outside_variables_are_no_writes(transform: str, compiled: bool) -> None:
    module = _Constants(transform)
    graphdef, variables = nnx.split(module)

    def run(variables: nnx.State, x: jax.Array) -> Any:
        module = nnx.merge(graphdef, variables)
        carry = module.initialize_state(2)
        return module(carry, x).output, module.reset_state(carry)

    output, reset = (jax.jit(run) if compiled else run)(variables, jnp.ones((2, 2)))
    np.testing.assert_allclose(output, np.tile([0.5, 2.5], (2, 1)))
    np.testing.assert_array_equal(reset, np.zeros((2, 2)))


class _CountsUnderJit(StatefulModule):
    def __init__(self) -> None:
        self.count = jnp.zeros(())

    def initialize_state(self, batch_size: int) -> Any:
        return jnp.zeros((batch_size, 2))

    def __call__(self, state: Any, x: jax.Array, rollout_extras: Any = None) -> Any:
        return StatefulModuleOutput(state, x, jnp.zeros(()), {}, None)

    def reset_state(self, prev: Any) -> Any:
        self.count = self.count + 1
        return jnp.zeros_like(prev)


def test_an_attribute_written_under_a_transform_closing_over_the_module_is_named() -> None:
    network = Sequential([Dense(2, 2, nnx.Rngs(0)), _CountsUnderJit()])
    with pytest.raises(ContractError) as caught:
        jax.jit(network.reset_state)(network.initialize_state(2))
    error = caught.value
    assert error.leaf == "Sequential.layers[1].count (an array attribute)"
    assert "reset_state wrote Sequential.layers[1].count" in str(error)


class _ChangesItsHolders(StatefulModule):
    """Changes what it holds in __call__ other than by writing a value in place."""

    class Pair(NamedTuple):
        low: jax.Array
        high: jax.Array

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.mean = nnx.BatchStat(jnp.zeros(2))
        self.table = jnp.zeros(2)
        self.items = nnx.List([jnp.zeros(2)])
        self.pair = nnx.data(self.Pair(jnp.zeros(2), jnp.ones(2)))

    def initialize_state(self, batch_size: int) -> Any:
        return jnp.zeros((batch_size, 2))

    def __call__(self, state: Any, x: jax.Array, rollout_extras: Any = None) -> Any:
        if self.kind == "Variable replaced":
            self.mean = nnx.BatchStat(self.mean[...] + x.mean(0))
        elif self.kind == "array removed":
            del self.table
        elif self.kind == "element removed":
            self.items.pop()
        elif self.kind == "named tuple field":
            self.pair = nnx.data(self.Pair(x[0], self.pair.high))
        elif self.kind == "element written under vmap":

            def write(row: jax.Array) -> jax.Array:
                self.items[0] = row
                return row

            jax.vmap(write)(x)
        return StatefulModuleOutput(state, x, jnp.zeros(()), {}, None)


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("Variable replaced", "__call__ replaced the variable _ChangesItsHolders.mean (BatchStat)"),
        ("array removed", "__call__ removed _ChangesItsHolders.table (an array attribute)"),
        ("element removed", "__call__ removed _ChangesItsHolders.items[0] (an array attribute)"),
        ("named tuple field", "__call__ wrote _ChangesItsHolders.pair.low (an array attribute)"),
        (
            "element written under vmap",
            "__call__ wrote _ChangesItsHolders.items[0] (an array attribute) inside a JAX "
            "transform",
        ),
    ],
)
def test_holders_changed_in_a_call_are_named(kind: str, said: str) -> None:
    module = _ChangesItsHolders(kind)
    with pytest.raises(ContractError) as caught:
        module(module.initialize_state(2), jnp.ones((2, 2)))
    assert said in str(caught.value)


class _WritesItsMean(StatefulModule):
    def __init__(self) -> None:
        self.mean = nnx.BatchStat(jnp.zeros(2))

    def __call__(self, state: Any, x: jax.Array, rollout_extras: Any = None) -> Any:
        self.mean[...] = self.mean[...] + x.mean(0)
        return StatefulModuleOutput(state, x, jnp.zeros(()), {}, None)


class _RunsItsChildSplit(StatefulModule):
    """Calls its child on the child's nnx.split state inside jax.checkpoint, as the
    documented rematerialisation does: the merged copy is outside the parent's graph."""

    def __init__(self) -> None:
        self.child = _WritesItsMean()

    def __call__(self, state: Any, x: jax.Array, rollout_extras: Any = None) -> Any:
        graphdef, child_state = nnx.split(self.child)

        def run(child_state: nnx.State, x: jax.Array) -> jax.Array:
            return nnx.merge(graphdef, child_state)((), x).output

        return StatefulModuleOutput(
            state, jax.checkpoint(run)(child_state, x), jnp.zeros(()), {}, None
        )


def test_a_write_by_a_child_merged_inside_a_transform_is_named() -> None:
    module = _RunsItsChildSplit()
    with pytest.raises(ContractError) as caught:
        module((), jnp.ones((2, 2)))
    assert "__call__ wrote the variable _WritesItsMean.mean (BatchStat)" in str(caught.value)


class _ConstantsOfEveryKind(StatefulModule):
    """A child holding a float64 NumPy constant and Python-number variables, called
    through an eager NNX transform, which hands them back as float32 JAX arrays."""

    def __init__(self, transform: str) -> None:
        self.transform = transform
        self.child = _HoldsHostConstants()

    def __call__(self, state: Any, x: jax.Array, rollout_extras: Any = None) -> Any:
        if self.transform == "nnx.jit":
            y = nnx.jit(lambda child, x: child(x))(self.child, x)
        else:
            y = nnx.cond(True, lambda c, x: c(x), lambda c, x: -c(x), self.child, x)
        return StatefulModuleOutput(state, y, jnp.zeros(()), {}, None)


class _HoldsHostConstants(nnx.Module):
    def __init__(self) -> None:
        self.scale = np.array([0.5, 0.5])  # float64
        self.offset = nnx.Variable(0.5)
        self.flag = nnx.Variable(True)

    def __call__(self, x: jax.Array) -> jax.Array:
        return x * self.scale + self.offset[...] * self.flag[...]


@pytest.mark.parametrize("transform", ["nnx.jit", "nnx.cond"])
def test_host_constants_handed_back_by_an_eager_transform_are_no_writes(transform: str) -> None:
    module = _ConstantsOfEveryKind(transform)
    out = module((), jnp.ones((2, 2)))
    np.testing.assert_allclose(out.output, np.ones((2, 2)))


class _Holder:
    """A pytree whose graph key (its flattening index) names no attribute of it."""

    def __init__(self, array: jax.Array) -> None:
        self.array = array


jax.tree_util.register_pytree_node(
    _Holder, lambda holder: ((holder.array,), None), lambda _, leaves: _Holder(*leaves)
)


class _WritesOddHolders(StatefulModule):
    """Writes in __call__ what only the graph walk finds (a pytree of its own kind), a
    large Python integer, or an int64 NumPy count wrapped into int32."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.holder = nnx.data(_Holder(jnp.zeros(2)))
        self.big = nnx.Variable(2**40)
        self.count = np.array([2**32 + 7])

    def __call__(self, state: Any, x: jax.Array, rollout_extras: Any = None) -> Any:
        if self.kind == "pytree":
            self.holder.array = self.holder.array + 1.0
        elif self.kind == "large integer":
            self.big.set_value(jnp.asarray(3))
        elif self.kind == "wrapped integer":
            self.count = jnp.asarray([7])
        return StatefulModuleOutput(state, x, jnp.zeros(()), {}, None)


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("pytree", "__call__ wrote _WritesOddHolders.holder[0] (an array attribute)"),
        ("large integer", "__call__ wrote the variable _WritesOddHolders.big (Variable)"),
        ("wrapped integer", "__call__ wrote _WritesOddHolders.count (an array attribute)"),
    ],
)
def test_writes_only_the_graph_walk_or_the_exact_numbers_show_are_named(
    kind: str, said: str
) -> None:
    module = _WritesOddHolders(kind)
    with pytest.raises(ContractError) as caught:
        module((), jnp.ones((2, 2)))
    assert said in str(caught.value)


class _ReadsAHijaxParameter(StatefulModule):
    def __init__(self) -> None:
        self.weight = nnx.Param(jnp.ones(2), hijax=True)

    def initialize_state(self, batch_size: int) -> Any:
        return jnp.zeros((batch_size, 2))

    def __call__(self, state: Any, x: jax.Array, rollout_extras: Any = None) -> Any:
        return StatefulModuleOutput(state, x * self.weight[...], jnp.zeros(()), {}, None)

    def reset_state(self, prev: Any) -> Any:
        return prev * 0.0 * self.weight[...]


def test_a_hijax_parameter_read_in_a_compiled_call_is_no_write() -> None:
    # Each read of a hijax variable while traced is a new tracer: nothing to compare.
    module = _ReadsAHijaxParameter()
    carry = module.initialize_state(2)
    output = jax.jit(lambda x: module(carry, x).output)(jnp.ones((2, 2)))
    reset = jax.jit(module.reset_state)(carry)
    np.testing.assert_array_equal(output, np.ones((2, 2)))
    np.testing.assert_array_equal(reset, np.zeros((2, 2)))


def test_a_hijax_variable_is_refused_by_training_and_the_kit_with_its_path() -> None:
    # Flax's split and merge inside JAX's transforms do not carry one: the kit failed
    # with a raw TypeError blamed on initialize_state, training with a leaf count.
    module = _ReadsAHijaxParameter()
    with pytest.raises(TypeError, match=r"check_module: _ReadsAHijaxParameter.weight is a hijax"):
        check_module(module, jnp.zeros(2), max_examples=1)
    network = Sequential([Dense(4, 2, nnx.Rngs(0)), _ReadsAHijaxParameter()])
    with pytest.raises(TypeError, match=r"new_training_state: Sequential.layers\[1\].weight"):
        new_training_state(make("cartpole"), network, 2, seed=0)


class _RemembersItsBatchSize(StatefulModule):
    def __init__(self) -> None:
        self.batch_size = nnx.Variable(jnp.zeros(()))
        self.rngs = nnx.Rngs(0)

    def initialize_state(self, batch_size: int) -> Any:
        keys = jax.random.split(self.rngs(), batch_size)  # a draw: allowed here
        self.batch_size[...] = jnp.asarray(float(batch_size))
        return {"keys": keys}

    def __call__(self, state: Any, x: jax.Array, rollout_extras: Any = None) -> Any:
        return StatefulModuleOutput(state, x, jnp.zeros(()), {}, None)


def test_a_variable_written_by_initialize_state_is_named_eagerly_and_compiled() -> None:
    for call in (
        lambda network: network.initialize_state(3),
        nnx.jit(lambda network: network.initialize_state(3)),  # as training runs it
    ):
        network = Sequential([Dense(3, 3, nnx.Rngs(0)), _RemembersItsBatchSize()])
        with pytest.raises(ContractError) as caught:
            call(network)
        error = caught.value
        assert error.leaf == "Sequential.layers[1].batch_size (Variable)"
        assert "initialize_state wrote the variable" in str(error)
        assert "a write is lost" in str(error.rule)


class _MakesItsRngs(StatefulModule):
    """Makes an nnx.Rngs in initialize_state: state added there, though drawing from a
    stream made in __init__ is allowed."""

    def initialize_state(self, batch_size: int) -> Any:
        self.rngs = nnx.Rngs(batch_size)
        return {"keys": jax.random.split(self.rngs(), batch_size)}

    def __call__(self, state: Any, x: jax.Array, rollout_extras: Any = None) -> Any:
        return StatefulModuleOutput(state, x, jnp.zeros(()), {}, None)


def test_an_rngs_made_in_initialize_state_is_named() -> None:
    with pytest.raises(ContractError, match=r"initialize_state added the variable _MakesItsRngs"):
        _MakesItsRngs().initialize_state(3)


class _StatisticsAsParam(StatefulModule):
    def __init__(self) -> None:
        self.mean = nnx.Param(jnp.zeros(3))

    def __call__(self, state: Any, x: jax.Array, rollout_extras: Any = None) -> Any:
        return StatefulModuleOutput(state, x - self.mean[...], jnp.zeros(()), {}, x)

    def update_statistics(self, rollout_extras: jax.Array) -> None:
        self.mean[...] = rollout_extras.mean((0, 1))


def test_statistics_kept_as_param_are_named() -> None:
    network = Sequential([_StatisticsAsParam()])
    with pytest.raises(ContractError) as caught:
        network.update_statistics(history_of(network, jnp.ones((2, 3))))
    error = caught.value
    assert error.leaf == "Sequential.layers[0].mean (Param)"
    assert "nnx.BatchStat" in str(error.rule)


class _MeanOverTimeOnly(_StatisticsAsParam):
    """Averages the history over T alone: the statistic keeps a per-env axis."""

    def __init__(self) -> None:
        self.mean = nnx.BatchStat(jnp.zeros(3))

    def update_statistics(self, rollout_extras: jax.Array) -> None:
        self.mean.set_value(rollout_extras.mean(0))


def test_a_statistic_whose_shape_changes_is_named() -> None:
    network = Sequential([_MeanOverTimeOnly()])
    with pytest.raises(ContractError) as caught:
        network.update_statistics(history_of(network, jnp.ones((2, 3))))
    error = caught.value
    assert error.leaf == "Sequential.layers[0].mean (BatchStat)"
    assert "it changed the shape" in str(error)
    assert "expected: (3,) float32" in str(error) and "found:    shape (2, 3)" in str(error)
    assert "no per-step or per-env axis stays behind" in str(error.rule)
    # Under jit too, where the history is traced.
    network = Sequential([_MeanOverTimeOnly()])
    history = history_of(network, jnp.ones((2, 3)))
    with pytest.raises(ContractError, match="it changed the shape"):
        nnx.jit(lambda network, history: network.update_statistics(history))(network, history)


class _MemoryWithoutReset(StatefulModule):
    """A trace ported from nnx-ppo 0.3.0, which kept the carry by default."""

    def initialize_state(self, batch_size: int) -> Any:
        return {
            "h": jnp.zeros((batch_size, 3)),
            "keys": jax.random.split(jax.random.key(0), batch_size),
        }

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        h = 0.5 * state["h"] + x
        return StatefulModuleOutput({**state, "h": h}, h, jnp.zeros(()), {}, None)


class _KeysOnly(_MemoryWithoutReset):
    def initialize_state(self, batch_size: int) -> Any:
        return {"keys": jax.random.split(jax.random.key(0), batch_size)}

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        return StatefulModuleOutput(state, x, jnp.zeros(()), {}, None)


class _KeepsOnPurpose(_MemoryWithoutReset):
    def reset_state(self, prev_state: Any) -> Any:
        return prev_state


def _reset(module: StatefulModule) -> None:
    network = Sequential([module])
    nnx.jit(lambda m, s: m.reset_state(s))(network, network.initialize_state(2))


def test_a_memory_kept_by_the_default_reset_state_is_warned_about_once() -> None:
    with pytest.warns(
        UserWarning, match=r"_MemoryWithoutReset keeps its carry \(prev_state\['h'\]\)"
    ) as caught:
        _reset(_MemoryWithoutReset())
        _reset(_MemoryWithoutReset())
    assert len(caught) == 1 and caught[0].filename == __file__  # at the class statement
    assert "keys" not in str(caught[0].message)  # a key stream is no memory


@pytest.mark.parametrize("module", [_KeysOnly, _KeepsOnPurpose])
def test_key_streams_and_a_reset_state_of_its_own_are_not_warned_about(module: type) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _reset(module())


# --------------------------------------------------------------------- super() chains


class _DoublingRecorder(StatsRecorder):
    """Extends both of its parent's methods through ``super()``: still one module call."""

    def __call__(
        self, state: tuple[()], x: jax.Array, rollout_extras: jax.Array | None = None
    ) -> StatefulModuleOutput:
        out = super().__call__(state, x, rollout_extras)
        return StatefulModuleOutput(
            out.next_state, 2 * out.output, out.regularization_loss, {}, out.rollout_extras
        )

    def update_statistics(self, rollout_extras: jax.Array) -> None:
        super().update_statistics(rollout_extras)


def test_a_super_call_is_one_call_for_observers_the_kit_and_the_recorder() -> None:
    module = _DoublingRecorder(3)
    records: list[CallRecord] = []
    x = jnp.ones((4, 3))
    with observe_calls(records.append):
        out = module((), x)
        module.update_statistics(history_of(module, x))
    assert [(r.method, r.depth) for r in records] == [
        ("__call__", 0),
        ("initialize_state", 0),  # history_of's own calls
        ("__call__", 0),
        ("update_statistics", 0),
    ]
    assert float(out.output[0, 0]) == 2.0
    check_module(_DoublingRecorder(3), jnp.zeros(3), max_examples=3)
    recorded = with_recording(Sequential([_DoublingRecorder(3)]))
    recorded_out = recorded(recorded.initialize_state(4), x)
    assert ".layers[0]" in extract_activations(recorded_out.metrics)


class _Recursive(StatsRecorder):
    """Calls itself (not its parent) inside its own call: two calls, each checked."""

    def __call__(
        self, state: tuple[()], x: jax.Array, rollout_extras: jax.Array | None = None
    ) -> StatefulModuleOutput:
        if x.shape[-1] == 3:
            return StatefulModuleOutput((), self((), x[:, :2]).output, jnp.zeros(()), {}, x)
        return super().__call__(state, jnp.concatenate([x, x[:, :1]], axis=-1), rollout_extras)


def test_a_module_calling_itself_is_observed_twice() -> None:
    records: list[CallRecord] = []
    with observe_calls(records.append):
        _Recursive(3)((), jnp.ones((4, 3)))
    assert [(r.method, r.depth) for r in records] == [("__call__", 1), ("__call__", 0)]


# ------------------------------------------------------------------- from a user's audit


class SowsItsHidden(StatefulModule):
    """Keeps its hidden activation with Flax's sow, which no forward pass reads."""

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        h = jnp.tanh(x)
        self.sow(nnx.Intermediate, "h", h)
        return StatefulModuleOutput(state, h, jnp.zeros(()), {})


@pytest.mark.filterwarnings("ignore:Using 'Module.sow\\(\\)' outside of 'nnx.capture\\(\\)'")
def test_intermediates_kept_by_sow_or_capture_are_no_forward_write() -> None:
    module, x = SowsItsHidden(), jnp.ones((2, 3))
    module((), x)
    module((), x)  # the second sow writes the variable the first created
    nnx.capture(lambda m, x: m((), x).output, nnx.Intermediate)(SowsItsHidden(), x)


def test_a_container_runs_under_nnx_capture() -> None:
    # Under capture an nnx.List holds a string key beside its indices: the emission
    # record's structure key sorted them and failed for every Sequential.
    network = Sequential([Dense(3, 3, nnx.Rngs(0)), SowsItsHidden()])
    captured = nnx.capture(lambda m, s, x: m(s, x).output, nnx.Intermediate)
    output, _ = captured(network, network.initialize_state(2), jnp.ones((2, 3)))
    assert output.shape == (2, 3)


def test_a_numpy_batch_size_is_an_int_to_shipped_annotations() -> None:
    from nnx_ppo.networks.recurrent import GRU

    for module in (GRU(3, 5, nnx.Rngs(0)), Sequential([Dense(3, 3, nnx.Rngs(0))])):
        leaves = jax.tree.leaves(module.initialize_state(np.int64(4)))
        assert all(leaf.shape[0] == 4 for leaf in leaves)


def test_built_in_layers_take_a_numpy_batch_as_they_take_a_jax_one() -> None:
    # The contract's aliases take NumPy leaves; the layers' own annotations refused them,
    # so an eager call of a factory network on a NumPy env's observations failed.
    from nnx_ppo.networks.containers import Splitter
    from nnx_ppo.networks.factories import make_mlp_actor_critic
    from nnx_ppo.networks.recurrent import LSTM
    from nnx_ppo.networks.sampling_layers import NormalSampler
    from nnx_ppo.networks.variational import VariationalBottleneck

    x = np.linspace(-1.0, 1.0, 24, dtype=np.float32).reshape(4, 6)
    modules: list[StatefulModule] = [
        Dense(6, 2, nnx.Rngs(0)),
        GRU(6, 3, nnx.Rngs(0)),
        LSTM(6, 3, nnx.Rngs(0)),
        Splitter(a=2, b=4),
        NormalSampler(nnx.Rngs(0), 0.01),
        VariationalBottleneck(3, nnx.Rngs(0)),
        make_mlp_actor_critic(6, 2, [8], [8], nnx.Rngs(0), normalize_obs=False),
    ]
    for module in modules:
        state = module.initialize_state(4)
        given_numpy = module(state, x).output
        given_jax = module(state, jnp.asarray(x)).output
        assert jax.tree.all(jax.tree.map(np.array_equal, given_numpy, given_jax))
    gru = modules[1]
    assert isinstance(gru, GRU)
    assert gru.reset_state(np.zeros((4, 3), np.float32)).shape == (4, 3)


def test_a_jitted_method_with_annotations_is_left_unchecked_with_a_warning() -> None:
    with pytest.warns(UserWarning, match=r"annotations of .*Jitted.__call__ are not checked"):

        class Jitted(StatefulModule):
            @nnx.jit
            def __call__(
                self, state: Any, x: Float[Array, "B 3"], rollout_extras: Any = None
            ) -> StatefulModuleOutput:
                return StatefulModuleOutput(state, x, jnp.zeros(()), {})

    assert Jitted()((), jnp.ones((2, 3))).output.shape == (2, 3)


class _Scorer(typing.Protocol):  # not @runtime_checkable: beartype cannot check it
    def score(self) -> float: ...


def test_an_uncheckable_hint_leaves_the_method_s_other_annotations_checked() -> None:
    with pytest.warns(UserWarning, match=r"annotation of rollout_extras in .*Scoring.__call__"):

        class Scoring(StatefulModule):
            def __call__(
                self, state: Any, x: Float[Array, "B 3"], rollout_extras: _Scorer | None = None
            ) -> StatefulModuleOutput:
                return StatefulModuleOutput(state, x, jnp.zeros(()), {})

    assert Scoring()((), jnp.ones((2, 3))).output.shape == (2, 3)
    with pytest.raises(ContractError, match="argument x does not match its jaxtyping"):
        Scoring()((), jnp.ones((2, 4)))


class Annotated(StatefulModule):
    def __call__(
        self, state: Any, x: Float[Array, "B 3"], rollout_extras: Any = None
    ) -> StatefulModuleOutput:
        return StatefulModuleOutput(state, x, jnp.zeros(()), {})


def test_an_annotation_violation_is_raised_without_beartypes_chained_reports() -> None:
    with pytest.raises(ContractError, match=r"argument x does not match") as caught:
        Annotated()((), jnp.ones((2, 4)))
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


class AnnotatedContainers(StatefulModule):
    def __call__(
        self,
        state: dict[str, Float[Array, "B 3"]],
        x: tuple[Float[Array, "B 3"], ...],
        rollout_extras: list[Float[Array, "B 3"]] | None = None,
    ) -> StatefulModuleOutput:
        return StatefulModuleOutput(state, x, jnp.zeros(()), {}, rollout_extras)


@pytest.mark.parametrize("wrong", ["state['c']", "x[1]", "rollout_extras[2]"])
def test_every_item_of_an_annotated_container_is_checked(wrong: str) -> None:
    # beartype alone checks one item per call: a dict's first (right here, so the wrong
    # item always passed), a list's or a tuple's at random.
    state = {name: jnp.ones((2, 3)) for name in "abc"}
    x = [jnp.ones((2, 3)), jnp.ones((2, 3))]
    extras = [jnp.ones((2, 3)) for _ in range(3)]
    AnnotatedContainers()(state, tuple(x), extras)  # all right
    arguments = {"state": state, "x": x, "rollout_extras": extras}
    name, key = wrong.split("[")
    arguments[name][eval(key[:-1])] = jnp.ones((2, 4))
    arguments["x"] = tuple(x)

    with pytest.raises(ContractError) as caught:
        AnnotatedContainers()(*arguments.values())

    assert caught.value.leaf == wrong
    assert caught.value.found == "f32[2,4]"


@typechecked
def _mean_of_each(histories: tuple[Float[Array, "T B"], ...]) -> list[Float[Array, "B"]]:
    return [history.mean(axis=0) for history in histories] + [histories[0]]


def test_every_item_of_an_engine_functions_tuple_and_returned_list_is_checked() -> None:
    with pytest.raises(ContractError, match=r"argument histories\[1\] does not match"):
        _mean_of_each((jnp.ones((4, 2)), jnp.ones((4, 3))))
    with pytest.raises(ContractError, match=r"the return value at \[1\] does not match"):
        _mean_of_each((jnp.ones((4, 2)),))


@jaxtyped(typechecker=beartype)
def _users_helper(x: Float[Array, "B 3"]) -> Float[Array, "B 3"]:
    return x


class CallsAnAnnotatedHelper(StatefulModule):
    def __call__(
        self, state: Any, x: Float[Array, "B 4"], rollout_extras: Any = None
    ) -> StatefulModuleOutput:
        return StatefulModuleOutput(state, _users_helper(x), jnp.zeros(()), {})


def test_a_helpers_own_annotation_error_is_not_blamed_on_the_methods_annotations() -> None:
    with pytest.raises(TypeCheckError) as caught:
        CallsAnAnnotatedHelper()((), jnp.ones((2, 4)))

    assert not isinstance(caught.value, ContractError)
    assert "_users_helper" in str(caught.value)


def test_jaxtyping_disable_turns_the_annotation_checks_off_and_crashes_nothing() -> None:
    import jaxtyping

    dense = Dense(5, 4, nnx.Rngs(0))
    jaxtyping.config.update("jaxtyping_disable", True)
    try:
        # Its annotation reads {self.in_features}, which needs jaxtyping's memo: no
        # AnnotationError, and JAX's own error, as if unannotated.
        with pytest.raises(TypeError, match="dot_general") as caught:
            dense((), jnp.zeros((2, 4)))
    finally:
        jaxtyping.config.update("jaxtyping_disable", False)
    assert not isinstance(caught.value, ContractError)
    with pytest.raises(ContractError, match=r"argument x does not match"):
        dense((), jnp.zeros((2, 4)))


@typechecked
def _either(
    x: PyTree[Float[Array, "B 3"]] | PyTree[Float[Array, "..."]], y: Float[Array, " B"]
) -> None:
    del x, y


def test_a_union_member_that_refuses_the_value_binds_no_dimension() -> None:
    # The first member binds B=8 on x['a'] and then refuses x['b']; the second accepts
    # x, so y's B is free.
    _either({"a": jnp.zeros((8, 3)), "b": jnp.zeros((8, 2))}, jnp.zeros((4,)))


@typechecked
def _dict_or_list(
    x: dict[str, Float[Array, "B n"]] | list[Float[Array, "B n"]] | dict[str, Float[Array, "B _"]],
    y: Float[Array, "B n"],
) -> None:
    del x, y


@typechecked
def _rows_or_columns(x: list[Float[Array, "B n"]] | list[Float[Array, "n ..."]]) -> None:
    del x


def test_a_container_member_refused_partway_leaves_no_dimension_bound() -> None:
    # The first member binds n=3 on x['a'] and then refuses x['b'] (n=5); the last
    # accepts x and binds no n, so y's n is free.
    _dict_or_list({"a": jnp.zeros((4, 3)), "b": jnp.zeros((4, 5))}, jnp.zeros((4, 5)))
    # The first member binds B=4, n=3 on x[0] and refuses x[1]; the second is checked
    # against no n of the first's: n=4 on both items.
    _rows_or_columns([jnp.zeros((4, 3)), jnp.zeros((4, 5))])
    # What the accepted member binds stays bound: here the first's n=3.
    with pytest.raises(ContractError) as caught:
        _dict_or_list({"a": jnp.zeros((4, 3))}, jnp.zeros((4, 5)))
    assert caught.value.leaf == "y"
    assert "with B=4, n=3" in str(caught.value)


@typechecked
def _ordered(x: OrderedDict[str, Float[Array, "B 3"]]) -> None:
    del x


def test_every_item_of_any_mapping_type_is_checked() -> None:
    right = jnp.zeros((8, 3))
    with pytest.raises(ContractError) as caught:
        _ordered(OrderedDict(a=right, b=jnp.zeros((8, 2)), c=right))
    assert caught.value.leaf == "x['b']"


class CentredDense(StatefulModule):
    """Keeps a running sum of its inputs of its own, beside a Dense child."""

    def __init__(self) -> None:
        self.dense = Dense(3, 3, nnx.Rngs(0))
        self.total = nnx.BatchStat(jnp.zeros(3))

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        out = self.dense((), x - self.total[...])
        return StatefulModuleOutput((), out.output, jnp.zeros(()), {}, x)

    def update_statistics(self, history: Any) -> None:
        self.total[...] = self.total[...] + history.sum((0, 1))


class ForgetsStatistics(StatefulModule):
    """Routes every contract method to its child but update_statistics (the no-op)."""

    def __init__(self, inner: StatefulModule) -> None:
        self.inner = inner

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        return self.inner(state, x, rollout_extras)

    def initialize_state(self, batch_size: int) -> Any:
        return self.inner.initialize_state(batch_size)

    def reset_state(self, prev_state: Any) -> Any:
        return self.inner.reset_state(prev_state)


class CentredDenseOfAnArray(CentredDense):
    """Keeps its running sum as a plain array attribute, which NNX keeps as state too."""

    def __init__(self) -> None:
        self.dense = Dense(3, 3, nnx.Rngs(0))
        self.total = jnp.zeros(3)

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        out = self.dense((), x - self.total)
        return StatefulModuleOutput((), out.output, jnp.zeros(()), {}, x)

    def update_statistics(self, history: Any) -> None:
        self.total = self.total + history.sum((0, 1))


@pytest.mark.parametrize("inner", [CentredDense, CentredDenseOfAnArray])
def test_a_module_keeping_statistics_beside_its_children_must_be_reached(inner: type) -> None:
    # Its children made it count as a container, whose statistics are its children's: an
    # update_statistics that never reached it passed, and its sum stayed zero.
    network = Sequential([ForgetsStatistics(inner())])
    extras = network(network.initialize_state(2), jnp.ones((2, 3))).rollout_extras

    match = rf"never reached .*\({inner.__name__}\), which keeps"
    with pytest.raises(ContractError, match=match):
        network.update_statistics(jax.tree.map(lambda leaf: leaf[None], extras))


class ReadsFrozenMean(StatefulModule):
    """Reads a frozen normaliser's mean; calls no child, so routes no reset_state."""

    def __init__(self) -> None:
        self.frozen = FrozenStatistics(Normalizer(3))

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        return StatefulModuleOutput((), x + self.frozen.module.mean[...], jnp.zeros(()), {})


def test_reset_state_need_not_reach_a_child_without_a_carry() -> None:
    # It was refused: "its carry would go on from the ended episode", of a carry of ().
    network = Sequential([Dense(3, 3, nnx.Rngs(0)), ReadsFrozenMean()])
    network.reset_state(network.initialize_state(2))


class CountsInPlace(StatefulModule):
    """Writes its step counter into the carry it was given and returns that dict."""

    def initialize_state(self, batch_size: int) -> dict[str, Any]:
        return {"t": jnp.zeros((batch_size,), jnp.int32)}

    def reset_state(self, prev_state: dict[str, Any]) -> dict[str, Any]:
        prev_state["t"] = jnp.zeros_like(prev_state["t"])
        return prev_state

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        state["t"] = state["t"] + 1
        return StatefulModuleOutput(state, x, jnp.zeros(()), {})


@pytest.mark.parametrize("method", ["__call__", "reset_state"])
def test_a_carry_changed_in_place_is_named(method: str) -> None:
    # Training passes one carry to the rollout step and to the next observation's value:
    # a write into it reached the second call as a leaked tracer, JAX's error naming nothing.
    module = CountsInPlace()
    state = module.initialize_state(2)
    call = {
        "__call__": lambda: module(state, jnp.ones((2, 3))),
        "reset_state": lambda: module.reset_state(state),
    }[method]
    with pytest.raises(
        ContractError, match=rf"{method} changed its argument \w+ in place"
    ) as caught:
        jax.jit(call)()
    assert caught.value.leaf is not None and caught.value.leaf.endswith("['t']")
    assert "replaced during the call" in str(caught.value)


def test_check_module_names_a_flax_module_instead_of_calling_it_as_a_factory() -> None:
    # An nnx.Module is callable: called as a factory it failed on its own missing arguments.
    with pytest.raises(TypeError, match=r"got Linear; subclass nnx_ppo\.networks\.StatefulModule"):
        check_module(nnx.Linear(3, 2, rngs=nnx.Rngs(0)), jnp.zeros(3))


def test_numpy_integer_counts_are_ints_to_typechecked_functions() -> None:
    # record_activations_rollout(env, net, np.int64(2), ...) was refused by `n_envs: int`.
    @typechecked
    def counted(n_envs: int, *, length: int) -> int:
        return n_envs * length

    assert counted(np.int64(3), length=np.int32(2)) == 6  # type: ignore[arg-type]
    with pytest.raises(ContractError, match="argument n_envs does not match"):
        counted(3.0, length=2)  # type: ignore[arg-type]
