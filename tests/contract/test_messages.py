"""What nnx_ppo.ContractError says, one test per kind of violation, and the checks switch.

Each faulty module below breaks exactly one rule of the contract; the tests assert
that the message names the module (with its path inside a container), the leaf,
the expected axes with their bound sizes, and the shape found.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jaxtyping import Array, Float, PyTree

import nnx_ppo
from nnx_ppo import ContractError
from nnx_ppo.contract.axes import AnyArray, Batched, Extras, Mask
from nnx_ppo.contract.checking import typechecked
from nnx_ppo.networks.containers import (
    Concat,
    FrozenStatistics,
    Parallel,
    Sequential,
    Splitter,
)
from nnx_ppo.networks.normalizer import Normalizer
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput
from nnx_ppo.testing.modules import Linear, RunningSum, StatsRecorder

B = 8


def _zeros(*shape: int) -> Array:
    return jnp.zeros(shape, jnp.float32)


class Cell(StatefulModule):
    """A correct module with carry ``{"h": (B, 3)}``: the faults below each change one thing."""

    def initialize_state(self, batch_size: int) -> dict[str, Array]:
        return {"h": _zeros(batch_size, 3)}

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        h = state["h"] + x
        return StatefulModuleOutput({"h": h}, h, jnp.zeros(()), {}, None)


class DropsBatchAxis(Cell):
    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        h = jnp.sum(state["h"] + x, axis=0)
        return StatefulModuleOutput({"h": h}, x, jnp.zeros(()), {}, None)


class ChangesDtype(Cell):
    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        h = (state["h"] + x).astype(jnp.float16)
        return StatefulModuleOutput({"h": h}, x, jnp.zeros(()), {}, None)


class GrowsCarry(Cell):
    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        h = state["h"] + x
        return StatefulModuleOutput({"h": h, "c": h}, x, jnp.zeros(()), {}, None)


class HalvesOutputBatch(Cell):
    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        return StatefulModuleOutput(state, x[: x.shape[0] // 2], jnp.zeros(()), {}, None)


class IgnoresBatchSize(Cell):
    def initialize_state(self, batch_size: int) -> dict[str, Array]:
        return {"h": _zeros(16, 3)}


class ResetDropsAxis(Cell):
    def reset_state(self, prev_state: Any) -> Any:
        return {"h": _zeros(3)}


class ResetWidens(Cell):
    def reset_state(self, prev_state: Any) -> Any:
        return {"h": jnp.zeros((prev_state["h"].shape[0], 4), jnp.float32)}


class PerFeatureRegularization(Cell):
    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        return StatefulModuleOutput(state, x, jnp.square(x), {}, None)


class FeatureSumRegularization(Cell):
    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        return StatefulModuleOutput(state, x, jnp.square(x).sum(axis=0), {}, None)


class TransposedMetric(Cell):
    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        return StatefulModuleOutput(state, x, jnp.zeros(()), {"layer": {"act": x.T}}, None)


class PerFeatureMetric(Cell):
    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        return StatefulModuleOutput(state, x, jnp.zeros(()), {"mean": jnp.mean(x, axis=0)}, None)


class ResetHalvesPrecision(Cell):
    def reset_state(self, prev_state: Any) -> Any:
        return {"h": jnp.zeros_like(prev_state["h"], jnp.float16)}


class ReplayAddsExtras(Cell):
    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        extras = {"raw": x} if rollout_extras is None else {"raw": x, "again": x}
        return StatefulModuleOutput(state, x, jnp.zeros(()), {}, extras)


class Annotated(Cell):
    def __call__(
        self, state: Any, x: Float[Array, "B 3"], rollout_extras: Any = None
    ) -> StatefulModuleOutput:
        return StatefulModuleOutput(state, x, jnp.zeros(()), {}, None)


class AnnotatedDict(Cell):
    def __call__(
        self, state: Any, x: dict[str, Float[Array, "B 3"]], rollout_extras: Any = None
    ) -> StatefulModuleOutput:
        return StatefulModuleOutput(state, x, jnp.zeros(()), {}, None)


class AnnotatedWithAliases(Cell):
    """A cell annotated with the contract's one-array aliases: its carry and input differ
    in features, which the aliases leave to each argument."""

    def __call__(
        self, state: dict[str, Batched], x: Batched, rollout_extras: Any = None
    ) -> StatefulModuleOutput:
        return StatefulModuleOutput(state, {"out": x}, jnp.zeros(()), {}, None)


class AnnotatedReturn(Cell):
    """Annotates its output as one array but returns a dict."""

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        return StatefulModuleOutput(
            state, _as_one_array({"a": x, "b": [x] * 12}), jnp.zeros(()), {}, None
        )


@typechecked
def _as_one_array(tree: Any) -> Float[Array, "B 3"]:
    return tree


class MyLSTM(DropsBatchAxis):
    """A carry-dropping module to be found by its path inside a container."""


class Forgetful(StatefulModule):
    """A container whose update_statistics routes to its first child only."""

    def __init__(self) -> None:
        self.first = StatsRecorder(3)
        self.second = StatsRecorder(3)

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        first = self.first((), x)
        second = self.second((), first.output)
        extras = {"first": first.rollout_extras, "second": second.rollout_extras}
        return StatefulModuleOutput((), second.output, jnp.zeros(()), {}, extras)

    def update_statistics(self, rollout_extras: Any) -> None:
        self.first.update_statistics(rollout_extras["first"])


class NoRouting(StatefulModule):
    """A container that never defines update_statistics, inheriting the no-op default."""

    def __init__(self) -> None:
        self.norm = StatsRecorder(3)

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        out = self.norm((), x)
        return StatefulModuleOutput((), out.output, jnp.zeros(()), {}, {"norm": out.rollout_extras})


def _message(call: Callable[[], Any]) -> str:
    with pytest.raises(ContractError) as info:
        call()
    return str(info.value)


def _assert_trees_equal(actual: Any, expected: Any) -> None:
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(e))


def _batch() -> tuple[dict[str, Array], Array]:
    return {"h": _zeros(B, 3)}, _zeros(B, 3)


# ------------------------------------------------------------------ one test per message


def test_batch_mismatch_between_inputs_names_the_leaf_the_bound_b_and_the_shape() -> None:
    message = _message(lambda: Cell()({"h": _zeros(4, 3)}, _zeros(B, 3)))

    assert message.startswith("Cell.__call__: argument state['h'] has B=4 on axis 0")
    assert "leaf:     state['h']" in message
    assert "expected: (B, *feat) with B=8 (bound by x)" in message
    assert "found:    shape (4, 3) float32" in message


def test_the_error_keeps_the_parts_of_its_message_as_attributes() -> None:
    with pytest.raises(ContractError) as info:
        Cell()({"h": _zeros(4, 3)}, _zeros(B, 3))

    error = info.value
    assert error.where == "Cell.__call__"
    assert error.leaf == "state['h']"
    assert error.expected == "(B, *feat) with B=8 (bound by x)"
    assert error.found == "shape (4, 3) float32"
    assert error.rule is not None and "one batch size B" in error.rule


def test_next_state_dropping_the_batch_axis() -> None:
    message = _message(lambda: DropsBatchAxis()(*_batch()))

    assert "DropsBatchAxis.__call__: next_state['h'] does not match state['h']" in message
    assert "dropped the leading (batch) axis" in message
    assert "expected: (B=8, 3) float32 (as state['h'])" in message
    assert "found:    shape (3,) float32" in message


def test_next_state_changing_dtype() -> None:
    message = _message(lambda: ChangesDtype()(*_batch()))

    assert "next_state['h'] does not match state['h']" in message
    assert "changed the dtype from float32 to float16" in message
    assert "found:    shape (8, 3) float16" in message


def test_next_state_with_a_different_tree_structure() -> None:
    message = _message(lambda: GrowsCarry()(*_batch()))

    assert "GrowsCarry.__call__: next_state does not have the tree structure of state" in message
    assert "leaf:     next_state['c']" in message
    assert "found:    unexpected next_state['c']" in message
    assert "scan carry" in message


def test_output_with_a_different_batch_size_from_the_input() -> None:
    message = _message(lambda: HalvesOutputBatch()(*_batch()))

    assert "HalvesOutputBatch.__call__: returned output has B=4 on axis 0" in message
    assert "If not, its B axis was cut to 4 of 8 (a slice): pass it whole." in message
    assert "expected: (B, *feat) with B=8 (bound by x)" in message
    assert "found:    shape (4, 3) float32" in message


def test_a_history_given_where_one_step_is_taken_is_named_as_one() -> None:
    history = "extra leading axis (a (T, B, *feat) history given where one step (B, *feat)"
    # x a whole rollout's observations: B was bound to T by x, and state was blamed.
    message = _message(lambda: Cell()({"h": _zeros(B, 3)}, _zeros(5, B, 3)))
    assert f"x has shape (5, {B}, 3), {B} on its axis 1: does x have an {history}" in message
    # Stored extras given stacked instead of this step's slice.
    message = _message(lambda: Normalizer(3)((), _zeros(B, 3), _zeros(2, B, 3)))
    assert f"Its axis 1 has the size of B: does it have an {history}" in message
    # One step of 4 envs with B features, beside a carry of B envs: no history in sight.
    message = _message(lambda: Cell()({"h": _zeros(B, 3)}, _zeros(4, B)))
    assert "history" not in message


def test_initialize_state_ignoring_batch_size() -> None:
    message = _message(lambda: IgnoresBatchSize().initialize_state(B))

    assert "IgnoresBatchSize.initialize_state: returned state['h'] has B=16" in message
    assert "If 16 is a feature size, it has no B axis" in message
    assert "expected: (B, *feat) with B=8 (bound by batch_size)" in message
    assert "found:    shape (16, 3) float32" in message


def test_initialize_state_rejects_a_batch_size_that_is_not_a_positive_int() -> None:
    message = _message(lambda: Cell().initialize_state(0))

    assert "Cell.initialize_state: batch_size must be a positive int" in message
    assert "found:    0" in message


def test_reset_state_changing_the_shape() -> None:
    message = _message(lambda: ResetWidens().reset_state({"h": _zeros(B, 3)}))

    assert "ResetWidens.reset_state: returned state['h'] does not match prev_state['h']" in message
    assert "it changed the shape" in message
    assert "expected: (8, 3) float32 (as prev_state['h'])" in message
    assert "found:    shape (8, 4) float32" in message


def test_reset_state_dropping_the_leading_axis() -> None:
    message = _message(lambda: ResetDropsAxis().reset_state({"h": _zeros(B, 3)}))

    assert "returned state['h'] does not match prev_state['h']" in message
    assert "dropped the leading (batch) axis" in message
    assert "found:    shape (3,) float32" in message


@pytest.mark.parametrize(
    ("b_shape", "axis_fact"),
    [((2, B, 3), "has T=2 on axis 0, but T=4"), ((4, 5, 3), "has B=5 on axis 1, but B=8")],
    ids=["different-T", "different-B"],
)
def test_update_statistics_receiving_leaves_of_different_t_or_b(
    b_shape: tuple[int, ...], axis_fact: str
) -> None:
    module = Parallel(a=StatsRecorder(3), b=StatsRecorder(3))
    history = {"a": _zeros(4, B, 3), "b": _zeros(*b_shape)}

    message = _message(lambda: module.update_statistics(history))

    assert f"Parallel.update_statistics: argument rollout_extras['b'] {axis_fact}" in message
    assert "(bound by rollout_extras['a'])" in message
    assert "expected: (T, B, *feat) with T=4" in message
    assert f"found:    shape {b_shape} float32" in message


def test_update_statistics_given_one_step_instead_of_the_stacked_history() -> None:
    recorder = StatsRecorder(3)
    emitted = recorder((), _zeros(B, 3)).rollout_extras

    message = _message(lambda: recorder.update_statistics(emitted))

    assert "StatsRecorder.update_statistics: was given a history whose leaf" in message
    assert "expected: (T, B, 3) float32: 3 axes, the T steps of the B envs" in message
    assert "found:    shape (8, 3) float32: 2 axes, one step (B, *emitted)" in message
    assert "T=8" not in message  # T and B cannot be read off the malformed leaf


def test_update_statistics_given_its_history_in_another_dtype() -> None:
    # A container that packs its children's histories into float16 corrupts statistics.
    recorder = StatsRecorder(3)
    emitted = recorder((), _zeros(B, 3)).rollout_extras
    history = jax.tree.map(lambda e: jnp.stack([e] * 4).astype(jnp.float16), emitted)

    message = _message(lambda: recorder.update_statistics(history))

    assert "was given a history whose leaf" in message
    assert "expected: (T, B, 3) float32 with T=4, B=8" in message
    assert "float16" in message


def test_regularization_loss_of_the_wrong_shape() -> None:
    message = _message(lambda: PerFeatureRegularization()(*_batch()))

    assert "regularization_loss is neither a scalar nor one value per sample" in message
    assert "expected: () or (B,) with B=8" in message
    assert "found:    shape (8, 3) float32" in message


def test_regularization_loss_of_one_axis_that_is_not_the_batch() -> None:
    # One value per feature, (3,): one axis, as a per-sample loss has, but not of size B.
    message = _message(lambda: FeatureSumRegularization()(*_batch()))

    assert "regularization_loss is neither a scalar nor one value per sample" in message
    assert "expected: () or (B,) with B=8" in message
    assert "found:    shape (3,) float32" in message


def test_metric_leaf_with_the_wrong_leading_axis() -> None:
    message = _message(lambda: TransposedMetric()(*_batch()))

    assert "metric metrics['layer']['act'] is neither a scalar nor batched" in message
    assert "expected: () or (B, *feat) with B=8" in message
    assert "found:    shape (3, 8) float32" in message


def test_metric_leaf_of_one_axis_that_is_not_the_batch() -> None:
    # One value per feature, (3,): one axis, as a per-sample metric has, but not of size B.
    message = _message(lambda: PerFeatureMetric()(*_batch()))

    assert "metric metrics['mean'] is neither a scalar nor batched" in message
    assert "found:    shape (3,) float32" in message


def test_reset_state_changing_the_dtype() -> None:
    message = _message(lambda: ResetHalvesPrecision().reset_state({"h": _zeros(B, 3)}))

    assert "returned state['h'] does not match prev_state['h']" in message
    assert "changed the dtype from float32 to float16" in message


def test_replay_emitting_extras_of_a_different_structure_than_stored() -> None:
    state, x = _batch()

    message = _message(lambda: ReplayAddsExtras()(state, x, {"raw": x}))

    assert "returned rollout_extras does not have the tree structure of rollout_extras" in message
    assert "found:    unexpected returned rollout_extras['again']" in message
    assert "loss replay" in message


def test_a_users_jaxtyping_annotation_is_checked() -> None:
    state, _ = _batch()

    message = _message(lambda: Annotated()(state, _zeros(B, 4)))

    assert "Annotated.__call__: argument x does not match its jaxtyping annotation" in message
    assert "expected: Float[Array, 'B 3']\n" in message  # no other annotation binds B
    assert "found:    f32[8,4]" in message


def test_an_annotation_violation_names_the_leaf_and_the_sizes_bound_before_it() -> None:
    state, _ = _batch()
    x = {"pos": _zeros(B, 3), "vel": _zeros(B, 3), "goal": _zeros(B, 2)}

    message = _message(lambda: AnnotatedDict()(state, x))

    assert "AnnotatedDict.__call__: argument x['goal'] does not match" in message
    assert "leaf:     x['goal']" in message
    assert "expected: Float[Array, 'B 3'] with B=8" in message
    assert "found:    f32[8,2]" in message


def test_an_annotated_dicts_keys_are_checked_too() -> None:
    state, _ = _batch()

    message = _message(lambda: AnnotatedDict()(state, {0: _zeros(B, 3)}))

    assert "AnnotatedDict.__call__: argument x" in message
    assert "key 0" in message


def test_a_width_read_off_the_module_is_shown_with_its_value() -> None:
    from nnx_ppo.networks.feedforward import Dense

    message = _message(lambda: Dense(5, 4, nnx.Rngs(0))((), _zeros(B, 4)))

    assert "expected: Float[Array, 'B in_features=5']" in message


class RowPerEnvPlusOne(Cell):
    def initialize_state(self, batch_size: int) -> Float[Array, "{batch_size} 3"]:
        return _zeros(batch_size + 1, 3)


def test_a_dimension_read_off_an_argument_is_shown_with_its_value() -> None:
    # It was shown unevaluated: Float[Array, '{batch_size} 3'].
    message = _message(lambda: RowPerEnvPlusOne().initialize_state(4))

    assert "expected: Float[Array, 'batch_size=4 3']" in message
    assert "found:    f32[5,3]" in message


def test_the_contracts_one_array_aliases_leave_each_argument_its_own_features() -> None:
    state, _ = _batch()

    out = AnnotatedWithAliases()(state, _zeros(B, 5))

    assert out.output["out"].shape == (B, 5)


class AnnotatedStructure(Cell):
    def __call__(
        self,
        state: PyTree[Float[Array, "B 3"], "S"],
        x: PyTree[Float[Array, "B 3"], "S"],
        rollout_extras: Any = None,
    ) -> StatefulModuleOutput:
        return StatefulModuleOutput(state, x, jnp.zeros(()), {}, None)


def test_a_leaf_of_a_pytree_with_a_named_structure_is_named() -> None:
    state = {key: _zeros(B, 3) for key in "abcd"}

    # It was x, the whole tree.
    message = _message(lambda: AnnotatedStructure()(state, dict(state, c=_zeros(B, 2))))

    assert "AnnotatedStructure.__call__: argument x['c'] does not match" in message
    assert "expected: Float[Array, 'B 3'] with B=8, S=PyTreeDef(" in message
    assert "found:    f32[8,2]" in message


def test_a_pytree_of_another_structure_than_its_name_bound_is_named_whole() -> None:
    state = {key: _zeros(B, 3) for key in "abcd"}

    message = _message(lambda: AnnotatedStructure()(state, {"a": _zeros(B, 3)}))

    assert "AnnotatedStructure.__call__: argument x does not match" in message
    assert "expected: PyTree[Float[Array, 'B 3'], 'S'] with B=8, S=PyTreeDef(" in message


class AnnotatedAnyArrayStructure(Cell):
    def __call__(
        self,
        state: PyTree[Float[AnyArray, "B 3"], "S"],
        x: PyTree[Float[AnyArray, "B 3"], "S"],
        rollout_extras: Any = None,
    ) -> StatefulModuleOutput:
        return StatefulModuleOutput(state, x, jnp.zeros(()), {}, None)


def test_a_pytree_of_jax_or_numpy_leaves_is_shown_as_of_jax_leaves() -> None:
    state = {key: _zeros(B, 3) for key in "abcd"}

    message = _message(lambda: AnnotatedAnyArrayStructure()(state, {"a": _zeros(B, 3)}))

    # It showed PyTree[Float[Array, 'B 3'] | Float[ndarray, 'B 3'], 'S'].
    assert "expected: PyTree[Float[Array, 'B 3'], 'S'] with B=8, S=PyTreeDef(" in message


def test_a_pytree_that_violates_an_annotation_is_shown_whole_on_one_line() -> None:
    state, x = _batch()

    message = _message(lambda: AnnotatedReturn()(state, x))

    # jaxtyping prints a long value over several lines; the message keeps all of it.
    found = next(line for line in message.splitlines() if line.startswith("  found:"))
    assert "'a': f32[8,3]" in found and found.count("f32[8,3]") == 13


def test_annotations_that_cannot_be_resolved_are_reported_once_at_the_first_call() -> None:
    # Resolved at the first call, not at class creation: a name the module defines below
    # the class (postponed annotations) exists by then and is checked.
    class Local:
        """Resolvable only inside this function, so the annotations naming it are not."""

    with warnings.catch_warnings():
        warnings.simplefilter("error")

        class Unresolvable(Cell):
            def __call__(
                self, state: Any, x: Local, rollout_extras: Any = None
            ) -> StatefulModuleOutput:
                return super().__call__(state, x, rollout_extras)

            def reset_state(self, prev_state: Local) -> Any:
                return prev_state

    state, x = _batch()
    module = Unresolvable()
    with pytest.warns(UserWarning) as caught:
        module.reset_state(module(state, x).next_state)
    messages = sorted(str(w.message) for w in caught)
    assert len(messages) == 2, messages
    where = "test_annotations_that_cannot_be_resolved_are_reported_once_at_the_first_call"
    for message, method in zip(messages, ("__call__", "reset_state"), strict=True):
        assert f"annotations of {where}.<locals>.Unresolvable.{method} are not checked" in message
        assert "NameError: name 'Local' is not defined" in message
    assert {w.filename for w in caught} == {__file__}
    # Unchecked annotations leave the contract's own checks in place, and warn no more.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Unresolvable()(state, x)
        message = _message(lambda: Unresolvable()(state, _zeros(B // 2, 3)))
    assert f"Unresolvable.__call__: argument state['h'] has B={B} on axis 0" in message


def test_a_container_that_forgets_to_route_update_statistics() -> None:
    history = {"first": _zeros(2, B, 3), "second": _zeros(2, B, 3)}

    message = _message(lambda: Forgetful().update_statistics(history))

    assert "update_statistics never reached Forgetful.second (StatsRecorder)" in message
    assert "expected: Forgetful.update_statistics to pass it its slice" in message
    assert "found:    Forgetful.update_statistics ran but never called it" in message


def test_a_container_that_inherits_the_no_op_update_statistics() -> None:
    network = Sequential([Linear(3, 3, rngs=nnx.Rngs(0)), NoRouting()])

    message = _message(lambda: network.update_statistics([None, {"norm": _zeros(2, B, 3)}]))

    assert "never reached Sequential.layers[1].norm (StatsRecorder)" in message
    assert "Sequential.layers[1] (NoRouting) inherits the no-op default" in message


class _RunningMean:
    """A mixin that folds the history into a running mean."""

    mean: nnx.BatchStat[Array]

    def update_statistics(self, rollout_extras: Array) -> None:
        self.mean[...] = rollout_extras.reshape(-1, 3).mean(0)


class _Centred(StatefulModule):
    """Centres its input on a mean it keeps as an nnx.BatchStat."""

    def __init__(self) -> None:
        self.mean = nnx.BatchStat(jnp.zeros(3))

    def __call__(self, state: Any, x: Array, rollout_extras: Any = None) -> StatefulModuleOutput:
        return StatefulModuleOutput(state, x - self.mean[...], jnp.zeros(()), {}, x)


class _MixinAfterStatefulModule(_Centred, _RunningMean):
    """The bases in the wrong order: StatefulModule's no-op default shadows the mixin's."""


class _MisspeltUpdate(_Centred):
    def update_statistic(self, rollout_extras: Array) -> None:
        self.mean[...] = rollout_extras.reshape(-1, 3).mean(0)


class _BatchNormWithoutUpdate(StatefulModule):
    def __init__(self) -> None:
        self.norm = nnx.BatchNorm(3, use_running_average=True, rngs=nnx.Rngs(0))

    def __call__(self, state: Any, x: Array, rollout_extras: Any = None) -> StatefulModuleOutput:
        return StatefulModuleOutput(state, self.norm(x), jnp.zeros(()), {}, x)


@pytest.mark.parametrize(
    ("module", "variables", "why"),
    [
        (
            _MixinAfterStatefulModule,
            "(_MixinAfterStatefulModule.mean (BatchStat))",
            "; _RunningMean.update_statistics is shadowed by it, since _RunningMean comes "
            "after StatefulModule in the bases: list _RunningMean first",
        ),
        (
            _MisspeltUpdate,
            "(_MisspeltUpdate.mean (BatchStat))",
            "; it defines update_statistic: a misspelling of update_statistics?",
        ),
        (
            _BatchNormWithoutUpdate,
            "(_BatchNormWithoutUpdate.norm.mean (BatchStat), "
            "_BatchNormWithoutUpdate.norm.var (BatchStat))",
            "",
        ),
    ],
    ids=["mixin-after-the-contract", "misspelt", "BatchNorm"],
)
def test_a_module_that_keeps_statistics_but_inherits_the_no_op_update_statistics(
    module: type[StatefulModule], variables: str, why: str
) -> None:
    # Its statistics silently never changed: neither the contract nor the kit said a thing.
    network = Sequential([Linear(3, 3, rngs=nnx.Rngs(0)), module()])
    history = [None, _zeros(2, B, 3)]
    name = f"Sequential.layers[1] ({module.__name__})"

    message = _message(lambda: nnx.jit(lambda n, h: n.update_statistics(h))(network, history))

    assert message.splitlines() == [
        f"Sequential.update_statistics: {name} keeps running statistics {variables} but "
        "inherits the no-op default update_statistics, and nothing wrote them: they would "
        "never change.",
        f"  leaf:     {name}",
        f"  expected: {module.__name__} to define update_statistics and fold the (T, B, *feat) "
        "history into them (or a module above it to write them); or, if they are held fixed "
        f"on purpose, {module.__name__} wrapped in FrozenStatistics",
        f"  found:    {name} inherits the no-op default{why}",
        "  rule:     a module that keeps running statistics (nnx.BatchStat) updates them in an "
        "update_statistics of its own; one whose statistics are held fixed on purpose is "
        "wrapped in FrozenStatistics "
        "(see https://nnx-ppo.readthedocs.io/en/latest/contract.html#statistics)",
    ]
    assert "keeps running statistics" in _message(
        lambda: module().update_statistics(_zeros(2, B, 3))
    )


class _FoldsItsChildsMean(StatefulModule):
    """Keeps its child's statistics itself: the child needs no update_statistics."""

    def __init__(self) -> None:
        self.centred = _Centred()

    def __call__(self, state: Any, x: Array, rollout_extras: Any = None) -> StatefulModuleOutput:
        return self.centred(state, x)

    def update_statistics(self, rollout_extras: Array) -> None:
        self.centred.mean[...] = rollout_extras.reshape(-1, 3).mean(0)


@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "nnx.jit"])
def test_statistics_a_parent_writes_need_no_update_statistics_of_their_own(jitted: bool) -> None:
    network = Sequential([Linear(3, 3, rngs=nnx.Rngs(0)), _FoldsItsChildsMean()])
    history = [None, jnp.ones((2, B, 3))]

    if jitted:
        nnx.jit(lambda n, h: n.update_statistics(h))(network, history)
    else:
        network.update_statistics(history)

    np.testing.assert_array_equal(network.layers[1].centred.mean[...], np.ones(3))


def test_statistics_held_fixed_or_constants_need_no_update_statistics() -> None:
    class Constant(_Centred):
        def __init__(self) -> None:
            self.mean = nnx.Variable(jnp.zeros(3))  # a constant, not a statistic

    network = Sequential([FrozenStatistics(_MixinAfterStatefulModule()), Constant()])

    network.update_statistics([_zeros(2, B, 3), _zeros(2, B, 3)])


@pytest.mark.parametrize(
    ("make", "where"),
    [
        (lambda m: Sequential([Cell(), Cell(), m]), "Sequential.layers[2] (MyLSTM).__call__"),
        (lambda m: Parallel({"actor": m, "critic": Cell()}), "Parallel.components['actor']"),
    ],
    ids=["Sequential", "Parallel"],
)
def test_the_message_names_the_module_path_inside_a_container(
    make: Callable[[StatefulModule], StatefulModule], where: str
) -> None:
    network = make(MyLSTM())

    message = _message(lambda: network(network.initialize_state(B), _zeros(B, 3)))

    assert message.startswith(where)
    assert "(MyLSTM)" in message
    assert "next_state['h'] does not match state['h']" in message


# -------------------------------------------------- the classic faults, inside a jit


def _call_in_jax_jit(module: StatefulModule) -> Any:
    state, x = _batch()
    return jax.jit(lambda s, x: module(s, x))(state, x)


def _call_in_nnx_jit(module: StatefulModule) -> Any:
    state, x = _batch()
    return nnx.jit(lambda m, s, x: m(s, x))(module, state, x)


def _initialize_in_jax_jit(module: StatefulModule) -> Any:
    return jax.jit(lambda: module.initialize_state(B))()


def _initialize_in_nnx_jit(module: StatefulModule) -> Any:
    return nnx.jit(lambda m: m.initialize_state(B))(module)


@pytest.mark.parametrize(
    ("module", "run", "fact"),
    [
        (DropsBatchAxis(), _call_in_jax_jit, "dropped the leading (batch) axis"),
        (DropsBatchAxis(), _call_in_nnx_jit, "dropped the leading (batch) axis"),
        (HalvesOutputBatch(), _call_in_jax_jit, "returned output has B=4"),
        (HalvesOutputBatch(), _call_in_nnx_jit, "returned output has B=4"),
        (IgnoresBatchSize(), _initialize_in_jax_jit, "returned state['h'] has B=16"),
        (IgnoresBatchSize(), _initialize_in_nnx_jit, "returned state['h'] has B=16"),
    ],
    ids=[
        "next_state-drops-B-jax.jit",
        "next_state-drops-B-nnx.jit",
        "output-B-jax.jit",
        "output-B-nnx.jit",
        "initialize_state-jax.jit",
        "initialize_state-nnx.jit",
    ],
)
def test_classic_faults_raise_while_tracing_inside_jit(
    module: StatefulModule, run: Callable[[StatefulModule], Any], fact: str
) -> None:
    # No Python runs once a function is compiled: an error here comes from tracing.
    assert fact in _message(lambda: run(module))


# ----------------------------------------------------------------------- the switch


def test_the_checks_context_manager_turns_checking_off() -> None:
    module = HalvesOutputBatch()

    with nnx_ppo.checks(False):
        assert not nnx_ppo.checks_enabled()
        out = jax.jit(lambda s, x: module(s, x))(*_batch())

    assert out.output.shape == (B // 2, 3)
    assert nnx_ppo.checks_enabled()
    _message(lambda: module(*_batch()))


def test_the_context_manager_overrides_the_environment_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(nnx_ppo.CHECKS_ENV_VAR, "0")

    with nnx_ppo.checks(True):
        _message(lambda: DropsBatchAxis()(*_batch()))


@pytest.mark.parametrize("value", ["0", "false", "OFF", " no "])
def test_the_environment_variable_turns_checking_off(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("NNX_PPO_CHECKS", value)

    assert not nnx_ppo.checks_enabled()
    assert DropsBatchAxis()(*_batch()).next_state["h"].shape == (3,)


def test_checking_is_on_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NNX_PPO_CHECKS", raising=False)

    assert nnx_ppo.checks_enabled()
    _message(lambda: DropsBatchAxis()(*_batch()))


# ------------------------------------------- StatefulModuleOutput through JAX transforms


def test_module_output_survives_tree_map() -> None:
    out = Cell()(*_batch())

    doubled = jax.tree.map(lambda a: 2 * a, out)

    assert isinstance(doubled, StatefulModuleOutput)
    assert jax.tree.structure(doubled) == jax.tree.structure(out)


def test_module_output_survives_vmap_over_an_outer_axis() -> None:
    module = RunningSum(3)
    state = module.initialize_state(B)
    xs = jnp.arange(2 * B * 3, dtype=jnp.float32).reshape(2, B, 3)

    out = jax.vmap(lambda x: module(state, x))(xs)

    assert isinstance(out, StatefulModuleOutput)
    assert out.output.shape == (2, B, 3)
    np.testing.assert_array_equal(np.asarray(out.next_state["steps"]), np.ones((2, B)))


def _running_sum_reference(xs: np.ndarray) -> np.ndarray:
    return np.cumsum(xs, axis=0)


def test_module_output_survives_lax_scan() -> None:
    module = RunningSum(3)
    xs = jnp.asarray(np.random.default_rng(0).standard_normal((4, B, 3)), jnp.float32)

    def step(state: Any, x: Array) -> tuple[Any, StatefulModuleOutput]:
        out = module(state, x)
        return out.next_state, out

    final, outs = jax.lax.scan(step, module.initialize_state(B), xs)

    assert isinstance(outs, StatefulModuleOutput)
    assert outs.regularization_loss.shape == (4, B)
    np.testing.assert_allclose(
        np.asarray(outs.output), _running_sum_reference(np.asarray(xs)), rtol=1e-6
    )
    np.testing.assert_array_equal(np.asarray(final["steps"]), np.full(B, 4))


def test_module_output_survives_nnx_scan() -> None:
    module = Sequential([Linear(3, 3, rngs=nnx.Rngs(0)), RunningSum(3)])
    xs = jnp.asarray(np.random.default_rng(1).standard_normal((4, B, 3)), jnp.float32)

    @nnx.scan(in_axes=(None, nnx.Carry, 0), out_axes=(nnx.Carry, 0))
    def rollout(network: Sequential, state: Any, x: Array) -> tuple[Any, StatefulModuleOutput]:
        out = network(state, x)
        return out.next_state, out

    final, outs = rollout(module, module.initialize_state(B), xs)

    assert isinstance(outs, StatefulModuleOutput)
    linear = module[0]
    assert isinstance(linear, Linear)
    projected = np.asarray(xs) @ np.asarray(linear.kernel[...]) + np.asarray(linear.bias[...])
    np.testing.assert_allclose(
        np.asarray(outs.output), _running_sum_reference(projected), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_array_equal(np.asarray(final[1]["steps"]), np.full(B, 4))


# ---------------------------------------------------- container construction errors


def test_splitter_rejects_declared_sizes_wider_than_its_input() -> None:
    with pytest.raises(ValueError, match=r"adding up to 7 features, but its input has 5"):
        Splitter(action=3, value=4)((), _zeros(B, 5))


@pytest.mark.parametrize("container", [Parallel, Concat])
def test_keyed_containers_built_from_a_dict_or_keywords_agree(container: type) -> None:
    left, right = Linear(3, 2, rngs=nnx.Rngs(0)), Linear(3, 2, rngs=nnx.Rngs(1))
    by_keywords = container(left=left, right=right)
    by_dict = container({"left": left, "right": right})
    ones = jnp.ones((B, 3))
    x = ones if container is Parallel else {"left": ones, "right": 2 * ones}

    from_keywords = by_keywords(by_keywords.initialize_state(B), x).output
    from_dict = by_dict(by_dict.initialize_state(B), x).output

    assert list(by_keywords.components) == list(by_dict.components) == ["left", "right"]
    _assert_trees_equal(from_keywords, from_dict)


@pytest.mark.parametrize("container", [Parallel, Concat])
def test_keyed_containers_accept_keys_that_are_not_identifiers(container: type) -> None:
    module = container({"left hand": RunningSum(3)})

    assert set(module.initialize_state(2)) == {"left hand"}


@pytest.mark.parametrize("container", [Parallel, Concat])
@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda c, m: c({"a": m}, b=m), ValueError, "either a dict or keyword arguments"),
        (lambda c, m: c(), ValueError, "at least one child"),
        (lambda c, m: c({1: m}), TypeError, "keys must be strings"),
        (lambda c, m: c(a=jnp.zeros(3)), TypeError, "not a StatefulModule"),
    ],
    ids=["both", "empty", "non-string-key", "non-module"],
)
def test_keyed_containers_reject_bad_construction(
    container: type, build: Callable[..., Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        build(container, RunningSum(3))


@typechecked
def _takes_extras(extras: Extras, mask: Mask) -> None:
    del extras, mask


def test_a_leaf_of_an_optional_pytree_is_named_with_numpy_shown_as_numpy() -> None:
    message = _message(
        lambda: _takes_extras({"a": _zeros(B, 3), "b": np.zeros(4)}, jnp.zeros((B,), bool))
    )

    assert "_takes_extras: argument extras['b'] does not match" in message
    assert "expected: Shaped[Array, 'B ...'] with B=8\n" in message
    assert "found:    f64[4](numpy)" in message


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class _Validated:
    """A pytree that refuses to be rebuilt around anything but an array."""

    value: jax.Array

    def __post_init__(self) -> None:
        if not hasattr(self.value, "ndim"):
            raise TypeError("value must be an array")


@typechecked
def _takes_a_list(x: list[Float[Array, "B 3"]]) -> None:
    del x


def test_a_value_that_cannot_be_summarised_is_still_reported() -> None:
    message = _message(lambda: _takes_a_list(_Validated(_zeros(B, 3))))  # type: ignore[arg-type]

    assert "argument x does not match its jaxtyping annotation" in message
    assert "found:    _Validated(value=Array(" in message
