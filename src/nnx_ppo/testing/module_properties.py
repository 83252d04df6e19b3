"""``check_module``: every contract property of a stateful module, checked with Hypothesis.

The runtime checks (:mod:`nnx_ppo.contract.checking`) catch what one call's shapes and
trees show. The properties that need several calls, per-sample purity, replay,
statistics, are what this kit adds: it runs your module on random batch sizes,
rollout lengths, episode ends and inputs, compares the calls with each other, and
on failure raises :class:`ContractPropertyError` naming the property, the smallest
batch size and rollout length Hypothesis found that fail, and the leaf that
differed.

The properties live in one ordered table, :data:`MODULE_PROPERTIES`: the checks run
in its order, and :func:`check_module`'s docstring lists them from it.

Example::

    from nnx_ppo.testing import check_module

    def test_my_cell():
        check_module(lambda: MyCell(3, 8, nnx.Rngs(0)), jnp.zeros(3))
"""

from __future__ import annotations

import contextlib
import enum
import functools
import math
import operator
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import jax
import jax.extend as jex
import jax.numpy as jnp
import numpy as np
from flax import nnx
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import FlakyFailure
from jaxtyping import Array, Bool, Float, Inexact, Key, PyTree, Shaped

from nnx_ppo._compile import fast_compile_options
from nnx_ppo.contract import ContractError, checks
from nnx_ppo.contract.arguments import require_bool, require_int, require_number
from nnx_ppo.contract.axes import (
    BatchedTree,
    BoolHistory,
    History,
    HistoryTree,
    Mask,
    align_leading,
)
from nnx_ppo.contract.checking import (
    RULE_NO_WRITES,
    RULE_RANDOMNESS,
    RULE_STATISTICS_KIND,
    CallRecord,
    batched_example_hint,
    format_graph_path,
    held_dtype,
    is_stats_bearing,
    named_leaves,
    observe_calls,
    require_float_parameters,
    require_hashable_settings,
    require_no_hijax,
    resets_its_carry,
)
from nnx_ppo.networks.adapter import is_sampled_action
from nnx_ppo.networks.types import (
    PPONetworkOutput,
    StatefulModule,
    StatefulModuleOutput,
    stateless_hint,
)
from nnx_ppo.testing._harness import (
    Condition,
    ContractPropertyError,
    PropertyCheck,
    as_numpy,
    contract_leaf,
    document_properties,
    host,
    is_key,
    property_failure,
    show_values,
    widened,
)
from nnx_ppo.testing.strategies import _DRAWN_DTYPES, _can_draw, pytree_observations

__all__ = [
    "DEFAULT_BATCH_SIZES",
    "DEFAULT_MAX_EXAMPLES",
    "DEFAULT_TIME_LENGTHS",
    "MAX_EXAMPLES_ENV_VAR",
    "MODULE_PROPERTIES",
    "ContractPropertyError",
    "ModuleProperty",
    "check_module",
]

DEFAULT_BATCH_SIZES: tuple[int, ...] = (1, 2, 3)
"""The batch sizes :func:`~nnx_ppo.testing.check_module` draws from unless told
otherwise. Each size compiles the module's step once, so a few small ones keep the check
fast."""

DEFAULT_TIME_LENGTHS: tuple[int, ...] = (1, 4)
"""The rollout lengths :func:`~nnx_ppo.testing.check_module` draws from unless told
otherwise: one step, where a failure is simplest to read, and four, long enough for
episodes to end at different steps in different envs. The step compiles once whatever the
length, ``update_statistics`` once per length and batch size: two lengths keep
that to six compiles with the default batch sizes."""

DEFAULT_MAX_EXAMPLES = 10
"""How many examples :func:`~nnx_ppo.testing.check_module` runs when neither
``max_examples`` nor :data:`MAX_EXAMPLES_ENV_VAR` says otherwise."""

MAX_EXAMPLES_ENV_VAR = "NNX_PPO_MAX_EXAMPLES"
"""The environment variable that sets :func:`~nnx_ppo.testing.check_module`'s default
``max_examples`` (e.g. for a nightly job); ``pytest --nnx-ppo-max-examples=N`` sets it
for the session."""


class ModuleProperty(enum.StrEnum):
    """The names of the properties :func:`~nnx_ppo.testing.check_module` checks.

    The order they run in, their rules and what each compares are the rows of
    :data:`~nnx_ppo.testing.MODULE_PROPERTIES`.
    """

    INITIALIZE_STATE = "initialize_state"
    CHECKED_CALL = "checked call"
    CARRY_PRESERVATION = "carry preservation"
    NO_WRITES = "no variable written in the forward path"
    PERMUTATION = "permutation equivariance"
    BATCH_OF_ONE = "batch-of-one agreement"
    RESET_STATE = "reset_state"
    EPISODES_INDEPENDENT = "episodes are independent"
    REPLAY = "replay consistency"
    REPLAY_SUBSET = "replay on a subset of the batch"
    STORED_ACTION = "replay takes the stored action"
    STATISTICS = "update_statistics routing"
    STATISTICS_ORDER = "statistics fold (T, B) as one batch"
    STATISTICS_NOT_TRAINED = "statistics are not trainable parameters"
    EAGER_COMPILED = "eager and compiled agree"
    PER_ENV_KEYS = "per-env keys in carry"


# ----------------------------------------------------------------------------- examples


@dataclass(frozen=True, repr=False)
class _Example:
    """One drawn case: the sizes, two input sequences, the episode ends, and the rows
    the checks permute or take."""

    batch_size: int
    time_length: int
    inputs: HistoryTree
    other_inputs: HistoryTree
    ends: BoolHistory
    permutation: np.ndarray
    subset: np.ndarray

    @property
    def sizes(self) -> dict[str, int]:
        return {"B": self.batch_size, "T": self.time_length}

    def __repr__(self) -> str:
        ends = [(int(t), int(env)) for t, env in np.argwhere(self.ends)]
        return (
            f"Example(B={self.batch_size}, T={self.time_length}, "
            f"episode ends (step, env)={ends}, "
            f"permutation={self.permutation.tolist()}, subset={self.subset.tolist()})"
        )

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        # Hypothesis prints the failing example: the sizes and rows, not the arrays.
        del cycle
        printer.text(repr(self))


def _time_major(batch_major: PyTree[Shaped[Array, "B T ..."]]) -> HistoryTree:
    return jax.tree.map(lambda leaf: leaf.swapaxes(0, 1), host(batch_major))


def _same_values(a: PyTree[Any], b: PyTree[Any]) -> bool:
    return all(
        np.array_equal(as_numpy(x), as_numpy(y))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


@st.composite
def _examples(
    draw: st.DrawFn,
    batch_sizes: tuple[int, ...],
    time_lengths: tuple[int, ...],
    spec: PyTree[jax.ShapeDtypeStruct],
) -> _Example:
    batch_size = draw(st.sampled_from(batch_sizes))
    time_length = draw(st.sampled_from(time_lengths))
    # One draw of (B, T, *feat) per sequence: pytree_observations adds the batch axis.
    with_time = jax.tree.map(lambda s: jax.ShapeDtypeStruct((time_length, *s.shape), s.dtype), spec)
    sequences = pytree_observations(with_time, batch_size=batch_size).map(_time_major)
    inputs = draw(sequences)
    other_inputs = draw(sequences.filter(lambda other: not _same_values(other, inputs)))
    # Episodes end after any step but the last (an end there changes nothing compared);
    # Hypothesis shrinks towards no ends, so a failure that needs none shows none.
    row = st.lists(st.booleans(), min_size=batch_size, max_size=batch_size)
    ends = draw(st.lists(row, min_size=time_length - 1, max_size=time_length - 1))
    rows = range(batch_size)
    subset_size = draw(st.sampled_from([b for b in batch_sizes if b <= batch_size]))
    subset = draw(
        st.lists(st.sampled_from(rows), min_size=subset_size, max_size=subset_size, unique=True)
    )
    return _Example(
        batch_size=batch_size,
        time_length=time_length,
        inputs=inputs,
        other_inputs=other_inputs,
        ends=np.asarray([*ends, [False] * batch_size], dtype=bool),
        permutation=np.asarray(draw(st.permutations(rows)), dtype=np.int32),
        subset=np.asarray(subset, dtype=np.int32),
    )


# ---------------------------------------------------------------------------- comparing


@dataclass(frozen=True)
class _Mismatch:
    """The first leaf where two results differ: its row, both values, and by how much."""

    leaf: str
    row: int | None
    expected: str
    found: str
    gap: str = ""


def _first_mismatch(
    expected: list[tuple[str, Any]],
    found: list[tuple[str, Any]],
    rtol: float,
    atol: float,
) -> _Mismatch | None:
    """Compare two named-leaf lists (floats within tolerance, the rest exactly)."""
    expected_names = [name for name, _ in expected]
    found_names = [name for name, _ in found]
    if expected_names != found_names:
        missing = [name for name in expected_names if name not in found_names]
        extra = [name for name in found_names if name not in expected_names]
        difference = "; ".join(
            f"{label} {names[:4]}"
            for label, names in (("missing", missing), ("extra", extra))
            if names
        )
        return _Mismatch(
            "set of leaves",
            None,
            f"leaves {expected_names[:6]}",
            f"leaves {found_names[:6]} ({difference or 'in another order'})",
        )
    for (name, want), (_, got) in zip(expected, found, strict=True):
        want_np, got_np = as_numpy(want), as_numpy(got)
        # As JAX holds them: an eager NumPy float64 leaf is float32 once compiled.
        same_dtype = held_dtype(want_np.dtype) == held_dtype(got_np.dtype)
        if want_np.shape != got_np.shape or not same_dtype:
            return _Mismatch(
                name,
                None,
                f"shape {want_np.shape} {want_np.dtype}",
                f"shape {got_np.shape} {got_np.dtype}",
            )
        inexact = jnp.issubdtype(want_np.dtype, jnp.inexact)
        if inexact:
            # A few units in the last place of the leaf's own dtype: bfloat16's are
            # about 1e-2, and XLA rounds a fused program differently from eager ops.
            floor = 4 * float(jnp.finfo(want_np.dtype).eps)
            bad = ~np.isclose(
                widened(got_np),
                widened(want_np),
                rtol=max(rtol, floor),
                atol=max(atol, floor),
                equal_nan=True,
            )
        else:
            bad = got_np != want_np
        if not bad.any():
            continue
        row = None if want_np.ndim == 0 else int(np.argwhere(bad)[0][0])
        want_np, got_np = (want_np, got_np) if row is None else (want_np[row], got_np[row])
        gap = ""
        if inexact:
            difference = np.abs(widened(got_np) - widened(want_np))
            gap = f"largest difference {np.nanmax(difference):.3g}"
        return _Mismatch(name, row, show_values(want_np), show_values(got_np), gap)
    return None


def _step_leaves(out: StatefulModuleOutput, *, batched_only: bool, extras: bool) -> list[Any]:
    """One step's named leaves; per-step scalars dropped where rows are compared."""
    fields = ["output", "next_state", "regularization_loss", "metrics"]
    if extras:
        fields.append("rollout_extras")
    named = [pair for field in fields for pair in named_leaves(field, getattr(out, field))]
    if batched_only:
        return [(name, leaf) for name, leaf in named if leaf.ndim > 0]
    return named


def _rows(tree: BatchedTree, rows: Any) -> PyTree[Shaped[Array, "R ..."]]:
    """Rows of every batched leaf; scalars (a scalar loss or metric) stay as they are."""
    return jax.tree.map(lambda leaf: leaf if leaf.ndim == 0 else leaf[rows], tree)


def _env_rows(tree: HistoryTree, rows: Any) -> PyTree[Shaped[Array, "T R ..."]]:
    return jax.tree.map(lambda leaf: leaf[:, rows], tree)


def _at_step(tree: PyTree[Shaped[Array, "T ..."]], t: int) -> PyTree[Shaped[Array, "..."]]:
    return jax.tree.map(lambda leaf: leaf[t], tree)


def _where_rows(
    mask: Mask,
    fresh: BatchedTree,
    current: BatchedTree,
) -> BatchedTree:
    """``fresh`` in the rows where ``mask`` is set, ``current`` elsewhere (on the host)."""

    def pick(new: Any, old: Any) -> Any:
        where = align_leading(mask, old)
        if is_key(old):
            data = np.where(where[..., None], as_numpy(new), as_numpy(old))
            return jax.random.wrap_key_data(jnp.asarray(data), impl=jax.random.key_impl(old))
        return np.where(where, new, old)

    return jax.tree.map(pick, fresh, current)


def _actions(out: StatefulModuleOutput) -> list[tuple[str, Any]]:
    """The action leaves of a sampler's or a PPO network's output, named."""
    if isinstance(out.output, PPONetworkOutput):
        return named_leaves("output.actions", out.output.actions)
    nodes, _ = jax.tree_util.tree_flatten_with_path(out.output, is_leaf=is_sampled_action)
    return [
        (f"output{jax.tree_util.keystr(path)}['action']", node["action"])
        for path, node in nodes
        if is_sampled_action(node)
    ]


# ------------------------------------------------------------------------- the module


_FORWARD_STATE = nnx.Not(nnx.Intermediate)
"""The variables a forward pass must leave alone."""


def _variable_values(variables: nnx.State) -> dict[str, Any]:
    """Every array in the module's NNX variables, by a name like ``layers.0.mean['a']``.

    A variable may hold a pytree (a Normalizer's statistics of a dict input): its
    leaves are named below the variable's path.
    """
    values: dict[str, Any] = {}
    for path, variable in nnx.to_flat_state(variables):
        name = ".".join(str(part) for part in path)
        # A plain array attribute is state too in Flax NNX (pytree data), held bare.
        value = variable.get_value() if isinstance(variable, nnx.Variable) else variable
        for leaf_path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
            values[name + jax.tree_util.keystr(leaf_path)] = leaf
    return values


def _detached(variables: nnx.State) -> nnx.State:
    """The same values in new ``nnx.Variable`` objects: ``nnx.split`` and ``nnx.state``
    hand out the module's own, which an eager call would write through."""
    return jax.tree.map(lambda leaf: leaf, variables)


def _trainable(variables: nnx.State) -> dict[str, tuple[str, str]]:
    """The names of :func:`_variable_values` held by an ``nnx.Param``, each with its
    module's path (``""`` at the top) and the variable's attribute name."""
    trainable: dict[str, tuple[str, str]] = {}
    for path, variable in nnx.to_flat_state(variables):
        if not isinstance(variable, nnx.Param):
            continue
        name = ".".join(str(part) for part in path)
        place = (".".join(str(part) for part in path[:-1]), str(path[-1]))
        for leaf_path, _ in jax.tree_util.tree_flatten_with_path(variable.get_value())[0]:
            trainable[name + jax.tree_util.keystr(leaf_path)] = place
    return trainable


def _writes(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Bool[Array, ""]]:
    """Per variable, whether it was written (added, removed, reshaped or given new values)."""
    flags: dict[str, Bool[Array, ""]] = {}
    for name in sorted(set(before) | set(after)):
        old, new = before.get(name), after.get(name)
        if old is None or new is None or old.shape != new.shape or old.dtype != new.dtype:
            flags[name] = jnp.asarray(True)
        elif is_key(old):
            flags[name] = jnp.any(jax.random.key_data(old) != jax.random.key_data(new))
        else:
            flags[name] = jnp.any(old != new)
    return flags


def _written(flags: dict[str, Any]) -> list[str]:
    return [name for name, flag in flags.items() if bool(flag)]


_PROPERTY_OF_RULE = {
    RULE_NO_WRITES: ModuleProperty.NO_WRITES,
    RULE_RANDOMNESS: ModuleProperty.NO_WRITES,
    RULE_STATISTICS_KIND: ModuleProperty.STATISTICS_NOT_TRAINED,
}
"""Contract rules whose violation, raised by the runtime checks, is one of the kit's properties."""


class _PhaseError(Exception):
    """An error raised while one property's calls ran; turned into a ContractPropertyError."""

    def __init__(
        self, prop: ModuleProperty, what: str, error: Exception, hint: str | None = None
    ) -> None:
        super().__init__(str(error))
        self.prop = prop
        self.what = what
        self.error = error
        self.hint = hint


class _GivenNoHistory(Exception):
    """``update_statistics`` raised in a module that was given ``None``: it emitted no
    ``rollout_extras``, which the error it raised does not say."""

    def __init__(self, module: str, error: Exception) -> None:
        super().__init__(str(error))
        self.module = module
        self.error = error

    def hint(self) -> str:
        return (
            f"{self.module}.update_statistics was given None: its __call__ emitted no "
            "rollout_extras. Return what its statistics need as rollout_extras, the 5th "
            "field of StatefulModuleOutput(next_state, output, regularization_loss, "
            "metrics, rollout_extras)"
        )


@contextlib.contextmanager
def _phase(prop: ModuleProperty, what: str) -> Iterator[None]:
    """Attribute any error raised inside to ``prop``; ``what`` says which call raised."""
    try:
        yield
    except (_PhaseError, ContractPropertyError):
        raise
    except _GivenNoHistory as given:
        raise _PhaseError(prop, what, given.error, given.hint()) from given.error
    except Exception as error:
        leaf = contract_leaf(error)
        if prop is ModuleProperty.CHECKED_CALL and leaf and leaf.startswith("next_state"):
            prop = ModuleProperty.CARRY_PRESERVATION
        # The runtime checks name two properties of the kit themselves, in any phase.
        if isinstance(error, ContractError) and error.rule in _PROPERTY_OF_RULE:
            prop = _PROPERTY_OF_RULE[error.rule]
        raise _PhaseError(prop, what, error) from error


@dataclass(frozen=True)
class _Write:
    """NNX variables written by one call of a run."""

    what: str
    step: int
    names: list[str]


def _stacked(steps: Sequence[Any]) -> Any:
    """Per-step trees of ``(B, *feat)`` leaves stacked into ``(T, B, *feat)``."""

    def stack(*leaves: Any) -> Any:
        return jnp.stack(leaves) if is_key(leaves[0]) else np.stack(leaves)

    return jax.tree.map(stack, *steps)


@dataclass(frozen=True)
class _Trajectory:
    """A rollout or a replay: the carry each step was given, its results, its writes,
    and what each module that keeps statistics emitted at each step (by its path)."""

    states: list[Any]
    outputs: list[StatefulModuleOutput]
    writes: list[_Write]
    emitted: list[dict[str, tuple[Any, ...]]]
    last_carried: dict[str, tuple[Any, ...]]
    """At the last step, the carry each module with its own ``reset_state`` returned (by
    path)."""

    def extras(self) -> Any:
        """The emitted rollout_extras stacked over steps: leaves ``(T, B, *feat)``."""
        return _stacked([o.rollout_extras for o in self.outputs])


class _PerModule:
    """What the modules below a root that a predicate picks (by default, those that keep
    statistics) were given or returned, by path, from the checked calls of one method."""

    def __init__(
        self,
        root: StatefulModule,
        method: str,
        selects: Callable[[Any], bool] = is_stats_bearing,
        read: Callable[[CallRecord], Any] | None = None,
    ) -> None:
        """Observe the calls of ``method`` of the modules ``selects`` picks below ``root``,
        keeping ``read(record)``: by default a call's ``rollout_extras``, or the first
        argument of another method."""
        self.method = method
        self.paths = {
            id(node): format_graph_path(root, tuple(path))
            for path, node in nnx.iter_graph(root)
            if selects(node)
        }
        self.read = read or (
            (lambda r: r.result.rollout_extras)
            if method == "__call__"
            else (lambda r: r.arguments[0][1])
        )
        self.seen: dict[str, list[tuple[Any, bool]]] = {}
        self.failed: list[tuple[str, Any]] = []
        """The calls that raised, innermost first: the module's path and what it was given."""

    def __call__(self, record: CallRecord) -> None:
        path = self.paths.get(id(record.module))
        if path is None or record.method != self.method:
            return
        if record.error is not None:
            self.failed.append((path, record.arguments[0][1] if record.arguments else None))
            return
        self.seen.setdefault(path, []).append((self.read(record), not record.in_transform))

    def calls(self) -> dict[str, int]:
        """How many calls each module had."""
        return {path: len(values) for path, values in self.seen.items()}

    def at_top(self) -> dict[str, tuple[Any, ...]]:
        """Each module's values, one per call, where every call was at the top of the
        compiled call: one called inside a transform of it (``jax.checkpoint``,
        ``vmap``, a scan) holds that transform's tracers, which cannot leave it, and is
        left out. Values the module's callers computed (a container's arithmetic,
        packing and unpacking) are kept: they are what the module was given or
        returned. A module shared by two inputs has two values."""
        return {
            path: tuple(value for value, _ in values)
            for path, values in self.seen.items()
            if all(top for _, top in values)
        }


class _ModuleKit:
    """The module, its compiled calls, and the options of one ``check_module`` call."""

    def __init__(
        self,
        module: StatefulModule,
        rtol: float,
        atol: float,
        stochastic: bool | Literal["per_episode"],
        episodic: bool,
    ) -> None:
        require_no_hijax("check_module", module)
        # What training refuses of a module's structure, before any property runs.
        require_float_parameters("check_module", module)
        require_hashable_settings("check_module", module)
        self.name = type(module).__name__
        # The caller's module runs the eager calls: built by the caller, its attributes
        # keep their order, which nnx.merge would sort (nothing may depend on it).
        self.module = module
        # Every example starts from these; compiled calls get copies, so neither they
        # nor the caller's module are ever written.
        self.graphdef, variables = nnx.split(module)
        self.variables = _detached(variables)
        self.trainable = _trainable(self.variables)
        self.rtol, self.atol, self.stochastic, self.episodic = rtol, atol, stochastic, episodic
        # By method, whether its results depend on each key leaf of the carry: traced
        # once, on first need.
        self.key_readers: dict[str, dict[str, bool]] = {}
        # Whether replay's log-likelihoods depend on the variables or the input, and the
        # extras' leaves other than the stored action they depend on: likewise.
        self.replay_scoring: tuple[bool, list[str]] | None = None
        # Compiled once per batch size (the step also per extras given or not, the fold
        # per rollout length); the graphdef is closed over and the variables are an
        # argument, so every example reuses the compiled programs.
        options = fast_compile_options()
        self.initialize = jax.jit(self._initialize, static_argnums=1, compiler_options=options)
        self.step = jax.jit(self._step, compiler_options=options)
        self.reset = jax.jit(self._reset, compiler_options=options)
        self.fold = jax.jit(self._fold, compiler_options=options)

    # ------------------------------------------------------------------ compiled calls

    def _initialize(self, variables: nnx.State, batch_size: int) -> tuple[Any, nnx.State]:
        module = nnx.merge(self.graphdef, variables)
        state = module.initialize_state(batch_size)
        # initialize_state may advance an nnx.Rngs that seeds per-env keys.
        return state, nnx.state(module)

    def _step(
        self, variables: nnx.State, state: Any, x: Any, rollout_extras: Any
    ) -> tuple[StatefulModuleOutput, dict[str, Bool[Array, ""]], dict[str, Any], dict[str, Any]]:
        """The call's output, its writes, and by module path what each module that keeps
        statistics emitted and the carry each module with its own reset returned."""
        # The intermediates sow and nnx.capture keep are the one kind a forward pass
        # may write: no forward pass reads them.
        before = _variable_values(nnx.filter_state(variables, _FORWARD_STATE))
        module = nnx.merge(self.graphdef, variables)
        emitted = _PerModule(module, "__call__")
        carried = _PerModule(module, "__call__", resets_its_carry, lambda r: r.result.next_state)
        with observe_calls(emitted), observe_calls(carried):
            out = module(state, x, rollout_extras)
        writes = _writes(before, _variable_values(nnx.state(module, _FORWARD_STATE)))
        return out, writes, emitted.at_top(), carried.at_top()

    def _reset(
        self, variables: nnx.State, state: Any
    ) -> tuple[Any, Any, dict[str, Bool[Array, ""]], dict[str, Any]]:
        """``reset_state`` of the batch and of each env's slice, its writes, and by module
        path the carry each module with its own reset was given in the batched call."""
        before = _variable_values(variables)
        module = nnx.merge(self.graphdef, variables)
        given = _PerModule(module, "reset_state", resets_its_carry)
        with (
            _phase(ModuleProperty.RESET_STATE, "reset_state on the batched carry"),
            observe_calls(given),
        ):
            batched = module.reset_state(state)
        per_env = batched
        if jax.tree.leaves(state):  # vmap needs an axis to map over
            with _phase(ModuleProperty.RESET_STATE, "reset_state on one env's slice, under vmap"):
                # nnx.vmap, the module unmapped: an NNX transform inside reset_state (an
                # ensemble's nnx.vmap over its members) refuses variables that a plain
                # jax.vmap closed over from its outer trace.
                per_env = nnx.vmap(
                    lambda module, slice_: module.reset_state(slice_), in_axes=(None, 0)
                )(module, state)
        return (
            batched,
            per_env,
            _writes(before, _variable_values(nnx.state(module))),
            given.at_top(),
        )

    def _fold(
        self, variables: nnx.State, history: Any
    ) -> tuple[dict[str, Any], dict[str, tuple[Any, ...]], dict[str, int]]:
        """The variables after ``update_statistics``; the histories each module that
        keeps statistics was given, and how many times it was called."""
        module = nnx.merge(self.graphdef, variables)
        given = _PerModule(module, "update_statistics")
        with observe_calls(given):
            try:
                module.update_statistics(history)
            except ContractError:
                raise
            except Exception as error:
                if given.failed and given.failed[0][1] is None:
                    raise _GivenNoHistory(self.name + given.failed[0][0], error) from error
                raise
        return _variable_values(nnx.state(module, _FORWARD_STATE)), given.at_top(), given.calls()

    # -------------------------------------------------------------------- eager calls

    @contextlib.contextmanager
    def eager(self, variables: nnx.State) -> Iterator[StatefulModule]:
        """The caller's module, holding ``variables`` until the block ends."""
        nnx.update(self.module, _detached(variables))
        try:
            yield self.module
        finally:
            nnx.update(self.module, _detached(self.variables))

    # ------------------------------------------------------------------------ running

    def run(
        self,
        prop: ModuleProperty,
        what: str,
        variables: nnx.State,
        state: Any,
        inputs: Any,
        stored: Any,
        ends: BoolHistory,
    ) -> _Trajectory:
        """Call the module once per step from ``state``; ``stored``: replay's extras.

        After a step where ``ends`` marks an env, that env's carry is reset with
        ``reset_state`` of the batch, as the library does on an episode end.
        """
        states, outputs, writes, emitted = [], [], [], []
        carries: dict[str, tuple[Any, ...]] = {}
        for t in range(len(ends)):
            states.append(state)
            extras = None if stored is None else _at_step(stored, t)
            with _phase(prop, what):
                out, flags, by_module, carries = self.step(
                    variables, state, _at_step(inputs, t), extras
                )
            out = host(out)
            outputs.append(out)
            emitted.append(host(by_module))
            if names := _written(flags):
                call = "__call__" if stored is None else "__call__ in replay"
                writes.append(_Write(call, t, names))
            state = out.next_state
            if ends[t].any():
                where = f"reset_state of the envs whose episode ended at step {t}"
                with _phase(ModuleProperty.RESET_STATE, where):
                    fresh, _, flags, _ = host(self.reset(variables, state))
                if names := _written(flags):
                    writes.append(_Write("reset_state", t, names))
                state = _where_rows(ends[t], fresh, state)
        return _Trajectory(states, outputs, writes, emitted, host(carries))


class _Case:
    """One example and the results its properties compare, each computed when first needed.

    The rows of :data:`MODULE_PROPERTIES` are functions of a case: a result two
    properties need (the rollout, the replay) is computed once, under the property
    that needs it first, and an error raised while computing it is reported under
    the property it was computed for.
    """

    def __init__(self, kit: _ModuleKit, example: _Example) -> None:
        self.kit = kit
        self.ex = example

    @functools.cached_property
    def low_precision(self) -> str | None:
        """The narrowest float dtype below float32 among the variables and the carry."""
        dtypes = {
            leaf.dtype
            for leaf in jax.tree.leaves((_variable_values(self.kit.variables), self.initial))
            if jnp.issubdtype(leaf.dtype, jnp.floating) and leaf.dtype.itemsize < 4
        }
        if not dtypes:
            return None
        return str(max(dtypes, key=lambda dtype: float(jnp.finfo(dtype).eps)))

    # -------------------------------------------------------------------- the results

    @functools.cached_property
    def start(self) -> tuple[Any, nnx.State]:
        """``initialize_state(B)``'s carry, and the variables after it."""
        with _phase(ModuleProperty.INITIALIZE_STATE, f"initialize_state({self.ex.batch_size})"):
            initial, variables = self.kit.initialize(self.kit.variables, self.ex.batch_size)
        return host(initial), variables

    @property
    def initial(self) -> Any:
        return self.start[0]

    @property
    def variables(self) -> nnx.State:
        return self.start[1]

    @functools.cached_property
    def rollout(self) -> _Trajectory:
        return self.kit.run(
            ModuleProperty.CHECKED_CALL,
            "the rollout's __call__",
            self.variables,
            self.initial,
            self.ex.inputs,
            None,
            self.ex.ends,
        )

    @functools.cached_property
    def replay(self) -> _Trajectory:
        return self.kit.run(
            ModuleProperty.REPLAY,
            "__call__ in replay (given the stored rollout_extras)",
            self.variables,
            self.initial,
            self.ex.inputs,
            self.rollout.extras(),
            self.ex.ends,
        )

    @functools.cached_property
    def reset(self) -> tuple[Any, Any, dict[str, Any], dict[str, Any]]:
        """``reset_state`` of the rollout's final carry: batched, per env, its writes, and
        the carry each module with its own reset was given."""
        with _phase(ModuleProperty.RESET_STATE, "reset_state"):
            return host(self.kit.reset(self.variables, self.rollout.outputs[-1].next_state))

    @functools.cached_property
    def folded(self) -> tuple[dict[str, Any], dict[str, tuple[Any, ...]], dict[str, int]]:
        """``update_statistics`` of the rollout's history: the variables after it, the
        history each module below that keeps statistics was given, and its calls."""
        with _phase(ModuleProperty.STATISTICS, "update_statistics"):
            return host(self.kit.fold(self.variables, self.rollout.extras()))

    @property
    def statistics(self) -> dict[str, Any]:
        return self.folded[0]

    # ------------------------------------------------------------------------ failing

    def fail(self, prop: ModuleProperty, sentence: str, **details: Any) -> ContractPropertyError:
        return property_failure(
            "check_module",
            prop,
            self.kit.name,
            self.ex.sizes,
            sentence,
            rule=_RULES[prop],
            **details,
        )

    def check_writes(self, writes: list[_Write]) -> None:
        if not writes:
            return
        first, name = writes[0], self.kit.name
        raise self.fail(
            ModuleProperty.NO_WRITES,
            f"{first.what} wrote the NNX variable {first.names[0]} (at step {first.step}).",
            leaf=f"{name}.{first.names[0]}",
            expected="every NNX variable as it was before the call",
            found="written: " + ", ".join(f"{name}.{n}" for n in first.names[:4]),
        )

    def compare(
        self,
        prop: ModuleProperty,
        expected: list[list[tuple[str, Any]]],
        found: list[list[tuple[str, Any]]],
        describe: Callable[[_Mismatch], tuple[str, str, str]],
        row_name: Callable[[int], str] = lambda row: f"env {row}",
        *,
        steps: Sequence[int] | None = None,
    ) -> None:
        """Raise for the first step and leaf where ``found`` differs from ``expected``.

        ``expected`` and ``found`` hold one list of named leaves per step, the steps
        ``steps`` (``None``: results that are not a rollout's, no step to name).
        ``describe(mismatch)`` returns the sentence and the labels of the expected
        and found values; ``row_name`` names the row of a leaf that differed.
        """
        labels = [None] * len(expected) if steps is None else list(steps)
        for t, want, got in zip(labels, expected, found, strict=True):
            mismatch = _first_mismatch(want, got, self.kit.rtol, self.kit.atol)
            if mismatch is None:
                continue
            sentence, expected_label, found_label = describe(mismatch)
            if mismatch.gap and (low := self.low_precision):
                sentence += (
                    f" The module computes in {low}, which rounds at about "
                    f"{float(jnp.finfo(low).eps):.0e}: if this is rounding, pass rtol and "
                    "atol of that scale."
                )
            where = mismatch.leaf if t is None else f"{mismatch.leaf} at step {t}"
            if mismatch.row is not None:
                where += f", {row_name(mismatch.row)}"
            found_note = "; ".join(note for note in (found_label, mismatch.gap) if note)
            raise self.fail(
                prop,
                sentence,
                leaf=where,
                expected=f"{mismatch.expected}  ({expected_label})",
                found=f"{mismatch.found}  ({found_note})",
            )

    @property
    def all_steps(self) -> range:
        return range(self.ex.time_length)


# ---------------------------------------------------------------------- the properties


def _check_initialize_state(case: _Case) -> None:
    initial = case.initial  # computing it runs the contract checks
    size = case.ex.batch_size
    if size == 1:
        return
    kit = case.kit
    with _phase(ModuleProperty.INITIALIZE_STATE, "initialize_state(1)"):
        alone, drawn = kit.initialize(kit.variables, 1)
        again = kit.initialize(drawn, 1)[0]
    with _phase(ModuleProperty.INITIALIZE_STATE, f"initialize_state({size + 1})"):
        more = kit.initialize(kit.variables, size + 1)[0]
    # A leaf drawn from the module's nnx.Rngs differs from one call to the next; the rest
    # is decided by batch_size alone, and no env's start may depend on how many there are
    # (training starts n_envs envs, evaluation its own number).
    fixed = [
        (name, leaf)
        for (name, leaf), (_, other) in zip(
            named_leaves("state", host(alone)), named_leaves("state", host(again)), strict=True
        )
        if not is_key(leaf) and _same_values(leaf, other)
    ]
    kept = {name for name, _ in fixed}
    first_env = named_leaves("state", _rows(initial, np.asarray([0])))
    case.compare(
        ModuleProperty.INITIALIZE_STATE,
        [[(name, leaf) for name, leaf in first_env if name in kept]],
        [fixed],
        lambda m: (
            f"env 0's initial carry depends on the batch size: {m.leaf} of "
            f"initialize_state({size}) differs from initialize_state(1)'s. Training starts "
            "n_envs envs and evaluation its own number, so the policy would act otherwise "
            "in each; keep the batch size out of the carry's values.",
            f"initialize_state({size}), env 0",
            "initialize_state(1)",
        ),
    )
    # Every env, not env 0 alone: a start spread over the batch (linspace(0, 1, B)).
    first_envs = named_leaves("state", _rows(more, np.arange(size)))
    case.compare(
        ModuleProperty.INITIALIZE_STATE,
        [[(name, leaf) for name, leaf in first_envs if name in kept]],
        [[(name, leaf) for name, leaf in named_leaves("state", initial) if name in kept]],
        lambda m: (
            f"an env's initial carry depends on the batch size: {m.leaf} of "
            f"initialize_state({size}) differs from the same env's in "
            f"initialize_state({size + 1}). Training starts n_envs envs and evaluation its "
            "own number, so the policy would act otherwise in each; keep the batch size out "
            "of the carry's values.",
            f"initialize_state({size + 1}), the first {size} envs",
            f"initialize_state({size})",
        ),
    )


def _check_rollout(case: _Case) -> None:
    # The contract checks of every call compare its inputs and outputs, next_state with
    # state included; an error naming next_state is reported as carry preservation.
    _ = case.rollout  # computing it runs the contract checks


def _check_no_writes(case: _Case) -> None:
    case.check_writes(case.rollout.writes)
    case.check_writes(case.replay.writes)
    if names := _written(case.reset[2]):
        case.check_writes([_Write("reset_state", case.ex.time_length - 1, names)])


def _check_permutation(case: _Case) -> None:
    ex, perm = case.ex, case.ex.permutation
    permuted = case.kit.run(
        ModuleProperty.PERMUTATION,
        "__call__ on the permuted batch",
        case.variables,
        _rows(case.initial, perm),
        _env_rows(ex.inputs, perm),
        None,
        ex.ends[:, perm],
    )
    case.check_writes(permuted.writes)
    case.compare(
        ModuleProperty.PERMUTATION,
        [
            _step_leaves(_rows(o, perm), batched_only=False, extras=True)
            for o in case.rollout.outputs
        ],
        [_step_leaves(o, batched_only=False, extras=True) for o in permuted.outputs],
        lambda m: (
            f"permuting the batch by {perm.tolist()} did not permute {m.leaf} the same way.",
            "in the batch as drawn",
            "in the permuted batch",
        ),
        lambda row: f"env {perm[row]} (row {row} once permuted)",
        steps=case.all_steps,
    )


def _check_batch_of_one(case: _Case) -> None:
    ex = case.ex
    # Every env, not one drawn env: a leak from earlier rows (a cumulative sum over the
    # batch) leaves the first row intact.
    scalar_losses_alone = []
    for env in range(ex.batch_size):
        rows = np.asarray([env])
        alone = case.kit.run(
            ModuleProperty.BATCH_OF_ONE,
            "__call__ on a batch of one",
            case.variables,
            _rows(case.initial, rows),
            _env_rows(ex.inputs, rows),
            None,
            ex.ends[:, rows],
        )
        case.compare(
            ModuleProperty.BATCH_OF_ONE,
            [
                _step_leaves(_rows(o, rows), batched_only=True, extras=True)
                for o in case.rollout.outputs
            ],
            [_step_leaves(o, batched_only=True, extras=True) for o in alone.outputs],
            lambda m, env=env: (
                f"env {env} run alone gives a different {m.leaf} than in the batch of "
                f"{ex.batch_size}.",
                f"env {env} in the batch of {ex.batch_size}",
                f"env {env} run alone",
            ),
            lambda row, env=env: f"env {env}",
            steps=case.all_steps,
        )
        scalar_losses_alone.append([o.regularization_loss for o in alone.outputs])
    _check_scalar_loss_is_a_mean(case, np.asarray(scalar_losses_alone, np.float64))


def _check_scalar_loss_is_a_mean(case: _Case, alone: Shaped[np.ndarray, "B T ..."]) -> None:
    """A scalar ``regularization_loss`` is per sample: the batch's is the mean of each env's
    alone. The loss averages it over samples, so a sum would grow with the minibatch."""
    batch = np.asarray([o.regularization_loss for o in case.rollout.outputs], np.float64)
    if batch.ndim != 1 or alone.ndim != 2:  # (B,) losses: compared row by row above
        return
    expected = alone.mean(axis=0)
    bad = np.flatnonzero(~np.isclose(batch, expected, rtol=case.kit.rtol, atol=case.kit.atol))
    if bad.size:
        t = int(bad[0])
        summed = np.isclose(
            batch[t], case.ex.batch_size * expected[t], rtol=case.kit.rtol, atol=case.kit.atol
        )
        why = (
            "it is their sum, which grows with the minibatch"
            if summed
            else "it depends on the other envs of the batch"
        )
        raise case.fail(
            ModuleProperty.BATCH_OF_ONE,
            f"the scalar regularization_loss of the batch of {case.ex.batch_size} is not the "
            f"mean of each env's run alone: {why}. A scalar is a per-sample value, which "
            "the loss averages over samples.",
            leaf=f"regularization_loss at step {t}",
            expected=f"{expected[t]:.6g} (the mean of the envs' own)",
            found=f"{batch[t]:.6g}" + (f" ({case.ex.batch_size} x the mean)" if summed else ""),
        )


def _check_reset_state(case: _Case) -> None:
    batched, per_env, _, given = case.reset
    _check_reset_routing(case, given)
    case.compare(
        ModuleProperty.RESET_STATE,
        [named_leaves("reset_state(state)", batched)],
        [named_leaves("reset_state(state)", per_env)],
        lambda m: (
            f"reset_state on one env's slice (under vmap) gives a different {m.leaf} than "
            "reset_state on the batch.",
            "reset_state of the batched carry",
            "reset_state vmapped over the envs",
        ),
    )


def _sorted_values(tree: Any) -> Inexact[np.ndarray, " N"]:
    """Every value of ``tree``'s leaves, sorted: equal for a carry however a container
    reshaped or reordered it."""
    leaves = [widened(as_numpy(leaf)).ravel() for leaf in jax.tree.leaves(tree)]
    return np.sort(np.concatenate(leaves)) if leaves else np.zeros(0)


def _check_reset_routing(case: _Case, given: dict[str, tuple[Any, ...]]) -> None:
    """No two modules with their own ``reset_state`` are reset each with the carry the
    other returned at the rollout's last step. The contract checks compare trees and
    shapes, so two children of one kind (two delay lines) reset crosswise pass them.
    Only a swap both ways counts: a container may keep a child's carry otherwise than
    returned (a child run every K steps, a carry restarted, reshaped or synced from
    another module's), and one carry may equal another's by chance (both still zero)."""
    name, last = case.kit.name, case.rollout.last_carried
    returned = {
        path: _sorted_values(values[0]) for path, values in last.items() if len(values) == 1
    }
    reset = {path: _sorted_values(prevs[0]) for path, prevs in given.items() if len(prevs) == 1}
    paths = [path for path in reset if path in returned]

    def alike(a: np.ndarray, b: np.ndarray) -> bool:
        return a.shape == b.shape and np.allclose(a, b, case.kit.rtol, case.kit.atol)

    for index, first in enumerate(paths):
        for second in paths[index + 1 :]:
            if alike(reset[first], returned[first]) or alike(reset[second], returned[second]):
                continue
            if alike(reset[first], returned[second]) and alike(reset[second], returned[first]):
                raise case.fail(
                    ModuleProperty.RESET_STATE,
                    f"reset_state gave {name}{first} the carry {name}{second} returned at the "
                    "rollout's last step, and the other way round: a container routed each "
                    "the other's slice of the carry.",
                    leaf=f"{name}{first}",
                    expected=f"the carry {name}{first} returned (its own slice)",
                    found=f"the values of the carry {name}{second} returned",
                )


def _check_episodes_independent(case: _Case) -> None:
    _check_inputs_before_an_end_are_forgotten(case)
    _check_reset_forgets_the_carry(case)


def _check_inputs_before_an_end_are_forgotten(case: _Case) -> None:
    ex = case.ex
    last_end = np.full(ex.batch_size, -1)
    for t in range(ex.time_length):
        last_end[ex.ends[t]] = t
    if (last_end < 0).all():
        return
    # Other inputs up to each env's last episode end, the drawn ones after it: what
    # follows a reset may depend on nothing before it.
    before_reset = np.arange(ex.time_length)[:, None] <= last_end[None, :]

    def mixed(other: Any, drawn: Any) -> Any:
        return np.where(align_leading(before_reset, drawn), other, drawn)

    other_past = case.kit.run(
        ModuleProperty.EPISODES_INDEPENDENT,
        "__call__ given other inputs before each episode's end",
        case.variables,
        case.initial,
        jax.tree.map(mixed, ex.other_inputs, ex.inputs),
        None,
        ex.ends,
    )
    for t in range(ex.time_length):
        rows = np.flatnonzero((last_end >= 0) & (last_end < t))
        if not rows.size:
            continue
        case.compare(
            ModuleProperty.EPISODES_INDEPENDENT,
            [_step_leaves(_rows(case.rollout.outputs[t], rows), batched_only=True, extras=True)],
            [_step_leaves(_rows(other_past.outputs[t], rows), batched_only=True, extras=True)],
            lambda m, rows=rows: (
                f"after env {rows[m.row or 0]}'s episode ended at step "
                f"{last_end[rows[m.row or 0]]}, {m.leaf} depends on the inputs before the "
                "end: reset_state kept part of the old episode in the carry (the default "
                "reset_state keeps it all). If the module remembers across episodes on "
                "purpose, pass episodic=False (nnx-ppo check --not-episodic).",
                "the inputs as drawn before the end",
                "other inputs before the end",
            ),
            lambda row, rows=rows: f"env {rows[row]}",
            steps=[t],
        )


def _check_reset_forgets_the_carry(case: _Case) -> None:
    """``reset_state`` of the rollout's final carry and of its initial one, given the final
    carry's keys, must agree: what the episode changed (a step count, a buffer's index)
    may not outlive its end, even where no input changed it."""
    final = case.rollout.outputs[-1].next_state
    after = f"after {case.ex.time_length} step{'s' if case.ex.time_length > 1 else ''}"
    initial = jax.tree.map(lambda start, end: end if is_key(end) else start, case.initial, final)
    with _phase(ModuleProperty.EPISODES_INDEPENDENT, "reset_state of the initial carry"):
        from_initial = host(case.kit.reset(case.variables, initial))[0]
    case.compare(
        ModuleProperty.EPISODES_INDEPENDENT,
        [named_leaves("reset_state(state)", from_initial)],
        [named_leaves("reset_state(state)", case.reset[0])],
        lambda m: (
            f"{m.leaf} keeps what the episode changed: reset_state of the carry {after} "
            "and of the initial carry (given the same keys) differ. If the module remembers "
            "across episodes on purpose, pass episodic=False (nnx-ppo check --not-episodic).",
            "reset_state of the initial carry",
            f"reset_state of the carry {after}",
        ),
    )


def _check_replay(case: _Case) -> None:
    ends = np.argwhere(case.ex.ends)
    resets = f" (episodes ending at (step, env) {[tuple(map(int, e)) for e in ends]})"
    case.compare(
        ModuleProperty.REPLAY,
        [_step_leaves(o, batched_only=False, extras=False) for o in case.rollout.outputs],
        [_step_leaves(o, batched_only=False, extras=False) for o in case.replay.outputs],
        lambda m: (
            "replaying from the rollout's initial carry with the stored rollout_extras "
            f"gives a different {m.leaf}{resets if ends.size else ''}.",
            "rollout",
            "replay",
        ),
        steps=case.all_steps,
    )


def _check_replay_subset(case: _Case) -> None:
    ex, subset = case.ex, case.ex.subset
    replay_subset = case.kit.run(
        ModuleProperty.REPLAY_SUBSET,
        "__call__ in replay of a subset of the envs",
        case.variables,
        _rows(case.initial, subset),
        _env_rows(ex.inputs, subset),
        _env_rows(case.rollout.extras(), subset),
        ex.ends[:, subset],
    )
    case.compare(
        ModuleProperty.REPLAY_SUBSET,
        [
            _step_leaves(_rows(o, subset), batched_only=True, extras=False)
            for o in case.rollout.outputs
        ],
        [_step_leaves(o, batched_only=True, extras=False) for o in replay_subset.outputs],
        lambda m: (
            f"replaying the envs {subset.tolist()} alone gives a different {m.leaf} than "
            f"the rollout of all {ex.batch_size}.",
            f"rollout of the batch of {ex.batch_size}",
            "replay of the subset",
        ),
        lambda row: f"env {subset[row]}",
        steps=case.all_steps,
    )


def _loglikelihoods(out: StatefulModuleOutput) -> list[Any]:
    """The log-likelihood leaves of a sampler's or a PPO network's output."""
    if isinstance(out.output, PPONetworkOutput):
        return jax.tree.leaves(out.output.loglikelihoods)
    nodes = jax.tree.leaves(out.output, is_leaf=is_sampled_action)
    return [node["log_likelihood"] for node in nodes if is_sampled_action(node)]


def _samples_actions(case: _Case) -> bool:
    return bool(_actions(case.rollout.outputs[0]))


def _check_stored_action(case: _Case) -> None:
    """Replay ``inputs`` fed the extras of a rollout on ``other_inputs``: its actions must
    be the other rollout's, which a sampler that samples again cannot return."""
    ex = case.ex
    other = case.kit.run(
        ModuleProperty.STORED_ACTION,
        "the rollout's __call__",
        case.variables,
        case.initial,
        ex.other_inputs,
        None,
        ex.ends,
    )
    replay = case.kit.run(
        ModuleProperty.STORED_ACTION,
        "__call__ in replay",
        case.variables,
        case.initial,
        ex.inputs,
        other.extras(),
        ex.ends,
    )
    case.compare(
        ModuleProperty.STORED_ACTION,
        [_actions(o) for o in other.outputs],
        [_actions(o) for o in replay.outputs],
        lambda m: (
            f"in replay, {m.leaf} is not the action stored in the rollout_extras it was "
            "given: the module drew a new one.",
            "the action of the rollout that stored those extras",
            "the action in replay",
        ),
        steps=case.all_steps,
    )
    _check_replay_scores_under_the_parameters(case)


def _check_replay_scores_under_the_parameters(case: _Case) -> None:
    """In replay, each log-likelihood depends on the variables or the input, and on the
    ``rollout_extras`` only through the stored action: one read back from them (stored
    at the rollout), or computed under a distribution parameter stored beside the action
    (the rollout's mean), keeps the PPO ratio at 1 or gives that parameter no gradient,
    while replay reproduces the rollout exactly.

    Traced once per ``check_module`` call, as the keys' check is: where the values flow
    is a property of the program, whatever numbers they take. The stored action's leaves
    are those of the extras that replay's actions depend on.
    """
    kit = case.kit
    if kit.replay_scoring is None:
        state = jax.tree.map(jnp.asarray, case.initial)
        stored = jax.tree.map(jnp.asarray, _at_step(case.rollout.extras(), 0))
        first_inputs = jax.tree.map(jnp.asarray, _at_step(case.ex.inputs, 0))

        def scored(
            variables: nnx.State, state: Any, x: Any, extras: Any
        ) -> tuple[list[Any], list[Any]]:
            out = kit._step(variables, state, x, extras)[0]
            return _loglikelihoods(out), [leaf for _, leaf in _actions(out)]

        what = (
            "__call__ in replay traced with the variables, the carry, the input and the "
            "extras as inputs"
        )
        with _phase(ModuleProperty.STORED_ACTION, what):
            program, shapes = jax.make_jaxpr(scored, return_shape=True)(
                case.variables, state, first_inputs, stored
            )
        # Bit 0: a variable, the carry or the input; bit 1 + i: the extras' leaf i (the
        # last inputs). The carry counts as computed: replayed from a rollout's first
        # carry, it holds what earlier steps computed under the current parameters (an
        # action delayed after its sampler scores it there).
        named_stored = named_leaves("rollout_extras", stored)
        given = len(program.jaxpr.invars) - len(named_stored)
        masks = [1] * given + [2 << i for i in range(len(named_stored))]
        outputs = _dependencies(program.jaxpr, masks)
        scores, actions = outputs[: len(shapes[0])], outputs[len(shapes[0]) :]
        beside = functools.reduce(operator.or_, scores, 0) & ~functools.reduce(
            operator.or_, actions, 1
        )
        read_beside = [name for i, (name, _) in enumerate(named_stored) if beside >> (i + 1) & 1]
        kit.replay_scoring = (all(out & 1 for out in scores), read_beside)
    scores_its_inputs, read_beside = kit.replay_scoring
    if not scores_its_inputs:
        raise case.fail(
            ModuleProperty.STORED_ACTION,
            "in replay, a log-likelihood depends on neither the parameters, the carry nor "
            "the input: it is read back from rollout_extras, so the PPO ratio stays 1 and "
            "the policy gets no gradient.",
            leaf="the output's log-likelihood",
            expected="the stored action scored under the distribution the current "
            "parameters give for the input",
            found="a log-likelihood computed from rollout_extras alone",
        )
    if read_beside:
        raise case.fail(
            ModuleProperty.STORED_ACTION,
            f"in replay, a log-likelihood depends on {read_beside[0]}, a leaf of the stored "
            "rollout_extras that is not the stored action: the action is scored under what "
            "the rollout stored (its distribution's mean, say), not under the distribution "
            "the current parameters give, and what was stored gets no gradient.",
            leaf="the output's log-likelihood",
            expected="the stored action scored under the distribution the current "
            "parameters give for the input",
            found=f"a log-likelihood computed from {', '.join(read_beside[:3])}, which replay's "
            "actions do not depend on",
        )


def _check_statistics(case: _Case) -> None:
    # The contract checks of update_statistics see every module that keeps statistics
    # and the tree, shapes and dtypes of what each was given; the values are compared
    # here: two children emitting the same shapes could be given each other's.
    emitted = case.rollout.emitted
    every_step = [
        p for p in emitted[0] if all(len(e.get(p, ())) == len(emitted[0][p]) for e in emitted)
    ]
    _, given, _ = case.folded
    for path in every_step:  # in the order of the calls
        _check_samples_folded(case, path, given.get(path))


def _sort_key(leaf: Shaped[np.ndarray, "N ..."], atol: float) -> Float[np.ndarray, "N K"]:
    """Columns that order ``leaf``'s rows alike for values equal within the kit's
    tolerances: floats as exponent and a 10-bit mantissa (and 0 below ``atol``), so a
    last-place difference from a container's arithmetic does not reorder near ties."""
    values = widened(leaf.reshape(len(leaf), math.prod(leaf.shape[1:])))
    if not np.issubdtype(leaf.dtype, np.inexact):
        return values
    if np.iscomplexobj(values):  # ordered on both parts, as the comparison checks both
        values = np.concatenate([np.real(values), np.imag(values)], axis=1)
    mantissa, exponent = np.frexp(np.where(np.abs(values) < atol, 0.0, values))
    return np.concatenate([exponent, np.round(mantissa * 1024)], axis=1)


def _sorted_samples(
    name: str, histories: Sequence[Any], leading: int, atol: float
) -> list[tuple[str, Any]]:
    """Every sample of ``histories`` (leaves ``(*leading axes, *feat)``), per named leaf,
    the samples in one order for all leaves (sorted on :func:`_sort_key`): the multiset
    of samples, whatever their order and however they were split into calls."""
    calls = [named_leaves(name, history) for history in histories]
    names = [leaf_name for leaf_name, _ in calls[0]]

    def rows(leaf: Any) -> Shaped[np.ndarray, "N ..."]:
        data = as_numpy(leaf)  # a key as its raw data: one more trailing axis
        return data.reshape((math.prod(data.shape[:leading]), *data.shape[leading:]))

    leaves = [
        np.concatenate([rows(call[index][1]) for call in calls]) for index in range(len(names))
    ]
    if not leaves:
        return []
    keys = np.concatenate([_sort_key(leaf, atol) for leaf in leaves], axis=1)
    order = np.lexsort(keys.T[::-1]) if keys.shape[1] else np.arange(len(keys))
    return [(leaf_name, leaf[order]) for leaf_name, leaf in zip(names, leaves, strict=True)]


def _check_samples_folded(case: _Case, path: str, given: tuple[Any, ...] | None) -> None:
    """The module at ``path`` is given every sample it emitted in the rollout, each once:
    in one call or several (one per input of a module applied to two, one per entity of
    a child on entities folded into the batch), in any order (the statistics property
    makes the order free). Compared as multisets of samples, each sample's leaves
    together."""
    module = f"{case.kit.name}{path}"
    calls = [step[path] for step in case.rollout.emitted]
    if not given or any(value is None for step in calls for value in step):
        return  # reached only inside a transform, or nothing emitted
    name, atol = f"{module} history", case.kit.atol
    emitted = _sorted_samples(name, [value for step in calls for value in step], 1, atol)
    folded = _sorted_samples(name, given, 2, atol)
    emitted_count = len(emitted[0][1]) if emitted else 0
    folded_count = len(folded[0][1]) if folded else 0
    if emitted_count != folded_count:
        raise case.fail(
            ModuleProperty.STATISTICS,
            f"update_statistics gave {module} {folded_count} samples where it emitted "
            f"{emitted_count}: a container folded in some of its history twice, left some "
            "out, or routed it another module's.",
            leaf=name,
            expected=f"samples: {emitted_count} (calls a step: {len(calls[0])}, "
            f"T={case.ex.time_length}, B={case.ex.batch_size})",
            found=f"samples: {folded_count}, in update_statistics calls: {len(given)}",
        )
    case.compare(
        ModuleProperty.STATISTICS,
        [emitted],
        [folded],
        lambda m: (
            f"update_statistics gave {module} samples that are not the ones it emitted: a "
            "container routed it another module's rollout_extras, folded in some of its "
            "history twice, or mixed the leaves of its samples.",
            f"what {module} emitted in the rollout, its samples sorted",
            "the samples it was given, sorted",
        ),
        lambda row: f"sorted sample {row}",
    )


def _check_statistics_order(case: _Case) -> None:
    """Fold the history's ``T * B`` samples shuffled, as one step of ``T * B`` envs."""
    ex, name = case.ex, case.kit.name
    samples = ex.batch_size * ex.time_length
    order = np.random.default_rng(samples).permutation(samples)
    if order[-1] == samples - 1:  # e.g. the identity at 2 samples: the last one must move
        order = np.roll(order, 1)

    def as_one_batch(leaf: History) -> Shaped[Any, "1 TB ..."]:
        return leaf.reshape((samples, *leaf.shape[2:]))[order][None]

    with _phase(ModuleProperty.STATISTICS, "update_statistics"):
        one_batch, _, _ = host(
            case.kit.fold(case.variables, jax.tree.map(as_one_batch, case.rollout.extras()))
        )
    case.compare(
        ModuleProperty.STATISTICS_ORDER,
        [[(f"{name}.{leaf}", value) for leaf, value in case.statistics.items()]],
        [[(f"{name}.{leaf}", value) for leaf, value in one_batch.items()]],
        lambda m: (
            f"update_statistics gives a different {m.leaf} when the same T * B = {samples} "
            f"samples come in another order, as one step of {samples} envs.",
            f"after the rollout's history, T={ex.time_length} steps of B={ex.batch_size} envs",
            f"after the same samples shuffled, T=1 step of B={samples} envs",
        ),
        lambda row: f"entry {row}",
    )


def _check_statistics_not_trained(case: _Case) -> None:
    before = _variable_values(case.variables)
    for leaf, (path, variable) in case.kit.trainable.items():
        if np.array_equal(as_numpy(before[leaf]), case.statistics[leaf], equal_nan=True):
            continue
        module = ".".join(part for part in (case.kit.name, path) if part)
        raise case.fail(
            ModuleProperty.STATISTICS_NOT_TRAINED,
            f"update_statistics wrote {module}.{variable}, an nnx.Param: the optimizer "
            "trains every nnx.Param, so gradient steps would move this statistic too.",
            leaf=f"{case.kit.name}.{leaf}",
            expected=f"the statistic {variable} of {module} held in an nnx.BatchStat "
            "(or another nnx.Variable type that is not an nnx.Param)",
            found=f"{module}.{variable} is an nnx.Param, written by update_statistics",
        )


def _check_eager_compiled(case: _Case) -> None:
    """Run eagerly, on the caller's module, the first env alone: ``initialize_state(1)``,
    its last step in rollout and in replay, its ``reset_state``, and
    ``update_statistics`` of its first step; compare with the compiled calls.

    One env and one step, since batch-of-one agreement and the statistics
    properties already tie them to the batch and the rollout: eager execution
    compiles every operation for every new shape, and one shape keeps that to one
    compile per operation. The contract checks ran on the compiled calls; the
    eager ones run without them.
    """
    ex, last, first = case.ex, case.ex.time_length - 1, np.asarray([0])
    history = jax.tree.map(lambda leaf: leaf[:1], _env_rows(case.rollout.extras(), first))
    # Eager calls take JAX arrays, as the library gives them.
    x, stored, states, final, history = jax.tree.map(
        jnp.asarray,
        (
            _rows(_at_step(ex.inputs, last), first),
            _rows(_at_step(case.rollout.extras(), last), first),
            _rows((case.rollout.states[last], case.replay.states[last]), first),
            _rows(case.rollout.outputs[-1].next_state, first),
            history,
        ),
    )
    with _phase(ModuleProperty.EAGER_COMPILED, "initialize_state(1)"):
        compiled_initial, _ = host(case.kit.initialize(case.kit.variables, 1))
        compiled_statistics, _, _ = host(case.kit.fold(case.variables, history))
    with (
        checks(False),
        _phase(ModuleProperty.EAGER_COMPILED, "initialize_state(1) run eagerly"),
        case.kit.eager(case.kit.variables) as module,
    ):
        initial = host(module.initialize_state(1))
    with (
        checks(False),
        _phase(ModuleProperty.EAGER_COMPILED, "a call run eagerly"),
        case.kit.eager(case.variables) as module,
    ):
        rollout = host(module(states[0], x, None))
        replay = host(module(states[1], x, stored))
        reset = host(module.reset_state(final))
        module.update_statistics(history)
        statistics = host(_variable_values(nnx.state(module, _FORWARD_STATE)))

    def env_0(out: StatefulModuleOutput, extras: bool) -> list[tuple[str, Any]]:
        return _step_leaves(_rows(out, first), batched_only=True, extras=extras)

    def variables(values: dict[str, Any]) -> list[tuple[str, Any]]:
        return [(f"{case.kit.name}.{leaf}", value) for leaf, value in sorted(values.items())]

    results = [
        (
            "initialize_state(1)",
            named_leaves("state", compiled_initial),
            named_leaves("state", initial),
        ),
        (
            "__call__",
            env_0(case.rollout.outputs[last], True),
            _step_leaves(rollout, batched_only=True, extras=True),
        ),
        (
            "__call__ in replay",
            env_0(case.replay.outputs[last], False),
            _step_leaves(replay, batched_only=True, extras=False),
        ),
        (
            "reset_state",
            named_leaves("reset_state(state)", _rows(case.reset[0], first)),
            named_leaves("reset_state(state)", reset),
        ),
        ("update_statistics", variables(compiled_statistics), variables(statistics)),
    ]
    for what, compiled, eager in results:
        case.compare(
            ModuleProperty.EAGER_COMPILED,
            [compiled],
            [eager],
            lambda m, what=what: (
                f"{what} run eagerly gives a different {m.leaf} than compiled with jax.jit.",
                "compiled",
                "eager",
            ),
            lambda row: "env 0",
            steps=[last] if what.startswith("__call__") else None,
        )


def _check_keys(case: _Case) -> None:
    """Each key leaf of the carry is a per-step key, split at every step, or a per-episode
    one, kept within an episode and replaced by ``reset_state``; ``stochastic`` says
    which kind the module needs at least one of (a per-episode latent before a sampler
    holds both). A key split at every step that ``reset_state`` draws from (the episode's
    latent) counts as a draw once per episode too."""
    kit = case.kit
    carry = named_leaves("state", case.initial)
    keys = [name for name, leaf in carry if is_key(leaf)]
    if not keys:
        raise case.fail(
            ModuleProperty.PER_ENV_KEYS,
            f"stochastic={kit.stochastic!r}, but the carry holds no typed PRNG keys.",
            leaf="state",
            expected="a (B,) leaf of typed keys, e.g. from nnx_ppo.networks.utils.new_env_keys",
            found="leaves " + ", ".join(f"{name} {leaf.dtype}" for name, leaf in carry)
            if carry
            else "an empty carry",
        )
    _check_reset_draws_from_given_keys(case, keys)
    _check_keys_distinct(case, keys)
    stuck, kept = _steps_keeping_keys(case, keys), _resets_keeping_keys(case, keys)
    per_step = [name for name in keys if name not in stuck]
    # A key some step kept is a per-episode one once reset_state is found to replace it.
    per_episode = [name for name in keys if name in stuck]
    for name in per_episode:
        if name in kept:
            t, env = stuck[name]
            # Named where the setting expects the key to change.
            leaf = (
                f"next_state{name.removeprefix('state')} at step {t}, env {env}"
                if kit.stochastic is True
                else f"{name} after reset_state, env {kept[name]}"
            )
            raise case.fail(
                ModuleProperty.PER_ENV_KEYS,
                f"the key in {name} changes neither from one step to the next nor at "
                "reset_state: every step and every episode of an env would draw the same "
                "random numbers.",
                leaf=leaf,
                expected="the key split at every step in __call__ (split_env_keys), or, for "
                "a draw once per episode, split in reset_state",
                found=f"the key step {t} was given (env {env}), which reset_state kept too "
                f"(env {kept[name]})",
            )
    if kit.stochastic is True and not per_step:
        name = per_episode[0]
        t, env = stuck[name]
        raise case.fail(
            ModuleProperty.PER_ENV_KEYS,
            f"stochastic=True, but no key in the carry changes from one step to the next: "
            f"the key in {name} does not, so every step draws from the same key (a key "
            "folded with a step count inside the call does not count: the carry's keys are "
            "split at every step; a module that draws once per episode says so with "
            "stochastic='per_episode').",
            leaf=f"next_state{name.removeprefix('state')} at step {t}, env {env}",
            expected="next_state's keys split from state's (split_env_keys)",
            found="the key the step was given",
        )
    if kit.stochastic == "per_episode" and len(kept) == len(keys):
        name = keys[0]
        raise case.fail(
            ModuleProperty.PER_ENV_KEYS,
            f"stochastic='per_episode', but reset_state replaces no key in the carry: it "
            f"kept the key in {name}, which changes at every step instead. A module that "
            "draws at every step says so with stochastic=True; one that draws once per "
            "episode replaces its keys in reset_state.",
            leaf=f"{name} after reset_state, env {kept[name]}",
            expected="reset_state's keys split from the ones it was given (split_env_keys)",
            found="the key reset_state was given",
        )
    if kit.stochastic == "per_episode" and not per_episode:
        _check_some_draw_once_per_episode(case, per_step)
    if per_episode:
        _check_episode_keys_drawn_from(case, per_episode)
    if kit.stochastic is True:
        _check_step_draws_from_given_keys(case, per_step)


def _check_keys_distinct(case: _Case, names: list[str]) -> None:
    """Every carry of the rollout (the initial one, and those after episode ends) holds a
    distinct key per env in each key leaf."""
    for t, state in enumerate(case.rollout.states):
        given = dict(named_leaves("state", state))
        for name in names:
            data = as_numpy(given[name]).reshape(case.ex.batch_size, -1)
            first_row = {row.tobytes(): env for env, row in reversed(list(enumerate(data)))}
            for env, row in enumerate(data):
                if first_row[row.tobytes()] != env:
                    raise case.fail(
                        ModuleProperty.PER_ENV_KEYS,
                        f"envs share a key in {name}: they would draw the same random numbers.",
                        leaf=f"{name} at step {t}, env {env}",
                        expected="a distinct key per env, from initialize_state and from "
                        "reset_state after an episode ends",
                        found=f"env {env} holds the key of env {first_row[row.tobytes()]}",
                    )


def _steps_keeping_keys(case: _Case, names: list[str]) -> dict[str, tuple[int, int]]:
    """For each key leaf that some step handed on unchanged, the first such step and env."""
    stuck: dict[str, tuple[int, int]] = {}
    for t, (state, out) in enumerate(zip(case.rollout.states, case.rollout.outputs, strict=True)):
        given = dict(named_leaves("state", state))
        advanced = dict(named_leaves("state", out.next_state))
        for name in names:
            data = as_numpy(given[name]).reshape(case.ex.batch_size, -1)
            unchanged = (as_numpy(advanced[name]).reshape(data.shape) == data).all(axis=1)
            same = np.flatnonzero(unchanged)
            if same.size and name not in stuck:
                stuck[name] = (t, int(same[0]))
    return stuck


def _resets_keeping_keys(case: _Case, names: list[str]) -> dict[str, int]:
    """For each key leaf that ``reset_state`` of the rollout's final carry kept in some env,
    the first such env."""
    final = dict(named_leaves("state", case.rollout.outputs[-1].next_state))
    reset = dict(named_leaves("state", case.reset[0]))
    kept: dict[str, int] = {}
    for name in names:
        data = as_numpy(final[name]).reshape(case.ex.batch_size, -1)
        same = np.flatnonzero((as_numpy(reset[name]).reshape(data.shape) == data).all(axis=1))
        if same.size:
            kept[name] = int(same[0])
    return kept


def _other_keys(keys: Key[Array, "B ..."], data: int) -> Key[Array, "B ..."]:
    """Other valid keys of the same kind, one per key given: each folded with ``data``."""
    folded = jax.vmap(lambda key: jax.random.fold_in(key, data))(keys.reshape(-1))
    return folded.reshape(keys.shape)


def _check_reset_draws_from_given_keys(case: _Case, names: list[str]) -> None:
    """``reset_state`` of the rollout's final carry, once as it is and once with other keys:
    a key leaf that comes out the same for a row both times was drawn from something
    other than the keys given (a fixed key), and every episode would repeat its draws."""
    final = case.rollout.outputs[-1].next_state
    other_keys = jax.tree.map(lambda leaf: _other_keys(leaf, 1) if is_key(leaf) else leaf, final)
    with _phase(ModuleProperty.PER_ENV_KEYS, "reset_state of the final carry with other keys"):
        from_other = dict(
            named_leaves("state", host(case.kit.reset(case.variables, other_keys))[0])
        )
    reset = dict(named_leaves("state", case.reset[0]))
    for name in names:
        given = as_numpy(reset[name]).reshape(case.ex.batch_size, -1)
        same = np.flatnonzero(
            (given == as_numpy(from_other[name]).reshape(given.shape)).all(axis=1)
        )
        if same.size:
            raise case.fail(
                ModuleProperty.PER_ENV_KEYS,
                f"reset_state gave the same key in {name} whatever keys it was given: it "
                "draws them from a fixed key, so every episode of an env would draw the "
                "same random numbers.",
                leaf=f"{name} after reset_state, env {same[0]}",
                expected="reset_state's keys split from the ones it was given (split_env_keys)",
                found="the same keys from two carries that differ in their keys only",
            )


def _key_readers(case: _Case, method: str) -> dict[str, bool]:
    """For each key leaf of the carry, whether some leaf other than a key of what
    ``method`` (``"__call__"`` or ``"reset_state"``) returns depends on it.

    Traced once per ``check_module`` call and method, not run: where the keys flow is a
    property of the program, so a module drawing from a fixed key (``jax.random.key(0)``)
    while it splits its carry's keys is found whatever numbers the draws give (a
    categorical sampler draws the same action from two keys often).
    """
    kit = case.kit
    if method not in kit.key_readers:
        # As arrays, as the compiled calls get them: the module's annotations refuse NumPy.
        carry = jax.tree.map(jnp.asarray, case.initial)
        leaves, treedef = jax.tree.flatten(carry)
        names = [name for name, _ in named_leaves("state", carry)]
        at = [i for i, leaf in enumerate(leaves) if is_key(leaf)]
        first_inputs = jax.tree.map(jnp.asarray, _at_step(case.ex.inputs, 0))

        def returned(variables: nnx.State, *keys: Any) -> list[Any]:
            given = list(leaves)
            for i, key in zip(at, keys, strict=True):
                given[i] = key
            state = jax.tree.unflatten(treedef, given)
            if method == "reset_state":
                drawn = kit._reset(variables, state)[0]
            else:
                out = kit._step(variables, state, first_inputs, None)[0]
                drawn = (out.output, out.next_state, out.rollout_extras)
            return [leaf for leaf in jax.tree.leaves(drawn) if not is_key(leaf)]

        what = f"{method} traced with the carry's keys as inputs"
        with _phase(ModuleProperty.PER_ENV_KEYS, what):
            program = jax.make_jaxpr(returned)(case.variables, *(leaves[i] for i in at))
        # The variables (the first inputs, an argument as in the compiled calls: an NNX
        # transform inside refuses variables closed over from outside) are marked by no bit.
        keys = [1 << bit for bit in range(len(at))]
        given = len(program.jaxpr.invars) - len(keys)
        outputs = _dependencies(program.jaxpr, [0] * given + keys)
        read = functools.reduce(operator.or_, outputs, 0)
        kit.key_readers[method] = {names[i]: bool(read >> bit & 1) for bit, i in enumerate(at)}
    return kit.key_readers[method]


def _check_step_draws_from_given_keys(case: _Case, per_step: list[str]) -> None:
    """``stochastic=True``: the step's outputs, other than its keys, depend on the keys it
    splits at every step."""
    readers = _key_readers(case, "__call__")
    if not any(readers[name] for name in per_step):
        raise case.fail(
            ModuleProperty.PER_ENV_KEYS,
            "stochastic=True, but no output of __call__ depends on the keys in the carry "
            "that it splits at every step (other than the next keys): its random numbers "
            "come from elsewhere, a fixed key or an nnx.Rngs, and would be the same for "
            "every env or every step.",
            leaf="state",
            expected="output, next_state or rollout_extras drawn from the carry's keys "
            "(split_env_keys, then jax.random.* on each env's key)",
            found="the carry's keys only split into next_state's",
        )


_OTHER_KEYS_TRIED = 3
"""How many other keys one per-step key leaf gets: a draw from few values (a sampler's
action among two) may come out the same from one other key by chance."""


def _check_some_draw_once_per_episode(case: _Case, per_step: list[str]) -> None:
    """``stochastic='per_episode'`` with every key split at every step: some key is drawn
    from by ``reset_state`` (a latent drawn at reset from a key that also advances), or
    some key leaf acts once per episode: other keys in it change the call's results at an
    episode's first step (from ``reset_state`` of the rollout's final carry) but not a
    step into the episode (from the final carry itself, which has taken a step since
    every env's last reset). A draw made at an episode's first step and kept passes, a
    sampler's per-step leaf beside it too; draws that change from step to step within an
    episode, and nothing drawn once per episode, fail."""
    if any(_key_readers(case, "reset_state")[name] for name in per_step):
        return
    last = case.ex.time_length - 1
    final = case.rollout.outputs[-1].next_state
    leaves, treedef = jax.tree.flatten(final)
    with _phase(ModuleProperty.PER_ENV_KEYS, "reset_state of the final carry"):
        fresh = jax.tree.leaves(case.kit.reset(case.variables, final)[0])
    names = [name for name, _ in named_leaves("state", final)]
    x = _at_step(case.ex.inputs, last)

    def results(given: list[Any]) -> list[tuple[str, Any]]:
        what = "__call__ with other keys in its carry"
        with _phase(ModuleProperty.PER_ENV_KEYS, what):
            out = host(
                case.kit.step(case.variables, jax.tree.unflatten(treedef, given), x, None)[0]
            )
        return [
            (name, leaf)
            for name, leaf in _step_leaves(out, batched_only=False, extras=True)
            if not is_key(leaf)
        ]

    def first_change(carry: list[Any], as_given: list[tuple[str, Any]], name: str) -> Any:
        """The first of ``as_given`` (the results of ``carry``) that other keys in the leaf
        ``name`` change, or ``None``."""
        at = names.index(name)
        for data in range(1, _OTHER_KEYS_TRIED + 1):
            given = list(carry)
            given[at] = _other_keys(carry[at], data)
            mismatch = _first_mismatch(as_given, results(given), case.kit.rtol, case.kit.atol)
            if mismatch is not None:
                return mismatch
        return None

    final_results = results(leaves)
    step_in = {name: first_change(leaves, final_results, name) for name in per_step}
    changing = [(name, mismatch) for name, mismatch in step_in.items() if mismatch is not None]
    if not changing:
        return
    fresh_results = results(fresh)
    if any(
        step_in[name] is None and first_change(fresh, fresh_results, name) is not None
        for name in per_step
    ):
        return
    name, mismatch = changing[0]
    env = "" if mismatch.row is None else f", env {mismatch.row}"
    raise case.fail(
        ModuleProperty.PER_ENV_KEYS,
        f"stochastic='per_episode', but the key in {name} changes at every step within an "
        "episode, not only at reset_state, and __call__ draws from it: its draws change "
        "from step to step within an episode, and no key is drawn from once per episode. "
        "A module that draws at every step says so with stochastic=True; one that draws "
        "once per episode keeps its key through the episode and replaces it in "
        "reset_state, or keeps what it drew at the episode's first step.",
        leaf=f"next_state{name.removeprefix('state')} at step {last}{env}",
        expected=f"{mismatch.leaf} = {mismatch.expected}, from the keys step {last} handed "
        "on or any others (a step into an episode, nothing new is drawn)",
        found=f"{mismatch.leaf} = {mismatch.found}, from other keys in {name}"
        + (f"; {mismatch.gap}" if mismatch.gap else ""),
    )


def _check_episode_keys_drawn_from(case: _Case, per_episode: list[str]) -> None:
    """A key kept within an episode and replaced by ``reset_state`` is drawn from: by
    ``reset_state`` (the episode's noise, a latent) or by ``__call__``. Else a new
    episode's keys change and nothing else does: a ``reset_state`` that splits the keys
    but keeps the noise drawn from the old ones repeats the first episode's noise."""
    at_reset, in_step = _key_readers(case, "reset_state"), _key_readers(case, "__call__")
    for name in per_episode:
        if not (at_reset[name] or in_step[name]):
            raise case.fail(
                ModuleProperty.PER_ENV_KEYS,
                f"reset_state replaces the key in {name}, which stays the same within an "
                "episode, but nothing is drawn from it: no leaf of reset_state's carry other "
                "than keys, and no output of __call__, depends on it, so every episode of "
                "an env would repeat the draws of the one before.",
                leaf=name,
                expected="the episode's draws (noise, a latent) computed from the keys, in "
                "reset_state or in __call__",
                found="the keys split, every other leaf computed without them (the draws "
                "of the old keys kept)",
            )


def _dependencies(program: jex.core.Jaxpr, inputs: Sequence[int]) -> list[int]:
    """Which inputs each output of ``program`` depends on, as bit masks: ``inputs`` holds
    one mask per input of ``program`` (the bits of the caller's inputs it carries), the
    result one per output.

    Inner programs are followed: those of a ``cond`` (its branches joined, each output
    depending on the branch index too), a ``while`` and a ``scan`` (their carries joined
    to a fixed point), and of any other primitive holding one program whose inputs and
    outputs are its own (``jit``, ``jax.checkpoint``, custom derivatives, closed calls).
    A primitive holding programs in any other way is taken to make each output depend on
    each input, which can only say "depends" too often, never too rarely.
    """
    depends: dict[Any, int] = dict(zip(program.invars, inputs, strict=True))

    def mask(var: Any) -> int:
        return depends.get(var, 0) if isinstance(var, jex.core.Var) else 0

    for eqn in program.eqns:
        given = [mask(var) for var in eqn.invars]
        if any(given):
            outs = _eqn_dependencies(eqn, given)
            depends.update((var, out) for var, out in zip(eqn.outvars, outs, strict=True) if out)
    return [mask(var) for var in program.outvars]


def _inner(program: Any) -> jex.core.Jaxpr:
    """The program of a ``ClosedJaxpr`` (whose constants depend on no input) or a ``Jaxpr``."""
    return program.jaxpr if isinstance(program, jex.core.ClosedJaxpr) else program


def _eqn_dependencies(eqn: jex.core.JaxprEqn, given: list[int]) -> list[int]:
    """:func:`_dependencies` of one equation's outputs, given its inputs' masks."""
    name, params = eqn.primitive.name, eqn.params
    if name == "cond":  # inputs: the branch index, then each branch's operands
        index, operands = given[0], given[1:]
        joined = [0] * len(eqn.outvars)
        for branch in params["branches"]:
            outs = _dependencies(_inner(branch), operands)
            joined = [a | b for a, b in zip(joined, outs, strict=True)]
        return [out | index for out in joined]
    if name == "while":  # inputs: cond's constants, body's constants, the carry
        cond_consts = given[: params["cond_nconsts"]]
        body_end = params["cond_nconsts"] + params["body_nconsts"]
        body_consts, carry = given[params["cond_nconsts"] : body_end], given[body_end:]
        while True:
            body = _dependencies(_inner(params["body_jaxpr"]), [*body_consts, *carry])
            joined = [a | b for a, b in zip(carry, body, strict=True)]
            if joined == carry:
                break
            carry = joined
        # How often the body runs decides every carry.
        (trips,) = _dependencies(_inner(params["cond_jaxpr"]), [*cond_consts, *carry])
        return [out | trips for out in carry]
    if name == "scan":  # inputs: constants, the carry, the scanned slices; outputs: carry, ys
        consts, count = given[: params["num_consts"]], params["num_carry"]
        carry = given[params["num_consts"] : params["num_consts"] + count]
        xs = given[params["num_consts"] + count :]
        while True:
            outs = _dependencies(_inner(params["jaxpr"]), [*consts, *carry, *xs])
            joined = [a | b for a, b in zip(carry, outs[:count], strict=True)]
            if joined == carry:
                # Run at least once, the body's last carry is the result, not the first.
                return [*(carry if params["length"] == 0 else outs[:count]), *outs[count:]]
            carry = joined
    programs = [
        _inner(value)
        for value in params.values()
        if isinstance(value, jex.core.Jaxpr | jex.core.ClosedJaxpr)
    ]
    if (
        len(programs) == 1
        and len(programs[0].invars) == len(given)
        and len(programs[0].outvars) == len(eqn.outvars)
    ):
        return _dependencies(programs[0], given)
    everything = functools.reduce(operator.or_, given)
    return [everything] * len(eqn.outvars)


_PURITY = (
    "the forward path is per-sample pure: row i of every output depends only on row i of "
    "state, x and rollout_extras, and on the parameters"
)

MODULE_PROPERTIES: tuple[PropertyCheck[_Case], ...] = (
    PropertyCheck(
        ModuleProperty.INITIALIZE_STATE,
        "initialize_state(batch_size) returns a carry whose every leaf leads with batch_size, "
        "and each env's start does not depend on batch_size",
        "``initialize_state(B)`` passes the contract checks, its first env's carry equals "
        "``initialize_state(1)``'s and every env's that of the same env in "
        "``initialize_state(B + 1)``, leaves drawn from the module's ``nnx.Rngs`` aside",
        _check_initialize_state,
    ),
    PropertyCheck(
        ModuleProperty.CHECKED_CALL,
        "every call of a rollout passes the contract checks: one B binds every leaf of its "
        "inputs and outputs",
        "a rollout of ``T`` compiled calls, with ``reset_state`` of the envs whose episode "
        "ends (drawn at random), passes the contract checks",
        _check_rollout,
    ),
    PropertyCheck(
        ModuleProperty.CARRY_PRESERVATION,
        "next_state has exactly the tree, shapes and dtypes of state: it is a scan carry",
        "every ``next_state`` of the rollout keeps the carry's tree, shapes and dtypes",
        _check_rollout,
    ),
    PropertyCheck(
        ModuleProperty.NO_WRITES,
        "__call__ and reset_state never write an NNX variable: running statistics change "
        "only in update_statistics, and randomness comes from per-env keys in the carry",
        "``nnx.state`` before and after every ``__call__`` (in rollout and in replay) and "
        "every ``reset_state``",
        _check_no_writes,
    ),
    PropertyCheck(
        ModuleProperty.PERMUTATION,
        _PURITY,
        "permuting the carry's, the inputs' and the episode ends' rows permutes every "
        "output, next state, metric and emitted extra alike",
        _check_permutation,
    ),
    PropertyCheck(
        ModuleProperty.BATCH_OF_ONE,
        _PURITY,
        "every env run alone gives its row of the batch, and a scalar "
        "``regularization_loss`` of the batch is the mean of the envs' own",
        _check_batch_of_one,
    ),
    PropertyCheck(
        ModuleProperty.RESET_STATE,
        "reset_state returns the carry's tree, shapes and dtypes, on a batched carry and, "
        "under vmap, on one env's slice, and resets each env on its own; containers route "
        "each child its own carry",
        "``reset_state`` of the rollout's final carry, batched and ``nnx.vmap``-ed over "
        "each env's slice, gives the same carry; no two modules below with their own "
        "``reset_state`` are reset each with the carry the other returned",
        _check_reset_state,
    ),
    PropertyCheck(
        ModuleProperty.EPISODES_INDEPENDENT,
        "an episode's end forgets the episode: after reset_state, nothing depends on the "
        "inputs before the end",
        "``reset_state`` of the rollout's final carry and of its initial carry (given the "
        "final carry's keys) agree; where an env's episode ends, a rollout given other "
        "inputs up to the end gives the same outputs, carries, metrics and extras after it",
        _check_episodes_independent,
        Condition("``episodic=True`` (the default)", lambda case: case.kit.episodic),
    ),
    PropertyCheck(
        ModuleProperty.REPLAY,
        "loss replay from the rollout's initial carry, fed the stored rollout_extras and "
        "resetting the carry where episodes ended, reproduces the rollout",
        "replay from the initial carry with the stored ``rollout_extras`` and the same "
        "episode ends reproduces the rollout's outputs, carries, losses and metrics",
        _check_replay,
    ),
    PropertyCheck(
        ModuleProperty.REPLAY_SUBSET,
        "loss replay of any subset of the envs (a minibatch) reproduces those envs' rows "
        "of the rollout",
        "so does replaying a subset of the envs (a minibatch)",
        _check_replay_subset,
    ),
    PropertyCheck(
        ModuleProperty.STORED_ACTION,
        "in loss replay a sampler scores the stored action it is given back in "
        "rollout_extras, never a fresh sample, under the distribution the current "
        "parameters give",
        "replay fed the extras of a rollout on *other* inputs returns that rollout's "
        "actions, and in its program each log-likelihood is computed from the variables "
        "or the input (not read back from the extras), and from the extras only through "
        "the leaves replay's actions are taken from",
        _check_stored_action,
        Condition(
            "the output holds sampled actions (an action sampler, a ``PPOAdapter``)",
            _samples_actions,
        ),
    ),
    PropertyCheck(
        ModuleProperty.STATISTICS,
        "update_statistics receives (T, B, *feat) histories, and containers route it to "
        "every module that keeps statistics",
        "``update_statistics`` of the rollout's ``(T, B, *feat)`` history passes the "
        "contract checks, which include that every module holding statistics was reached; "
        "each of them is given every sample it emitted in the rollout, each once, in one "
        "call or several and in any order",
        _check_statistics,
    ),
    PropertyCheck(
        ModuleProperty.STATISTICS_ORDER,
        "a module that aggregates folds T into B and treats the result as one batch: its "
        "statistics are those of the T * B samples, whatever their order and whichever of "
        "them came at the same step",
        "the history's ``T * B`` samples, shuffled and folded as one step of ``T * B`` envs, "
        "change no statistic",
        _check_statistics_order,
    ),
    PropertyCheck(
        ModuleProperty.STATISTICS_NOT_TRAINED,
        "statistics live in nnx.BatchStat (or another non-Param nnx.Variable type): the "
        "optimizer trains every nnx.Param, update_statistics alone moves statistics",
        "``update_statistics`` writes no ``nnx.Param``",
        _check_statistics_not_trained,
    ),
    PropertyCheck(
        ModuleProperty.EAGER_COMPILED,
        "outputs are the same eagerly and compiled: nothing depends on Python side effects "
        "or global state (under jit they run once, while tracing), on how NNX sorts a "
        "module's attributes (the order of a container's children), or on dtypes "
        "(compared as JAX holds them: a NumPy float64 as float32)",
        "the first env alone, run eagerly on your module: ``initialize_state(1)``, its "
        "last step in the rollout and in the replay, its ``reset_state``, and "
        "``update_statistics`` of its first step, give what the compiled calls gave",
        _check_eager_compiled,
    ),
    PropertyCheck(
        ModuleProperty.PER_ENV_KEYS,
        "randomness in the forward path comes from per-env keys in the carry: one distinct "
        "typed key per env, each split every step or, for a draw once per episode, "
        "replaced at every reset and drawn from; reset to distinct keys",
        "the carry holds typed PRNG keys, a distinct one per env at every step (after "
        "episode ends too); each key leaf is split by every call, or else replaced by "
        "``reset_state`` and, in the program of ``reset_state`` or of the call, some "
        "other leaf is computed from it; with ``True`` some leaf is split by every call "
        "and, in the call's program, some other output is computed from those leaves; "
        "with ``'per_episode'`` ``reset_state`` replaces some leaf and, unless some leaf "
        "is kept by every call or drawn from by ``reset_state``, some key leaf acts once "
        "per episode: other keys in it change the call's results at an episode's first "
        "step but not a step into it (else its draws change within an episode); and "
        "``reset_state`` derives its keys from the ones it is given",
        _check_keys,
        Condition("``stochastic`` is set", lambda case: bool(case.kit.stochastic)),
    ),
)
"""The properties :func:`check_module` checks, in the order it checks them."""

_RULES: dict[str, str] = {row.property: row.rule for row in MODULE_PROPERTIES}


# ------------------------------------------------------------------------- the entry


def _build(
    module_factory_or_module: StatefulModule | Callable[[], StatefulModule],
) -> StatefulModule:
    __tracebackhide__ = True
    module = module_factory_or_module
    # A Flax module is callable too, but not a factory: it is named below, not called.
    if not isinstance(module, StatefulModule | nnx.Module) and callable(module):
        module = module()
    if not isinstance(module, StatefulModule):
        raise TypeError(
            "check_module needs a StatefulModule or a function of no arguments that builds "
            f"one, got {type(module).__name__}{stateless_hint(module)}"
        )
    return module


def _input_spec(example_input: Any) -> PyTree[jax.ShapeDtypeStruct]:
    __tracebackhide__ = True
    flat, _ = jax.tree_util.tree_flatten_with_path(example_input)
    if not flat:
        raise ValueError("check_module: example_input has no array leaves")
    for path, leaf in flat:
        if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
            raise TypeError(
                f"check_module: example_input{jax.tree_util.keystr(path)} is a "
                f"{type(leaf).__name__}; give one sample's input as arrays or "
                "jax.ShapeDtypeStruct leaves, without a batch axis"
            )
        if not _can_draw(leaf.dtype):
            raise TypeError(
                f"check_module: example_input{jax.tree_util.keystr(path)} has dtype "
                f"{leaf.dtype}, which the kit cannot draw inputs of (it draws "
                f"{_DRAWN_DTYPES}); a module's input is JAX arrays, which hold no strings or "
                "Python objects: encode the leaf as numbers (a string as an integer id)"
            )
    if all(math.prod(leaf.shape) == 0 for _, leaf in flat):
        shapes = ", ".join(
            f"{jax.tree_util.keystr(path) or '(root)'} {tuple(leaf.shape)}"
            for path, leaf in flat[:3]
        )
        raise ValueError(
            f"check_module: example_input has no elements ({shapes}): the properties "
            "compare the module on two different inputs, which takes at least one element"
        )
    return jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype), example_input)


_FOLD_HINT = (
    "update_statistics raised in the module's own code, not a routing check: it receives "
    "(T, B, *feat) leaves; fold T and B into one batch (x.reshape(-1, *feat)) and give each "
    "statistic back the shape it had"
)


def _failure_hint(failure: _PhaseError, batched_example_hint: str | None) -> str | None:
    """What to look at for a call that raised: the example's shape, the statistics' fold, or
    what the phase found (a module given no history)."""
    if failure.hint is not None:
        return failure.hint
    if failure.prop is ModuleProperty.STATISTICS and not isinstance(failure.error, ContractError):
        return _FOLD_HINT
    return batched_example_hint if failure.prop in _SHAPE_PROPERTIES else None


_SHAPE_PROPERTIES = frozenset(
    {
        ModuleProperty.INITIALIZE_STATE,
        ModuleProperty.CHECKED_CALL,
        ModuleProperty.CARRY_PRESERVATION,
    }
)


def _sizes(name: str, sizes: Sequence[int]) -> tuple[int, ...]:
    __tracebackhide__ = True
    if isinstance(sizes, int | str) or not isinstance(sizes, Sequence) or not sizes:
        raise TypeError(f"check_module: {name} must be a non-empty sequence of ints, got {sizes!r}")
    checked = {require_int("check_module", f"{name}[{i}]", size) for i, size in enumerate(sizes)}
    # Ascending, so that Hypothesis shrinks a failure towards the smallest size.
    return tuple(sorted(checked))


def _max_examples(max_examples: int | None) -> int:
    __tracebackhide__ = True
    if max_examples is not None:
        return require_int("check_module", "max_examples", max_examples)
    configured = os.environ.get(MAX_EXAMPLES_ENV_VAR, "").strip()
    if not configured:  # unset, or set empty (as a CI variable left blank is)
        return DEFAULT_MAX_EXAMPLES
    try:
        number = int(configured)
    except ValueError:
        raise ValueError(
            f"check_module: {MAX_EXAMPLES_ENV_VAR} must be a positive int, got {configured!r}"
        ) from None
    return require_int("check_module", MAX_EXAMPLES_ENV_VAR, number)


def check_module(
    module_factory_or_module: StatefulModule | Callable[[], StatefulModule],
    example_input: PyTree[Shaped[Array, "..."] | jax.ShapeDtypeStruct],
    *,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    time_lengths: Sequence[int] = DEFAULT_TIME_LENGTHS,
    max_examples: int | None = None,
    stochastic: bool | Literal["per_episode"] = False,
    episodic: bool = True,
    rtol: float = 1e-5,
    atol: float = 1e-5,
) -> None:
    """Check every contract property of a module, on random batch sizes, lengths and inputs.

    Hypothesis draws a batch size ``B`` from ``batch_sizes``, a rollout length
    ``T`` from ``time_lengths``, random inputs shaped like ``example_input``, the
    steps after which each env's episode ends, a permutation and a subset of the
    envs, then checks, in this order (the names are :class:`ModuleProperty`
    values, the rules those quoted by a failure):

    <properties>

    Stochastic modules need no tolerance: their random numbers come from per-env
    keys in the carry, so every comparison above sees the same numbers for the
    same env and holds exactly (up to ``rtol``/``atol`` of float reordering).
    ``stochastic=True`` adds the check that this is where they come from. A
    module drawing from an ``nnx.Rngs`` in ``__call__`` fails ``no variable
    written in the forward path``.

    The contract checks are on during the check whatever ``NNX_PPO_CHECKS`` says.
    Compiled calls run on copies; the eager calls run on your module (so that its
    attributes keep the order you gave them), which gets its variables back
    after every example. Do not call this inside a Hypothesis test; it runs its
    own.

    Args:
      module_factory_or_module: the module, or a function of no arguments that builds it.
      example_input: **one** sample's input, without the batch axis: a pytree of
        arrays or ``jax.ShapeDtypeStruct``. Inputs are drawn with its tree, shapes
        and dtypes (floats standard normal, complex numbers with both parts so,
        integers in ``[-3, 3]``, ``[0, 3]`` if unsigned, booleans, PRNG keys), as
        JAX holds them: NumPy's float64 and int64 as float32 and int32 unless x64
        is on. Strings and objects are refused.
      batch_sizes: the batch sizes to draw ``B`` from; one compile per size. At
        least one must be 2 or more, for the properties that compare envs.
      time_lengths: the rollout lengths to draw ``T`` from. At least one must be 2
        or more, for an episode to end within a rollout.
      max_examples: how many examples Hypothesis runs (before shrinking a
        failure); by default ``NNX_PPO_MAX_EXAMPLES`` from the environment (which
        ``pytest --nnx-ppo-max-examples`` sets), else 10.
      stochastic: whether the module draws random numbers (adds ``per-env keys
        in carry``): ``True`` where it draws at every step, ``"per_episode"``
        where it draws once per episode (noise drawn at reset and kept), whose
        keys change at each ``reset_state`` rather than each step; one whose
        results a step into an episode change with every key leaf split at
        every step fails it (a draw made at an episode's first step and kept
        passes, before a sampler too). A
        module that does both (a per-episode latent before a sampler) passes
        either.
      episodic: whether an episode's end forgets the episode (``episodes are
        independent``); ``False`` for a module that remembers across episodes on
        purpose (RL^2-style meta-learning), which skips that property.
      rtol, atol: the tolerance of float comparisons. Rows of a matmul may round
        differently in a batch of another size, and XLA reorders float
        arithmetic when it fuses a compiled call: the default, ``1e-5``, is
        about 84 float32 epsilons, room for a few dozen reordered roundings.

    Raises:
      ContractPropertyError: a property failed; the message names it, the smallest
        ``B`` and ``T`` Hypothesis found that fail, and the leaf that differed.
      TypeError, ValueError: the arguments are malformed.
    """
    __tracebackhide__ = True  # pytest shows the caller's line and the message
    module = _build(module_factory_or_module)
    spec = _input_spec(example_input)
    batches = _sizes("batch_sizes", batch_sizes)
    if max(batches) < 2:
        raise ValueError(
            f"check_module: batch_sizes {batches} has no size of 2 or more: with one env per "
            "batch no property can see one env's rows depend on another's (batch-of-one "
            "agreement, minibatch slicing); include 2"
        )
    lengths = _sizes("time_lengths", time_lengths)
    if max(lengths) < 2:
        raise ValueError(
            f"check_module: time_lengths {lengths} has no length of 2 or more: an episode "
            "ends between two steps of a rollout, so in rollouts of one step none does and "
            "no property sees what follows a reset_state (episodes are independent, replay "
            "across an end); include a longer one (the default is (1, 4))"
        )
    examples = _max_examples(max_examples)
    rtol = require_number("check_module", "rtol", rtol, minimum=0.0)
    atol = require_number("check_module", "atol", atol, minimum=0.0)
    if not (isinstance(stochastic, str) and stochastic == "per_episode"):
        stochastic = require_bool("check_module", "stochastic", stochastic, also="'per_episode'")
    kit = _ModuleKit(
        module, rtol, atol, stochastic, require_bool("check_module", "episodic", episodic)
    )
    hint = batched_example_hint(spec, "the kit")

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        report_multiple_bugs=False,
        print_blob=False,
        phases=(Phase.explicit, Phase.generate, Phase.shrink),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(_examples(batches, lengths, spec))
    def check_every_property(example: _Example) -> None:
        case = _Case(kit, example)
        failure: _PhaseError | None = None
        try:
            for row in MODULE_PROPERTIES:
                if row.applies is None or row.applies.holds(case):
                    row.check(case)
        except _PhaseError as caught:
            failure = caught
        if failure is not None:
            # Raised outside the handler, so that nothing is chained: Hypothesis tells
            # failures apart by their chain, which holds per-trace objects.
            raise property_failure(
                "check_module",
                failure.prop,
                kit.name,
                example.sizes,
                f"{failure.what} raised {type(failure.error).__name__}.",
                leaf=contract_leaf(failure.error),
                rule=_RULES[failure.prop],
                cause=failure.error,
                hint=_failure_hint(failure, hint),
            )

    try:
        with checks(True):
            check_every_property()
    except ContractPropertyError as error:
        # The message says it all: no library frames, no chained cause (kept as .cause).
        raise error.with_traceback(None) from None
    except FlakyFailure as flaky:
        # The example failed once and passed when Hypothesis ran it again.
        first = next((e for e in flaky.exceptions if isinstance(e, ContractPropertyError)), None)
        if first is None:
            raise
        first.add_note(
            "This failure did not happen again when the same example was run once more: "
            "the module's results depend on something that changes between traces or "
            "calls (Python state read or written while tracing: a counter, a global, a "
            "cache), which jax.jit would freeze at its first trace."
        )
        raise first.with_traceback(None) from None


check_module.__doc__ = document_properties(check_module.__doc__, MODULE_PROPERTIES)
