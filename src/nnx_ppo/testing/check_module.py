"""``check_module``: every contract property of a stateful module, checked with Hypothesis.

The runtime checks (:mod:`nnx_ppo.contract.checks`) catch what one call's shapes and
trees show. The properties that need several calls, per-sample purity, replay,
statistics, are what this kit adds: it runs your module on random batch sizes,
rollout lengths and inputs, compares the calls with each other, and on failure
raises :class:`ContractPropertyError` naming the property, the smallest batch size
and rollout length Hypothesis found that fail, and the leaf that differed.

Example::

    from nnx_ppo.testing import check_module

    def test_my_cell():
        check_module(lambda: MyCell(3, 8, nnx.Rngs(0)), jnp.zeros(3))
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from jaxtyping import Array, Bool, PyTree, Shaped

from nnx_ppo.contract import ContractError, checks, format_violation
from nnx_ppo.contract.arguments import require_int, require_number
from nnx_ppo.contract.checks import named_leaves
from nnx_ppo.networks.adapter import is_sampled_action
from nnx_ppo.networks.types import PPONetworkOutput, StatefulModule, StatefulModuleOutput
from nnx_ppo.testing.strategies import pytree_observations

__all__ = [
    "DEFAULT_BATCH_SIZES",
    "DEFAULT_TIME_LENGTHS",
    "ContractPropertyError",
    "ModuleProperty",
    "check_module",
]

DEFAULT_BATCH_SIZES: tuple[int, ...] = (1, 2, 3)
"""The batch sizes :func:`check_module` draws from unless told otherwise. Each size
compiles the module's step once, so a few small ones keep the check fast."""

DEFAULT_TIME_LENGTHS: tuple[int, ...] = (1, 3)
"""The rollout lengths :func:`check_module` draws from unless told otherwise."""


def fast_compile_options() -> dict[str, Any] | None:
    """``jax.jit`` compiler options for the kit's programs, compiled once and run a few times.

    On CPU, skipping the backend's optimisation of machine code saves about 40% of
    the compile time and costs nothing that matters here. Other backends keep their
    defaults.
    """
    return {"xla_backend_optimization_level": 0} if jax.default_backend() == "cpu" else None


class ModuleProperty(enum.StrEnum):
    """The properties :func:`check_module` checks, in the order it checks them."""

    INITIALIZE_STATE = "initialize_state"
    CHECKED_CALL = "checked call"
    CARRY_PRESERVATION = "carry preservation"
    NO_WRITES = "no variable written in the forward path"
    PERMUTATION = "permutation equivariance"
    BATCH_OF_ONE = "batch-of-one agreement"
    RESET_STATE = "reset_state"
    REPLAY = "replay consistency"
    REPLAY_SUBSET = "replay on a subset of the batch"
    STORED_ACTION = "replay takes the stored action"
    STATISTICS = "update_statistics routing"
    STATISTICS_ORDER = "statistics fold (T, B) as one batch"
    PER_ENV_KEYS = "per-env keys in carry"


_PURITY = (
    "the forward path is per-sample pure: row i of every output depends only on row i of "
    "state, x and rollout_extras, and on the parameters (SPEC section 1)"
)
_RULES: dict[ModuleProperty, str] = {
    ModuleProperty.INITIALIZE_STATE: "initialize_state(batch_size) returns a carry whose every "
    "leaf leads with batch_size (SPEC section 1)",
    ModuleProperty.CHECKED_CALL: "every call of a rollout passes the contract checks: one B "
    "binds every leaf of its inputs and outputs (SPEC section 1)",
    ModuleProperty.CARRY_PRESERVATION: "next_state has exactly the tree, shapes and dtypes of "
    "state: it is a scan carry (SPEC section 1)",
    ModuleProperty.NO_WRITES: "__call__ and reset_state never write an NNX variable: running "
    "statistics change only in update_statistics, and randomness comes from per-env keys in "
    "the carry (SPEC section 1)",
    ModuleProperty.PERMUTATION: _PURITY,
    ModuleProperty.BATCH_OF_ONE: _PURITY,
    ModuleProperty.RESET_STATE: "reset_state returns the carry's tree, shapes and dtypes, on a "
    "batched carry and, under vmap, on one env's slice, and resets each env on its own "
    "(SPEC section 1)",
    ModuleProperty.REPLAY: "loss replay from the rollout's initial carry, fed the stored "
    "rollout_extras, reproduces the rollout (SPEC sections 2 and 5)",
    ModuleProperty.REPLAY_SUBSET: "loss replay of any subset of the envs (a minibatch) "
    "reproduces those envs' rows of the rollout (SPEC sections 2 and 5)",
    ModuleProperty.STORED_ACTION: "in loss replay a sampler scores the stored action it is "
    "given back in rollout_extras, never a fresh sample (SPEC sections 1 and 2)",
    ModuleProperty.STATISTICS: "update_statistics receives (T, B, *feat) histories, and "
    "containers route it to every module that keeps statistics (SPEC sections 1 and 3)",
    ModuleProperty.STATISTICS_ORDER: "a module that aggregates folds T into B and treats the "
    "result as one batch, so the order of the T * B samples does not matter (SPEC section 1)",
    ModuleProperty.PER_ENV_KEYS: "randomness in the forward path comes from per-env keys in "
    "the carry: one distinct typed key per env, split every step (SPEC section 1)",
}


class ContractPropertyError(AssertionError):
    """A module or an environment broke a property of the contract.

    Raised by :func:`check_module` and :func:`~nnx_ppo.testing.check_env`. An
    ``AssertionError``, so pytest reports it as a test failure. Where a contract
    check raised :class:`nnx_ppo.ContractError` (or the module raised), that error
    is chained as ``__cause__`` and quoted in the message.

    Attributes:
      property: the name of the broken property (a :class:`ModuleProperty` or
        :class:`~nnx_ppo.testing.EnvProperty` value).
      subject: the class name of the module or environment checked.
      sizes: the sizes of the failing example, e.g. ``{"B": 2, "T": 1}``; for a
        module, the smallest that Hypothesis found.
      leaf: the leaf (or variable) that differed, when one did.
    """

    def __init__(
        self,
        message: str,
        *,
        property: str,
        subject: str,
        sizes: dict[str, int],
        leaf: str | None,
    ) -> None:
        super().__init__(message)
        self.property = property
        self.subject = subject
        self.sizes = dict(sizes)
        self.leaf = leaf


def property_failure(
    checker: str,
    prop: str,
    subject: str,
    sizes: dict[str, int],
    sentence: str,
    *,
    leaf: str | None = None,
    expected: str | None = None,
    found: str | None = None,
    rule: str | None = None,
    cause: BaseException | None = None,
) -> ContractPropertyError:
    """Build the error of a failed property; shared by ``check_module`` and ``check_env``.

    The first line names the property and the sizes, then one fact per line as in
    every contract message; an error that caused the failure is quoted below.
    """
    shown = ", ".join(f"{name}={size}" for name, size in sizes.items())
    message = format_violation(
        f"{checker}({subject})",
        f"property '{prop}' fails at {shown}: {sentence}",
        leaf=leaf,
        expected=expected,
        found=found,
        rule=rule,
    )
    if cause is not None:
        quoted = f"{type(cause).__name__}: {cause}".strip()
        message += "\n" + "\n".join("    " + line for line in quoted.splitlines())
    return ContractPropertyError(message, property=prop, subject=subject, sizes=sizes, leaf=leaf)


def contract_leaf(error: BaseException) -> str | None:
    """The leaf a :class:`~nnx_ppo.ContractError` names; else ``None``."""
    return error.leaf if isinstance(error, ContractError) else None


# -------------------------------------------------------------------------- host arrays


def _is_key(leaf: Any) -> bool:
    return jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def _host(tree: PyTree[Shaped[Array, "..."]]) -> PyTree[Shaped[Any, "..."]]:
    """Leaves as NumPy arrays (PRNG keys stay JAX arrays, NumPy has no key dtype).

    The kit slices, permutes and stacks rows on the host: done with JAX outside a
    compiled function, every new shape would compile a small program of its own.
    """
    return jax.tree.map(lambda leaf: leaf if _is_key(leaf) else np.asarray(leaf), tree)


def as_numpy(leaf: Any) -> np.ndarray:
    """A leaf as a NumPy array, a PRNG key as its raw key data."""
    return np.asarray(jax.random.key_data(leaf) if _is_key(leaf) else leaf)


# ----------------------------------------------------------------------------- examples


@dataclass(frozen=True, repr=False)
class _Example:
    """One drawn case: the sizes, two input sequences, and the rows the checks permute or take."""

    batch_size: int
    time_length: int
    inputs: PyTree[Shaped[Any, "T B ..."]]
    other_inputs: PyTree[Shaped[Any, "T B ..."]]
    permutation: np.ndarray
    subset: np.ndarray

    @property
    def sizes(self) -> dict[str, int]:
        return {"B": self.batch_size, "T": self.time_length}

    def __repr__(self) -> str:
        return (
            f"Example(B={self.batch_size}, T={self.time_length}, "
            f"permutation={self.permutation.tolist()}, subset={self.subset.tolist()})"
        )

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        # Hypothesis prints the failing example: the sizes and rows, not the arrays.
        del cycle
        printer.text(repr(self))


def _time_major(batch_major: PyTree[Shaped[Array, "B T ..."]]) -> PyTree[Shaped[Any, "T B ..."]]:
    return jax.tree.map(lambda leaf: leaf.swapaxes(0, 1), _host(batch_major))


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
        permutation=np.asarray(draw(st.permutations(rows)), dtype=np.int32),
        subset=np.asarray(subset, dtype=np.int32),
    )


# ---------------------------------------------------------------------------- comparing


def show_values(values: np.ndarray) -> str:
    """A short one-line rendering of an array for a message."""
    text = np.array2string(values, precision=4, threshold=8, separator=", ")
    return " ".join(text.split())


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
        return _Mismatch(
            "the tree", None, f"leaves {expected_names[:6]}", f"leaves {found_names[:6]}"
        )
    for (name, want), (_, got) in zip(expected, found, strict=True):
        want_np, got_np = as_numpy(want), as_numpy(got)
        if want_np.shape != got_np.shape or want_np.dtype != got_np.dtype:
            return _Mismatch(
                name,
                None,
                f"shape {want_np.shape} {want_np.dtype}",
                f"shape {got_np.shape} {got_np.dtype}",
            )
        inexact = np.issubdtype(want_np.dtype, np.inexact)
        if inexact:
            bad = ~np.isclose(got_np, want_np, rtol=rtol, atol=atol, equal_nan=True)
        else:
            bad = got_np != want_np
        if not bad.any():
            continue
        row = None if want_np.ndim == 0 else int(np.argwhere(bad)[0][0])
        want_np, got_np = (want_np, got_np) if row is None else (want_np[row], got_np[row])
        gap = ""
        if inexact:
            difference = np.abs(got_np.astype(np.float64) - want_np)
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


def _rows(tree: PyTree[Shaped[Array, "B ..."]], rows: Any) -> PyTree[Shaped[Array, "R ..."]]:
    """Rows of every batched leaf; scalars (a scalar loss or metric) stay as they are."""
    return jax.tree.map(lambda leaf: leaf if leaf.ndim == 0 else leaf[rows], tree)


def _env_rows(
    tree: PyTree[Shaped[Array, "T B ..."]], rows: Any
) -> PyTree[Shaped[Array, "T R ..."]]:
    return jax.tree.map(lambda leaf: leaf[:, rows], tree)


def _at_step(tree: PyTree[Shaped[Array, "T ..."]], t: int) -> PyTree[Shaped[Array, "..."]]:
    return jax.tree.map(lambda leaf: leaf[t], tree)


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


def _variable_values(variables: nnx.State) -> dict[str, Any]:
    """Every array in the module's NNX variables, by a name like ``layers.0.mean['a']``.

    A variable may hold a pytree (a Normalizer's statistics of a dict input): its
    leaves are named below the variable's path.
    """
    values: dict[str, Any] = {}
    for path, variable in nnx.to_flat_state(variables):
        name = ".".join(str(part) for part in path)
        for leaf_path, leaf in jax.tree_util.tree_flatten_with_path(variable.get_value())[0]:
            values[name + jax.tree_util.keystr(leaf_path)] = leaf
    return values


def _writes(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Bool[Array, ""]]:
    """Per variable, whether it was written (added, removed, reshaped or given new values)."""
    flags: dict[str, Bool[Array, ""]] = {}
    for name in sorted(set(before) | set(after)):
        old, new = before.get(name), after.get(name)
        if old is None or new is None or old.shape != new.shape or old.dtype != new.dtype:
            flags[name] = jnp.asarray(True)
        elif _is_key(old):
            flags[name] = jnp.any(jax.random.key_data(old) != jax.random.key_data(new))
        else:
            flags[name] = jnp.any(old != new)
    return flags


class _PhaseError(Exception):
    """An error raised while one property's calls ran; turned into a ContractPropertyError."""

    def __init__(self, prop: ModuleProperty, what: str, error: Exception) -> None:
        super().__init__(str(error))
        self.prop = prop
        self.what = what
        self.error = error


@contextlib.contextmanager
def _phase(prop: ModuleProperty, what: str) -> Iterator[None]:
    """Attribute any error raised inside to ``prop``; ``what`` says which call raised."""
    try:
        yield
    except (_PhaseError, ContractPropertyError):
        raise
    except Exception as error:
        leaf = contract_leaf(error)
        if prop is ModuleProperty.CHECKED_CALL and leaf and leaf.startswith("next_state"):
            prop = ModuleProperty.CARRY_PRESERVATION
        raise _PhaseError(prop, what, error) from error


@dataclass(frozen=True)
class _Trajectory:
    """The per-step results of a rollout or a replay, and the variables its calls wrote."""

    outputs: list[StatefulModuleOutput]
    written: list[tuple[int, list[str]]]

    def extras(self) -> Any:
        """The emitted rollout_extras stacked over steps: leaves ``(T, B, *feat)``."""

        def stack(*steps: Any) -> Any:
            return jnp.stack(steps) if _is_key(steps[0]) else np.stack(steps)

        return jax.tree.map(stack, *(o.rollout_extras for o in self.outputs))


class _ModuleKit:
    """The compiled calls of one module and the property checks built on them."""

    def __init__(self, module: StatefulModule, rtol: float, atol: float, stochastic: bool) -> None:
        self.name = type(module).__name__
        # Every example starts from these; compiled calls get copies, so neither they
        # nor the caller's module are ever written.
        self.graphdef, self.variables = nnx.split(module)
        self.rtol, self.atol, self.stochastic = rtol, atol, stochastic
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
    ) -> tuple[StatefulModuleOutput, dict[str, Bool[Array, ""]]]:
        before = _variable_values(variables)
        module = nnx.merge(self.graphdef, variables)
        out = module(state, x, rollout_extras)
        return out, _writes(before, _variable_values(nnx.state(module)))

    def _reset(
        self, variables: nnx.State, state: Any
    ) -> tuple[Any, Any, dict[str, Bool[Array, ""]]]:
        before = _variable_values(variables)
        module = nnx.merge(self.graphdef, variables)
        with _phase(ModuleProperty.RESET_STATE, "reset_state on the batched carry"):
            batched = module.reset_state(state)
        per_env = batched
        if jax.tree.leaves(state):  # vmap needs an axis to map over
            with _phase(ModuleProperty.RESET_STATE, "reset_state on one env's slice, under vmap"):
                per_env = jax.vmap(module.reset_state)(state)
        return batched, per_env, _writes(before, _variable_values(nnx.state(module)))

    def _fold(self, variables: nnx.State, history: Any) -> dict[str, Any]:
        module = nnx.merge(self.graphdef, variables)
        module.update_statistics(history)
        return _variable_values(nnx.state(module))

    # ------------------------------------------------------------------------ helpers

    def _fail(
        self, prop: ModuleProperty, ex: _Example, sentence: str, **details: Any
    ) -> ContractPropertyError:
        return property_failure(
            "check_module", prop, self.name, ex.sizes, sentence, rule=_RULES[prop], **details
        )

    def _run(
        self,
        prop: ModuleProperty,
        what: str,
        variables: nnx.State,
        state: Any,
        inputs: Any,
        stored: Any,
        time_length: int,
    ) -> _Trajectory:
        """Call the module ``time_length`` times from ``state``; ``stored``: replay's extras."""
        outputs, written = [], []
        with _phase(prop, what):
            for t in range(time_length):
                extras = None if stored is None else _at_step(stored, t)
                out, flags = self.step(variables, state, _at_step(inputs, t), extras)
                out = _host(out)
                outputs.append(out)
                names = [name for name, flag in flags.items() if bool(flag)]
                if names:
                    written.append((t, names))
                state = out.next_state
        return _Trajectory(outputs, written)

    def _check_no_writes(
        self, written: list[tuple[int, list[str]]], ex: _Example, what: str
    ) -> None:
        if not written:
            return
        step, names = written[0]
        raise self._fail(
            ModuleProperty.NO_WRITES,
            ex,
            f"{what} wrote the NNX variable {names[0]} (at step {step}).",
            leaf=f"{self.name}.{names[0]}",
            expected="every NNX variable as it was before the call",
            found="written: " + ", ".join(f"{self.name}.{n}" for n in names[:4]),
        )

    def _compare(
        self,
        prop: ModuleProperty,
        ex: _Example,
        expected: list[list[tuple[str, Any]]],
        found: list[list[tuple[str, Any]]],
        describe: Callable[[_Mismatch], tuple[str, str, str]],
        row_name: Callable[[int], str] = lambda row: f"env {row}",
        *,
        per_step: bool = True,
    ) -> None:
        """Raise for the first step and leaf where ``found`` differs from ``expected``.

        ``expected`` and ``found`` hold one list of named leaves per step.
        ``describe(mismatch)`` returns the sentence and the labels of the expected
        and found values; ``row_name`` names the row of a leaf that differed;
        ``per_step=False`` for results that are not a rollout's (no step to name).
        """
        for t, (want, got) in enumerate(zip(expected, found, strict=True)):
            mismatch = _first_mismatch(want, got, self.rtol, self.atol)
            if mismatch is None:
                continue
            sentence, expected_label, found_label = describe(mismatch)
            where = f"{mismatch.leaf} at step {t}" if per_step else mismatch.leaf
            if mismatch.row is not None:
                where += f", {row_name(mismatch.row)}"
            found_note = "; ".join(note for note in (found_label, mismatch.gap) if note)
            raise self._fail(
                prop,
                ex,
                sentence,
                leaf=where,
                expected=f"{mismatch.expected}  ({expected_label})",
                found=f"{mismatch.found}  ({found_note})",
            )

    # ---------------------------------------------------------------------- the checks

    def check(self, ex: _Example) -> None:
        """Every property on one example; raises at the first that fails."""
        with _phase(ModuleProperty.INITIALIZE_STATE, f"initialize_state({ex.batch_size})"):
            initial, variables = self.initialize(self.variables, ex.batch_size)
        initial = _host(initial)
        rollout = self._run(
            ModuleProperty.CHECKED_CALL,
            "the rollout's __call__",
            variables,
            initial,
            ex.inputs,
            None,
            ex.time_length,
        )
        self._check_no_writes(rollout.written, ex, "__call__")
        self._check_permutation(ex, variables, initial, rollout)
        self._check_batch_of_one(ex, variables, initial, rollout)
        self._check_reset(ex, variables, rollout.outputs[-1].next_state)
        self._check_replay(ex, variables, initial, rollout)
        self._check_stored_action(ex, variables, initial, rollout)
        self._check_statistics(ex, variables, rollout.extras())
        if self.stochastic:
            self._check_keys(ex, initial, rollout)

    def _check_permutation(
        self, ex: _Example, variables: nnx.State, initial: Any, rollout: _Trajectory
    ) -> None:
        perm = ex.permutation
        permuted = self._run(
            ModuleProperty.PERMUTATION,
            "__call__ on the permuted batch",
            variables,
            _rows(initial, perm),
            _env_rows(ex.inputs, perm),
            None,
            ex.time_length,
        )
        self._check_no_writes(permuted.written, ex, "__call__")
        self._compare(
            ModuleProperty.PERMUTATION,
            ex,
            [
                _step_leaves(_rows(o, perm), batched_only=False, extras=True)
                for o in rollout.outputs
            ],
            [_step_leaves(o, batched_only=False, extras=True) for o in permuted.outputs],
            lambda m: (
                f"permuting the batch by {perm.tolist()} did not permute {m.leaf} the same way.",
                "in the batch as drawn",
                "in the permuted batch",
            ),
            lambda row: f"env {perm[row]} (row {row} once permuted)",
        )

    def _check_batch_of_one(
        self, ex: _Example, variables: nnx.State, initial: Any, rollout: _Trajectory
    ) -> None:
        # Every env, not one drawn env: a leak from earlier rows (a cumulative sum over
        # the batch) leaves the first row intact.
        for env in range(ex.batch_size):
            rows = np.asarray([env])
            alone = self._run(
                ModuleProperty.BATCH_OF_ONE,
                "__call__ on a batch of one",
                variables,
                _rows(initial, rows),
                _env_rows(ex.inputs, rows),
                None,
                ex.time_length,
            )
            self._compare(
                ModuleProperty.BATCH_OF_ONE,
                ex,
                [
                    _step_leaves(_rows(o, rows), batched_only=True, extras=True)
                    for o in rollout.outputs
                ],
                [_step_leaves(o, batched_only=True, extras=True) for o in alone.outputs],
                lambda m, env=env: (
                    f"env {env} run alone gives a different {m.leaf} than in the batch of "
                    f"{ex.batch_size}.",
                    f"env {env} in the batch of {ex.batch_size}",
                    f"env {env} run alone",
                ),
                lambda row, env=env: f"env {env}",
            )

    def _check_reset(self, ex: _Example, variables: nnx.State, state: Any) -> None:
        with _phase(ModuleProperty.RESET_STATE, "reset_state"):
            batched, per_env, flags = _host(self.reset(variables, state))
        self._check_no_writes(
            [(0, [name for name, flag in flags.items() if bool(flag)])]
            if any(flags.values())
            else [],
            ex,
            "reset_state",
        )
        self._compare(
            ModuleProperty.RESET_STATE,
            ex,
            [named_leaves("reset_state(state)", batched)],
            [named_leaves("reset_state(state)", per_env)],
            lambda m: (
                f"reset_state on one env's slice (under vmap) gives a different {m.leaf} than "
                "reset_state on the batch.",
                "reset_state of the batched carry",
                "reset_state vmapped over the envs",
            ),
            per_step=False,
        )

    def _check_replay(
        self, ex: _Example, variables: nnx.State, initial: Any, rollout: _Trajectory
    ) -> None:
        stored = rollout.extras()
        replay = self._run(
            ModuleProperty.REPLAY,
            "__call__ in replay (given the stored rollout_extras)",
            variables,
            initial,
            ex.inputs,
            stored,
            ex.time_length,
        )
        self._check_no_writes(replay.written, ex, "__call__ in replay")
        self._compare(
            ModuleProperty.REPLAY,
            ex,
            [_step_leaves(o, batched_only=False, extras=False) for o in rollout.outputs],
            [_step_leaves(o, batched_only=False, extras=False) for o in replay.outputs],
            lambda m: (
                "replaying from the rollout's initial carry with the stored rollout_extras "
                f"gives a different {m.leaf}.",
                "rollout",
                "replay",
            ),
        )
        subset = ex.subset
        replay_subset = self._run(
            ModuleProperty.REPLAY_SUBSET,
            "__call__ in replay of a subset of the envs",
            variables,
            _rows(initial, subset),
            _env_rows(ex.inputs, subset),
            _env_rows(stored, subset),
            ex.time_length,
        )
        self._compare(
            ModuleProperty.REPLAY_SUBSET,
            ex,
            [
                _step_leaves(_rows(o, subset), batched_only=True, extras=False)
                for o in rollout.outputs
            ],
            [_step_leaves(o, batched_only=True, extras=False) for o in replay_subset.outputs],
            lambda m: (
                f"replaying the envs {subset.tolist()} alone gives a different {m.leaf} than "
                f"the rollout of all {ex.batch_size}.",
                f"rollout of the batch of {ex.batch_size}",
                "replay of the subset",
            ),
            lambda row: f"env {subset[row]}",
        )

    def _check_stored_action(
        self, ex: _Example, variables: nnx.State, initial: Any, rollout: _Trajectory
    ) -> None:
        """Replay ``inputs`` fed the extras of a rollout on ``other_inputs``: its actions
        must be the other rollout's, which a sampler that samples again cannot return."""
        if not _actions(rollout.outputs[0]):
            return
        other = self._run(
            ModuleProperty.STORED_ACTION,
            "the rollout's __call__",
            variables,
            initial,
            ex.other_inputs,
            None,
            ex.time_length,
        )
        replay = self._run(
            ModuleProperty.STORED_ACTION,
            "__call__ in replay",
            variables,
            initial,
            ex.inputs,
            other.extras(),
            ex.time_length,
        )
        self._compare(
            ModuleProperty.STORED_ACTION,
            ex,
            [_actions(o) for o in other.outputs],
            [_actions(o) for o in replay.outputs],
            lambda m: (
                f"in replay, {m.leaf} is not the action stored in the rollout_extras it was "
                "given: the module drew a new one.",
                "the action of the rollout that stored those extras",
                "the action in replay",
            ),
        )

    def _check_statistics(self, ex: _Example, variables: nnx.State, history: Any) -> None:
        samples = ex.batch_size * ex.time_length
        order = np.random.default_rng(samples).permutation(samples)

        def shuffle(leaf: Shaped[Any, "T B ..."]) -> Shaped[Any, "T B ..."]:
            return leaf.reshape((samples, *leaf.shape[2:]))[order].reshape(leaf.shape)

        with _phase(ModuleProperty.STATISTICS, "update_statistics"):
            folded = _host(self.fold(variables, history))
            shuffled = _host(self.fold(variables, jax.tree.map(shuffle, history)))
        self._compare(
            ModuleProperty.STATISTICS_ORDER,
            ex,
            [[(f"{self.name}.{name}", value) for name, value in folded.items()]],
            [[(f"{self.name}.{name}", value) for name, value in shuffled.items()]],
            lambda m: (
                f"update_statistics gives a different {m.leaf} when the same T * B = {samples} "
                "samples come in another order.",
                "after the rollout's history",
                "after the same samples shuffled",
            ),
            lambda row: f"entry {row}",
            per_step=False,
        )

    def _check_keys(self, ex: _Example, initial: Any, rollout: _Trajectory) -> None:
        carry = named_leaves("state", initial)
        keys = [(name, leaf) for name, leaf in carry if _is_key(leaf)]
        if not keys:
            raise self._fail(
                ModuleProperty.PER_ENV_KEYS,
                ex,
                "stochastic=True, but the carry holds no typed PRNG keys.",
                leaf="state",
                expected="a (B,) leaf of typed keys, e.g. from nnx_ppo.networks.utils.new_env_keys",
                found="leaves " + ", ".join(f"{name} {leaf.dtype}" for name, leaf in carry)
                if carry
                else "an empty carry",
            )
        next_keys = dict(named_leaves("state", rollout.outputs[0].next_state))
        for name, leaf in keys:
            data = as_numpy(leaf).reshape(ex.batch_size, -1)
            first_row = {row.tobytes(): env for env, row in reversed(list(enumerate(data)))}
            for env, row in enumerate(data):
                if first_row[row.tobytes()] != env:
                    raise self._fail(
                        ModuleProperty.PER_ENV_KEYS,
                        ex,
                        f"envs share a key in {name}: they would draw the same random numbers.",
                        leaf=f"{name}, env {env}",
                        expected="a distinct key per env from initialize_state",
                        found=f"env {env} holds the key of env {first_row[row.tobytes()]}",
                    )
            advanced = as_numpy(next_keys[name]).reshape(ex.batch_size, -1)
            stuck = np.flatnonzero((advanced == data).all(axis=1))
            if stuck.size:
                raise self._fail(
                    ModuleProperty.PER_ENV_KEYS,
                    ex,
                    f"the key in {name} did not change from one step to the next: every step "
                    "would draw the same random numbers.",
                    leaf=f"next_state{name.removeprefix('state')} at step 0, env {stuck[0]}",
                    expected="next_state's keys split from state's (split_env_keys)",
                    found="the key the step was given",
                )


# ------------------------------------------------------------------------- the entry


def _build(
    module_factory_or_module: StatefulModule | Callable[[], StatefulModule],
) -> StatefulModule:
    module = module_factory_or_module
    if not isinstance(module, StatefulModule) and callable(module):
        module = module()
    if not isinstance(module, StatefulModule):
        raise TypeError(
            "check_module needs a StatefulModule or a function of no arguments that builds "
            f"one, got {type(module).__name__}"
        )
    return module


def _input_spec(example_input: Any) -> PyTree[jax.ShapeDtypeStruct]:
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
    return jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype), example_input)


def _sizes(name: str, sizes: Sequence[int]) -> tuple[int, ...]:
    if isinstance(sizes, int | str) or not isinstance(sizes, Sequence) or not sizes:
        raise TypeError(f"check_module: {name} must be a non-empty sequence of ints, got {sizes!r}")
    checked = {require_int("check_module", f"{name}[{i}]", size) for i, size in enumerate(sizes)}
    # Ascending, so that Hypothesis shrinks a failure towards the smallest size.
    return tuple(sorted(checked))


def check_module(
    module_factory_or_module: StatefulModule | Callable[[], StatefulModule],
    example_input: PyTree[Shaped[Array, "..."] | jax.ShapeDtypeStruct],
    *,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    time_lengths: Sequence[int] = DEFAULT_TIME_LENGTHS,
    max_examples: int = 10,
    stochastic: bool = False,
    rtol: float = 1e-5,
    atol: float = 1e-5,
) -> None:
    """Check every contract property of a module, on random batch sizes, lengths and inputs.

    Hypothesis draws a batch size ``B`` from ``batch_sizes``, a rollout length
    ``T`` from ``time_lengths`` and random inputs shaped like ``example_input``,
    then checks, in this order (the names are :class:`ModuleProperty` values):

    1. ``initialize_state``: ``initialize_state(B)`` passes the contract checks.
    2. ``checked call`` and ``carry preservation``: a rollout of ``T`` calls, each
       compiled with ``jax.jit``, passes the contract checks; ``next_state``
       keeps the carry's tree, shapes and dtypes.
    3. ``no variable written in the forward path``: no call (nor ``reset_state``)
       writes an NNX variable; ``nnx.state`` is compared before and after.
    4. ``permutation equivariance``: permuting the carry's and the inputs' rows
       permutes every output, next state, metric and emitted extra alike.
    5. ``batch-of-one agreement``: every env run alone gives its row of the batch.
    6. ``reset_state``: on the rollout's final carry, batched, and under
       ``jax.vmap`` on each env's slice; both give the same carry.
    7. ``replay consistency``: replaying from the initial carry with the stored
       ``rollout_extras`` reproduces the rollout's outputs, carries, losses and
       metrics; ``replay on a subset of the batch``: so does replaying a subset
       of the envs (a minibatch).
    8. ``replay takes the stored action`` (when the output holds sampled
       actions, from an action sampler or a ``PPOAdapter``): replay fed the
       extras of a rollout on *other* inputs returns that rollout's actions.
    9. ``update_statistics routing``: ``update_statistics`` with the rollout's
       ``(T, B, *feat)`` history passes the contract checks, which include that
       every module holding statistics was reached; ``statistics fold (T, B) as
       one batch``: shuffling the ``T * B`` samples gives the same statistics.
    10. ``per-env keys in carry`` (``stochastic=True`` only): the carry holds
        typed PRNG keys, a distinct one per env, and each call splits them.

    Stochastic modules need no tolerance: their random numbers come from per-env
    keys in the carry, so every comparison above sees the same numbers for the
    same env and holds exactly (up to ``rtol``/``atol`` of float reordering).
    ``stochastic=True`` adds check 10, which makes sure that is where they come
    from. A module drawing from an ``nnx.Rngs`` in ``__call__`` fails check 3.

    The contract checks are on during the check whatever ``NNX_PPO_CHECKS`` says.
    The module is never modified: every example starts from a copy. Do not call
    this inside a Hypothesis test; it runs its own.

    Args:
      module_factory_or_module: the module, or a function of no arguments that builds it.
      example_input: **one** sample's input, without the batch axis: a pytree of
        arrays or ``jax.ShapeDtypeStruct``. Inputs are drawn with its tree, shapes
        and dtypes (floats standard normal, integers in ``[-3, 3]``, booleans).
      batch_sizes: the batch sizes to draw ``B`` from; one compile per size.
      time_lengths: the rollout lengths to draw ``T`` from.
      max_examples: how many examples Hypothesis runs (before shrinking a failure).
      stochastic: whether the module draws random numbers (adds check 10).
      rtol, atol: the tolerance of float comparisons (rows of a matmul may round
        differently in a batch of another size).

    Raises:
      ContractPropertyError: a property failed; the message names it, the smallest
        ``B`` and ``T`` Hypothesis found that fail, and the leaf that differed.
      TypeError, ValueError: the arguments are malformed.
    """
    module = _build(module_factory_or_module)
    spec = _input_spec(example_input)
    batches = _sizes("batch_sizes", batch_sizes)
    lengths = _sizes("time_lengths", time_lengths)
    max_examples = require_int("check_module", "max_examples", max_examples)
    rtol = require_number("check_module", "rtol", rtol, minimum=0.0)
    atol = require_number("check_module", "atol", atol, minimum=0.0)
    kit = _ModuleKit(module, rtol, atol, bool(stochastic))

    @settings(
        max_examples=max_examples,
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
        try:
            kit.check(example)
        except _PhaseError as failure:
            raise property_failure(
                "check_module",
                failure.prop,
                kit.name,
                example.sizes,
                f"{failure.what} raised {type(failure.error).__name__}.",
                leaf=contract_leaf(failure.error),
                rule=_RULES[failure.prop],
                cause=failure.error,
            ) from failure.error

    with checks(True):
        check_every_property()
