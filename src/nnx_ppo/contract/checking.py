"""How a :class:`~nnx_ppo.networks.types.StatefulModule` call is checked.

Every check here runs in Python, on shapes, dtypes and tree structures, so under
``jax.jit``/``nnx.jit``/``scan`` it runs once, while JAX traces, and the compiled
step pays nothing. The checks are installed on a class by :func:`install_checks`
(called from ``StatefulModule.__init_subclass__``), so a user's module is checked
without any decorator.

A call is checked in three layers:

1. the contract's axes: one ``B`` across every leaf of the inputs and outputs of
   ``__call__``; carry trees preserved; one ``T`` and one ``B`` in
   ``update_statistics``;
2. the jaxtyping annotations on the method's own signature, item by item, with
   dimension names bound across the call (:mod:`nnx_ppo.contract.annotations`);
3. after a top-level ``update_statistics``: every stats-bearing descendant was
   reached (a container that forgets rule 4 of the contract fails loudly).
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import inspect
import os
import typing
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.errors import TraceContextError
from flax.nnx import graphlib
from jax.core import Tracer
from jax.extend.core import get_opaque_trace_state

from nnx_ppo.contract.annotations import (
    AnnotationMismatch,
    annotation_checked,
    checked_leaf_by_leaf,
)
from nnx_ppo.contract.arguments import require_int
from nnx_ppo.contract.errors import DOCS_URL, ContractError, rule_text

__all__ = [
    "CHECKS_ENV_VAR",
    "CONTRACT_METHODS",
    "FROZEN_STATISTICS_MARK",
    "RULE_NO_WRITES",
    "RULE_RANDOMNESS",
    "RULE_STATISTICS_KIND",
    "CallRecord",
    "batched_example_hint",
    "checks",
    "checks_enabled",
    "describe_leaf",
    "describe_module",
    "format_graph_path",
    "format_shape",
    "held_dtype",
    "install_checks",
    "is_key",
    "is_stats_bearing",
    "key_data_or_leaf",
    "named_leaves",
    "observe_calls",
    "require_float_parameters",
    "require_hashable_settings",
    "require_no_hijax",
    "resets_its_carry",
    "structure_difference",
    "typechecked",
]

CHECKS_ENV_VAR = "NNX_PPO_CHECKS"
"""Set to ``0`` (or ``false``/``off``/``no``) to turn the contract checks off."""

_P = ParamSpec("_P")
_R = TypeVar("_R")
_OFF_VALUES = frozenset({"0", "false", "off", "no"})
_CHECKS_OVERRIDE: ContextVar[bool | None] = ContextVar("nnx_ppo_checks", default=None)
_ACTIVE_MODULES: ContextVar[tuple[Any, ...]] = ContextVar("nnx_ppo_active", default=())
_RUNNING_METHOD: ContextVar[tuple[int, str, type] | None] = ContextVar(
    "nnx_ppo_method", default=None
)
"""The innermost checked call: its module's id, the method and the class defining it."""
_RESET_REACHED: ContextVar[dict[int, type] | None] = ContextVar("nnx_ppo_reset", default=None)
"""The modules a top-level ``reset_state`` call reached so far: id to class."""
_STATISTICS_CALL: ContextVar[_StatisticsCall | None] = ContextVar("nnx_ppo_stats", default=None)
_CALL_OBSERVERS: ContextVar[tuple[tuple[Callable[[CallRecord], None], Any], ...]] = ContextVar(
    "nnx_ppo_observers", default=()
)
"""Each observer with the trace it was entered in."""

_CHECKED_MARK = "__nnx_ppo_checked__"
"""On a wrapper :func:`_checked` made: ``(method, the wrapper itself)``. The wrapper's
identity tells it from a user's function that ``functools.wraps`` copied it onto."""
_DEFAULT_MARK = "__nnx_ppo_default__"
_COPIED_MARK = "__nnx_ppo_copied__"
"""On a wrapper installed on a class for a method a base outside the contract defines
(a mixin's): ``True``. The class's subclasses look past it, to what they inherit."""
FROZEN_STATISTICS_MARK = "__nnx_ppo_frozen_statistics__"
"""A class attribute: ``True`` on a wrapper whose descendants' statistics are deliberately
never updated, so the routing check does not expect ``update_statistics`` to reach them."""
CONTRACT_METHODS = ("__call__", "initialize_state", "reset_state", "update_statistics")
"""The methods of a contract module that are checked."""

_RULE_ONE_B = rule_text(
    "one batch size B binds every leaf of state, x, rollout_extras and of the returned "
    "next_state, output and rollout_extras of a __call__",
    "rules",
)
_RULE_CARRY = rule_text(
    "next_state is a scan carry: it must have exactly the tree structure, shapes and "
    "dtypes of state",
    "rules",
)
_RULE_RESET = rule_text(
    "reset_state returns the structure, shapes and dtypes it was given; it is called on "
    "a batched carry and, under vmap, on one env's slice",
    "rules",
)
_RULE_INIT = rule_text(
    "initialize_state(batch_size) returns leaves that lead with batch_size", "rules"
)
_RULE_HISTORY = rule_text(
    "update_statistics receives the rollout's stacked emissions: every leaf is "
    "(T, B, *feat) with one T across the whole top-level call and one B per call (a "
    "nested call's B is the top-level B, or K times it where K entities per env are "
    "folded into the batch)",
    "statistics",
)
_RULE_EMITTED = rule_text(
    "a module's update_statistics receives exactly what its own __call__ emitted as "
    "rollout_extras, stacked: the same tree, (T, B, *emitted) leaves, the same dtypes",
    "statistics",
)
_RULE_REPLAY = rule_text(
    "given stored rollout_extras (loss replay), a module emits extras with the "
    "structure of the stored ones",
    "rules",
)
_RULE_REG = rule_text("regularization_loss is a scalar or has shape (B,)", "rules")
_RULE_METRICS = rule_text("metric leaves are scalars or lead with B", "rules")
_RULE_ROUTING = rule_text(
    "containers route update_statistics to every child the way __call__ routes "
    "rollout_extras; a module that is deliberately not updated is wrapped in "
    "FrozenStatistics",
    "statistics",
)
_RULE_FUNCTION_ANNOTATIONS = rule_text(
    "the engine's functions check the jaxtyping annotations on their signatures, with "
    "T and B bound across the arguments and the result",
    "rules",
)
RULE_RANDOMNESS = rule_text(
    "randomness in the forward path comes from per-env keys in the carry, so that "
    "rollout, replay and minibatches draw the same numbers for each env",
    "rules",
)
RULE_NO_WRITES = rule_text(
    "__call__ writes no variable: parameters change only in the optimizer and running "
    "statistics only in update_statistics",
    "variables",
)
_RULE_ARGUMENTS_UNCHANGED = rule_text(
    "__call__ and reset_state read their arguments and return new carries: a state, x or "
    "rollout_extras is never changed in place (the library passes one carry to more than "
    "one call)",
    "the-rules",
)
_RULE_KEPT_SHAPES = rule_text(
    "update_statistics leaves every statistic with the structure, shapes and dtypes it "
    "had: the (T, B) samples fold into it, so no per-step or per-env axis stays behind",
    "variables",
)
_RULE_RESET_NO_WRITES = rule_text(
    "reset_state returns the fresh carry and writes no variable: it is called on a "
    "batched carry and, under vmap, on one env's slice, where Flax refuses the write",
    "variables",
)
_RULE_INIT_NO_WRITES = rule_text(
    "initialize_state returns the carry and writes no variable but an nnx.Rngs stream: "
    "training runs it in a compiled program on a copy of the network, where a write is "
    "lost",
    "variables",
)
_RULE_STATISTICS_UPDATED = rule_text(
    "a module that keeps running statistics (nnx.BatchStat) updates them in an "
    "update_statistics of its own; one whose statistics are held fixed on purpose is "
    "wrapped in FrozenStatistics",
    "statistics",
)
RULE_STATISTICS_KIND = rule_text(
    "running statistics are nnx.BatchStat (or another non-Param variable) or arrays, made "
    "in __init__: an nnx.Param is trained by the optimizer and a Python value is static "
    "to JAX, so update_statistics writes neither, and adds no state",
    "variables",
)


def checks_enabled() -> bool:
    """Whether the contract checks run, from :func:`checks` or ``NNX_PPO_CHECKS``."""
    override = _CHECKS_OVERRIDE.get()
    if override is not None:
        return override
    return os.environ.get(CHECKS_ENV_VAR, "1").strip().lower() not in _OFF_VALUES


@contextlib.contextmanager
def checks(enabled: bool) -> Iterator[None]:
    """Turn the contract checks on or off inside a ``with`` block.

    The checks run while JAX traces, so what counts is whether they are on when a
    function is first traced: a function compiled with checks on stays checked-free
    at run time anyway, and one traced inside ``checks(False)`` is never checked.
    The block takes precedence over the ``NNX_PPO_CHECKS`` environment variable.

    Example::

        with nnx_ppo.checks(False):
            out = module(state, x)
    """
    token = _CHECKS_OVERRIDE.set(enabled)
    try:
        yield
    finally:
        _CHECKS_OVERRIDE.reset(token)


# --------------------------------------------------------------------------- naming


def format_graph_path(root: Any, path: tuple[Any, ...]) -> str:
    """``path`` (from ``nnx.iter_graph(root)``) as Python would write it: ``.layers[2]``.
    Keys past a node that no longer holds them (removed during a call) are written
    out as they are."""
    node: Any = root
    parts: list[str] = []
    for key in path:
        if isinstance(node, Mapping):
            parts.append(f"[{key!r}]")
        elif _is_attribute_key(node, key):
            parts.append(f".{key}")
        else:
            parts.append(f"[{key}]")
        try:
            node = _graph_child(node, key)
        except _MISSING:
            node = None
    return "".join(parts)


_MISSING = (AttributeError, LookupError, TypeError, ValueError)
"""What :func:`_graph_child` raises for a key its node does not hold."""


def require_no_hijax(caller: str, module: Any) -> None:
    """Refuse a Flax hijax variable (``hijax=True``) under ``module``: ``nnx.split``
    and ``nnx.merge`` inside JAX's transforms, which training and the test kit run the
    module under, do not carry them in this Flax version (an eager ``nnx.jit`` of one
    fails in Flax itself)."""
    for path, node in nnx.iter_graph(module):
        if isinstance(node, nnx.Variable) and getattr(node, "hijax", False):
            raise TypeError(
                f"{caller}: {type(module).__name__}{format_graph_path(module, tuple(path))} "
                "is a hijax variable (made with hijax=True), which the library's "
                "compiled programs cannot carry: make it without hijax=True."
            )


def require_float_parameters(caller: str, module: Any) -> None:
    """Refuse an ``nnx.Param`` under ``module`` that the optimizer cannot train: its
    gradient needs a floating-point dtype."""
    for path, node in nnx.iter_graph(module):
        if not isinstance(node, nnx.Param):
            continue
        for leaf in jax.tree.leaves(node.get_value()):
            # As JAX holds it: a Python int is an int32 parameter.
            numeric = isinstance(leaf, int | float | complex | np.generic | np.ndarray | jax.Array)
            dtype = jax.typeof(leaf).dtype if numeric else None
            if dtype is not None and not jnp.issubdtype(dtype, jnp.inexact):
                raise TypeError(
                    f"{caller}: {type(module).__name__}{format_graph_path(module, tuple(path))} "
                    f"is an nnx.Param of dtype {dtype}: the optimizer trains every "
                    "nnx.Param by its gradient, which needs a floating-point dtype. Hold an "
                    "integer constant in an nnx.Variable (or a plain attribute) instead."
                )


def require_hashable_settings(caller: str, module: Any) -> None:
    """Refuse a setting under ``module`` (an attribute other than an array, a Variable or
    a module) that cannot be hashed: a list or a dict.

    Training compiles its programs with the network's structure, settings included, as
    a static argument, which JAX needs hashable; ``jax.jit`` refused it in a message of
    thousands of lines that buried the attribute.
    """
    try:
        hash(nnx.graphdef(module))
        return
    except TypeError as error:
        unhashable = error
    for path, node in nnx.iter_graph(module):
        # Flax marks each attribute of a module as data (arrays, Variables, modules,
        # nnx.data containers) or static: the static ones are the settings.
        for name, is_data in dict(getattr(node, "_pytree__nodes", {})).items():
            if is_data or name.startswith("_pytree__"):
                continue
            value = vars(node).get(name)
            try:
                hash(value)
            except TypeError:
                where = format_graph_path(module, (*path, name))
                raise TypeError(
                    f"{caller}: {type(module).__name__}{where} is a {type(value).__name__}, "
                    "which cannot be hashed: training compiles the network's settings "
                    "(attributes other than arrays, Variables and modules) into its "
                    "programs as static values, which must be hashable. Hold it as a tuple "
                    "of hashable values (a dict as a tuple of (key, value) pairs), or in an "
                    "nnx.Variable if the network computes with its numbers."
                ) from None
    raise TypeError(
        f"{caller}: the structure of {type(module).__name__} cannot be hashed "
        f"({unhashable}), which training needs to compile it: a setting of one of its "
        "modules (an attribute other than an array, a Variable or a module) is likely a "
        "list or a dict; hold it as a tuple."
    )


def _is_attribute_key(node: Any, key: Any) -> bool:
    # nnx.List names its elements "0", "1", ... where an attribute write reports them.
    return isinstance(key, str) and not (isinstance(node, nnx.List) and key.isdigit())


def _graph_child(node: Any, key: Any) -> Any:
    """``node``'s child at the graph key ``key`` (a path element of ``nnx.iter_graph``):
    an item of a mapping or a sequence, else an attribute (a module's, a named
    tuple's field)."""
    if isinstance(node, Mapping):
        return node[key]
    if _is_attribute_key(node, key):
        return getattr(node, key)
    return node[int(key)]


def _graph_path(root: Any, target: Any) -> tuple[Any, ...] | None:
    for path, node in nnx.iter_graph(root):
        if node is target:
            return tuple(path)
    return None


def describe_module(module: Any) -> str:
    """Name a module by its class and, inside a checked call tree, its path.

    Inside a container's call this reads e.g. ``"Sequential.layers[2] (MyLSTM)"``;
    at the top level it is just the class name.
    """
    stack = _ACTIVE_MODULES.get()
    root = stack[0] if stack else module
    if root is module:
        return type(module).__name__
    path = _graph_path(root, module)
    if path is None:
        return type(module).__name__
    return f"{type(root).__name__}{format_graph_path(root, path)} ({type(module).__name__})"


@dataclass(frozen=True)
class _Site:
    """Where a check runs; named lazily, because naming walks the module graph."""

    module: Any
    method: str
    reached: type | None = None
    """The class whose method the module's own reached through ``super()``: its
    annotations are that class's, not those of the method the call entered."""

    def __str__(self) -> str:
        site = f"{describe_module(self.module)}.{self.method}"
        if self.reached is None:
            return site
        return f"{site} ({self.reached.__name__}.{self.method}, reached through super())"


@contextlib.contextmanager
def _entered(module: Any) -> Iterator[None]:
    outermost = not _ACTIVE_MODULES.get()
    token = _ACTIVE_MODULES.set((*_ACTIVE_MODULES.get(), module))
    graph = _TOP_LEVEL_GRAPH.set(None) if outermost else None
    try:
        yield
    finally:
        if graph is not None:
            _TOP_LEVEL_GRAPH.reset(graph)
        _ACTIVE_MODULES.reset(token)


_TOP_LEVEL_GRAPH: ContextVar[frozenset[int] | None] = ContextVar(
    "nnx_ppo_top_level_graph", default=None
)
"""The ids of the nodes in the graph of the running top-level call's module, walked when
first needed."""


def _violation(site: _Site | str, problem: str, **details: str | None) -> ContractError:
    return ContractError.violation(str(site), problem, **details)


# ------------------------------------------------------------------------ leaf checks


def describe_leaf(leaf: Any) -> str:
    """``"shape (8, 3) float32"``, or what the leaf is when it is not an array."""
    shape = getattr(leaf, "shape", None)
    if shape is None:
        return f"a {type(leaf).__name__} (not an array)"
    return f"shape {tuple(shape)} {leaf.dtype}"


def held_dtype(dtype: Any) -> Any:
    """``dtype`` as JAX holds it: a NumPy float64 or int64 becomes float32 or int32 (as a
    jitted function receives it) unless ``JAX_ENABLE_X64`` is set; typed keys are kept."""
    return jax.dtypes.canonicalize_dtype(dtype, allow_extended_dtype=True)


def named_leaves(name: str, tree: Any) -> list[tuple[str, Any]]:
    """The leaves of ``tree`` with their paths written after ``name``: ``("state['h']", leaf)``."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [(name + jax.tree_util.keystr(path), leaf) for path, leaf in flat]


def batched_example_hint(example_input: Any, adder: str) -> str | None:
    """A hint for a shape failure when ``example_input``, meant as ONE sample, may be a
    batch: every leaf has two axes or more and leads with the same size above one.

    ``adder`` names who adds the batch axis in the message (``"the kit"``).
    """
    named = named_leaves("example_input", example_input)
    shapes = [tuple(getattr(leaf, "shape", ())) for _, leaf in named]
    # One sample of one flat feature axis, (4,), is the common case and no batch.
    leading = {shape[0] if len(shape) > 1 else None for shape in shapes}
    if len(leading) != 1 or None in leading or leading == {1}:
        return None
    (size,) = leading
    shown = zip(named[:3], shapes[:3], strict=True)
    listed = ", ".join(f"{name} {shape}" for (name, _), shape in shown)
    return (
        f"example_input is ONE sample, without the batch axis: {adder} adds B itself. "
        f"Every leaf of yours leads with {size} ({listed}); if {size} is a batch, pass "
        f"one sample, e.g. example_input[0], or jax.ShapeDtypeStruct of its shape."
    )


@dataclass
class _Axis:
    """One named axis (``B`` or ``T``) bound by the first leaf that shows it."""

    label: str
    size: int | None = None
    source: str | None = None
    usual_size: int | None = None
    """A size the axis usually has, for hints only: a nested history's ``B`` may be a
    multiple of the top-level call's, but most often it is that very size."""

    binder: _Site | None = None
    """The call whose argument bound the axis, where a call checks its own leaves against
    axes that another call bound: a nested ``update_statistics`` against the top-level T."""

    source_shape: tuple[int, ...] | None = None
    """The shape of the leaf that bound the axis, for hints only."""

    def bind(
        self,
        size: int,
        source: str,
        binder: _Site | None = None,
        shape: tuple[int, ...] | None = None,
    ) -> bool:
        if self.size is None:
            self.size, self.source, self.binder, self.source_shape = size, source, binder, shape
            return True
        return self.size == size

    def seen_from(self, site: _Site) -> str:
        """The axis as ``site``'s message names it: a leaf of another call's arguments is
        named with that call (a nested call's argument may have the same name)."""
        if self.binder is None or self.binder.module is site.module:
            return str(self)
        return f"{self.label}={self.size} (bound by {self.source} of {self.binder})"

    def __str__(self) -> str:
        if self.size is None:
            return self.label
        return f"{self.label}={self.size} (bound by {self.source})"


def _check_leading(
    site: _Site, axes: tuple[_Axis, ...], name: str, tree: Any, rule: str, what: str
) -> None:
    """Every array leaf of ``tree`` leads with ``axes``, binding any axis not yet bound."""
    pattern = ", ".join(a.label for a in axes) + ", *feat"
    for leaf_name, leaf in named_leaves(name, tree):
        shape = getattr(leaf, "shape", None)
        bound = ", ".join(a.seen_from(site) for a in axes)
        if shape is None or len(shape) < len(axes):
            raise _violation(
                site,
                f"{what} {leaf_name} has no leading ({pattern.removesuffix(', *feat')}) axes.",
                leaf=leaf_name,
                expected=f"({pattern}) with {bound}",
                found=describe_leaf(leaf),
                rule=rule,
            )
        for index, (axis, length) in enumerate(zip(axes, shape, strict=False)):
            size = int(length)
            if not axis.bind(size, leaf_name, site, tuple(map(int, shape))):
                later = [a for a in axes[index + 1 :] if size in (a.size, a.usual_size)]
                dropped = (
                    f"If {size} is a feature size, it has no {axis.label} axis (dropped by a "
                    "reduction or an index, or never added)."
                )
                # Where one step (B, *feat) is taken, a history (T, B, *feat) shows B second.
                one_step = len(axes) == 1
                history = "a (T, B, *feat) history given where one step (B, *feat) is taken"
                binder_shape = axis.source_shape or ()
                if later:
                    hint = (
                        f" Its axis {index} has the size of {later[0].label}: did it lose its "
                        f"{axis.label} axis?"
                    )
                elif (
                    one_step
                    and len(shape) > max(len(binder_shape), 1)
                    and int(shape[1]) == axis.size
                ):
                    hint = (
                        f" Its axis 1 has the size of {axis.label}: does it have an extra "
                        f"leading axis ({history})?"
                    )
                elif one_step and len(binder_shape) > len(shape) and binder_shape[1:2] == (size,):
                    hint = (
                        f" {axis.source} has shape {format_shape(binder_shape)}, {size} on its "
                        f"axis 1: does {axis.source} have an extra leading axis ({history})?"
                    )
                elif axis.size is not None and size < axis.size:
                    hint = (
                        f" {dropped} If not, its {axis.label} axis was cut to {size} of "
                        f"{axis.size} (a slice{' such as [-1:]' * (axis.label == 'T')}): "
                        "pass it whole."
                    )
                else:
                    hint = f" {dropped}"
                raise _violation(
                    site,
                    f"{what} {leaf_name} has {axis.label}={size} on axis "
                    f"{index}, but {axis.seen_from(site)}.{hint}",
                    leaf=leaf_name,
                    expected=f"({pattern}) with {bound}",
                    found=describe_leaf(leaf),
                    rule=rule,
                )


def format_shape(dims: Sequence[int | str]) -> str:
    """A shape written as Python writes a tuple, ``(3,)`` or ``(B, 4)``, names unquoted."""
    return "(" + ", ".join(str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"


def _named_shape(shape: tuple[int, ...], batch: _Axis | None) -> str:
    dims: list[int | str] = list(shape)
    if batch is not None and batch.size is not None and dims and shape[0] == batch.size:
        dims[0] = f"B={batch.size}"
    return format_shape(dims)


def _differing_paths(ref_name: str, ref: Any, name: str, value: Any) -> tuple[list[str], list[str]]:
    """The leaves of ``ref`` that ``value`` lacks, and those it adds, named after ``name``."""
    ref_paths = [p.removeprefix(ref_name) for p, _ in named_leaves(ref_name, ref)]
    val_paths = [p.removeprefix(name) for p, _ in named_leaves(name, value)]
    missing = [name + p for p in ref_paths if p not in val_paths]
    extra = [name + p for p in val_paths if p not in ref_paths]
    return missing, extra


def structure_difference(ref_name: str, ref: Any, name: str, value: Any) -> str:
    """Which leaf paths ``value`` lacks or adds relative to ``ref``, in words."""
    missing, extra = _differing_paths(ref_name, ref, name, value)
    parts = []
    if missing:
        parts.append("missing " + ", ".join(missing[:4]))
    if extra:
        parts.append("unexpected " + ", ".join(extra[:4]))
    if not parts:
        parts.append(f"tree {jax.tree_util.tree_structure(value)}")
    return "; ".join(parts)


def _describe_change(
    ref_shape: tuple[int, ...], shape: tuple[int, ...], ref_dtype: Any, dtype: Any
) -> str:
    """Say how a leaf differs from its reference, naming the classic faults."""
    if ref_shape == shape:
        return f"changed the dtype from {ref_dtype} to {dtype}"
    if shape == ref_shape[1:]:
        return "dropped the leading (batch) axis"
    if len(shape) == len(ref_shape) and shape[1:] == ref_shape[1:]:
        return f"changed the leading (batch) axis from {ref_shape[0]} to {shape[0]}"
    return "changed the shape"


def _check_same_tree(
    site: _Site,
    ref_name: str,
    ref: Any,
    name: str,
    value: Any,
    rule: str,
    batch: _Axis | None,
    compare_dtype: bool = True,
) -> None:
    """``value`` has the tree structure, shapes (and dtypes) of ``ref``."""
    ref_def = jax.tree_util.tree_structure(ref)
    val_def = jax.tree_util.tree_structure(value)
    if ref_def != val_def:
        missing, extra = _differing_paths(ref_name, ref, name, value)
        raise _violation(
            site,
            f"{name} does not have the tree structure of {ref_name}.",
            # The first leaf missing or unexpected; the tree itself when only nodes differ.
            leaf=(*missing, *extra, name)[0],
            expected=f"the structure of {ref_name}: {ref_def}",
            found=structure_difference(ref_name, ref, name, value),
            rule=rule,
        )
    for (ref_leaf_name, ref_leaf), (leaf_name, leaf) in zip(
        named_leaves(ref_name, ref), named_leaves(name, value), strict=True
    ):
        ref_shape = getattr(ref_leaf, "shape", None)
        shape = getattr(leaf, "shape", None)
        if ref_shape is None or shape is None:
            continue
        # Compared as JAX holds them: a NumPy float64 carry is float32 once jitted.
        same_dtype = not compare_dtype or held_dtype(ref_leaf.dtype) == held_dtype(leaf.dtype)
        if tuple(ref_shape) != tuple(shape) or not same_dtype:
            change = _describe_change(tuple(ref_shape), tuple(shape), ref_leaf.dtype, leaf.dtype)
            raise _violation(
                site,
                f"{leaf_name} does not match {ref_leaf_name}: it {change}.",
                leaf=leaf_name,
                expected=f"{_named_shape(tuple(ref_shape), batch)} {ref_leaf.dtype} "
                f"(as {ref_leaf_name})",
                found=f"shape {tuple(shape)} {leaf.dtype}",
                rule=rule,
            )


# ------------------------------------------------------------------ annotation layer


_RULE_ANNOTATIONS = rule_text(
    "annotations a module writes on its own methods are checked, with dimension names "
    "bound across the call",
    "what-is-checked-and-when",
)


def _annotation_violation(
    site: _Site | str, mismatch: AnnotationMismatch, rule: str = _RULE_ANNOTATIONS
) -> ContractError:
    return _violation(
        site,
        mismatch.problem(),
        leaf=mismatch.leaf,
        expected=mismatch.expected(),
        found=mismatch.found(),
        rule=rule,
    )


def _call_annotated(site: _Site, typed: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return typed(*args, **kwargs)
    except AnnotationMismatch as mismatch:
        raise _annotation_violation(site, mismatch) from None


_CallArguments = TypeVar("_CallArguments", tuple[Any, ...], dict[str, Any])


def _python_ints(arguments: _CallArguments) -> _CallArguments:
    """``arguments`` with NumPy integers as Python ints: a NumPy count is an int to the
    library (``require_int``), so to annotations saying ``int`` too."""
    if isinstance(arguments, dict):
        return {k: int(v) if isinstance(v, np.integer) else v for k, v in arguments.items()}
    return tuple(int(a) if isinstance(a, np.integer) else a for a in arguments)


def typechecked(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Check ``fn``'s jaxtyping annotations on every call while the checks are on.

    For the engine's public functions (``gae``, ``ppo_loss``, ``unroll_env``, ...):
    dimension names (``T``, ``B``) are bound across the call's arguments and result,
    and a mismatch raises :class:`~nnx_ppo.ContractError` naming the function, the
    argument and leaf, the annotation with its bound sizes, and what was passed. Under
    ``jax.jit`` the check runs once, while JAX traces.
    """
    # The fields of the engine's records are left unchecked: a record holds one step or,
    # stacked, a rollout (a PPONetworkOutput's (B,) leaves are (T, B) in a Transition),
    # and its field annotations describe the step.
    typed = checked_leaf_by_leaf(fn, typing.get_type_hints(fn), lambda record: False)
    where = fn.__qualname__

    @functools.wraps(fn)
    def checked(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        if not checks_enabled():
            return fn(*args, **kwargs)
        try:
            return typed(*_python_ints(args), **_python_ints(kwargs))
        except AnnotationMismatch as mismatch:
            raise _annotation_violation(where, mismatch, _RULE_FUNCTION_ANNOTATIONS) from None

    return checked


# ------------------------------------------------------------------------- the methods


def _bound_arguments(
    signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[tuple[str, Any]]:
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return list(bound.arguments.items())


_CALLED_WITH = {
    "__call__": (
        "__call__(self, state, x, rollout_extras=None)",
        ("state, x", "state, x, rollout_extras"),
    ),
    "initialize_state": ("initialize_state(self, batch_size)", ("batch_size",)),
    "reset_state": ("reset_state(self, prev_state)", ("prev_state",)),
    "update_statistics": ("update_statistics(self, rollout_extras)", ("rollout_extras",)),
}
"""Each contract method's signature, and the positional arguments the library calls it with."""


class _ContractForms:
    """The contract methods as the library calls them: their parameters name the
    arguments of a method whose own signature does not, ``(*args, **kwargs)``."""

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> Any: ...
    def initialize_state(self, batch_size: Any) -> Any: ...
    def reset_state(self, prev_state: Any) -> Any: ...
    def update_statistics(self, rollout_extras: Any) -> Any: ...


def _require_callable_as_the_library_calls(
    cls: type, method: str, signature: inspect.Signature
) -> None:
    """Refuse, when the class is made, a contract method the library's calls cannot bind."""
    contract_signature, calls = _CALLED_WITH[method]
    for names in calls:
        try:
            signature.bind(None, *names.split(", "))
        except TypeError as error:
            written = signature.replace(  # as written, less annotations
                parameters=[
                    parameter.replace(annotation=inspect.Parameter.empty)
                    for parameter in signature.parameters.values()
                ],
                return_annotation=inspect.Signature.empty,
            )
            raise TypeError(
                f"{cls.__name__}.{method}{written} cannot be called as the library "
                f"calls it, with ({names}): {error}. Define {contract_signature} "
                f"(see {DOCS_URL}contract.html#rules)."
            ) from None


_Arguments = list[tuple[str, Any]]
"""A call's arguments after ``self``, as (parameter name, value) pairs."""

_Check = Callable[[_Site, _Arguments, Callable[[], Any]], Any]
"""Checks one call: given where it runs, its arguments, and the (annotation-checked)
method to run, it returns the method's result or raises ``ContractError``."""


@dataclass(frozen=True)
class CallRecord:
    """One checked contract-method call, as seen by an observer (see :func:`observe_calls`).

    Attributes:
      module: the module whose method ran.
      method: ``"__call__"``, ``"initialize_state"``, ``"reset_state"`` or
        ``"update_statistics"``.
      depth: how many checked calls enclose this one (0 for a top-level call).
      arguments: the call's arguments after ``self``, as (parameter name, value) pairs.
      result: what the method returned, or ``None`` when it raised.
      error: the error it raised, or ``None``.
      in_transform: whether the call ran inside a JAX or NNX transform entered after
        the observer was (a ``scan``, ``vmap``, ``cond`` or ``checkpoint`` inside a
        container's method): its arguments and result are that transform's tracers,
        which cannot be kept past it, and its module may be the transform's copy.
    """

    module: Any
    method: str
    depth: int
    arguments: tuple[tuple[str, Any], ...]
    result: Any
    error: BaseException | None
    in_transform: bool = False


@contextlib.contextmanager
def observe_calls(observer: Callable[[CallRecord], None]) -> Iterator[None]:
    """Call ``observer`` with a :class:`CallRecord` after every checked call in the block.

    Records arrive innermost first (a child's call before its container's), each once,
    also for a call that raised. Used by :func:`nnx_ppo.summary`; the checks must be on.
    """
    token = _CALL_OBSERVERS.set((*_CALL_OBSERVERS.get(), (observer, get_opaque_trace_state())))
    try:
        yield
    finally:
        _CALL_OBSERVERS.reset(token)


def _checked(
    cls: type, fn: Callable[..., Any], method: str, check: _Check, output_type: type
) -> Callable[..., Any]:
    """``cls``'s method ``fn`` (named ``method``), run by ``check`` when checks are on.

    The fields of the records its annotations name are checked too, but the
    ``output_type``'s: the contract checks a ``__call__``'s output by its own rules,
    right after the annotations, and names the rule each field breaks.
    """
    typed = annotation_checked(
        fn, f"{cls.__qualname__}.{method}", lambda record: record is not output_type
    )
    signature = inspect.signature(fn)
    _require_callable_as_the_library_calls(cls, method, signature)
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in signature.parameters.values()):
        # A decorator's (*args, **kwargs) wrapper without functools.wraps: its arguments
        # are the contract's, named as the contract names them.
        signature = inspect.signature(getattr(_ContractForms, method))

    @functools.wraps(fn)
    def checked(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not checks_enabled():
            return fn(self, *args, **kwargs)
        running = _RUNNING_METHOD.get()
        if running is not None and running[:2] == (id(self), method) and running[2] is not cls:
            # A subclass's method calling super()'s: one call of the module, which the
            # outermost method checks and observers see once; the annotations of the
            # method it reaches are its own, and checked: a mismatch names that method's
            # class, whose annotation it broke, beside the method the call entered.
            return _call_annotated(_Site(self, method, cls), typed, self, *args, **kwargs)
        if method == "initialize_state":
            args, kwargs = _python_ints(args), _python_ints(kwargs)
        arguments = _bound_arguments(signature, (self, *args), kwargs)[1:]
        site = _Site(self, method)
        depth = len(_ACTIVE_MODULES.get())
        result: Any = None
        error: BaseException | None = None
        token = _RUNNING_METHOD.set((id(self), method, cls))
        try:
            with _entered(self):
                run = functools.partial(_call_annotated, site, typed, self, *args, **kwargs)
                result = check(site, arguments, run)
            return result
        except BaseException as raised:
            error = raised
            raise
        finally:
            _RUNNING_METHOD.reset(token)
            observers = _CALL_OBSERVERS.get()
            trace = get_opaque_trace_state() if observers else None
            for observer, entered in observers:
                record = CallRecord(
                    self, method, depth, tuple(arguments), result, error, trace != entered
                )
                observer(record)

    setattr(checked, _CHECKED_MARK, (method, checked))
    return checked


def _checked_method(function: Any) -> str | None:
    """The contract method ``function`` checks, where it is a wrapper :func:`_checked` made."""
    mark = getattr(function, _CHECKED_MARK, None)
    return mark[0] if isinstance(mark, tuple) and mark[1] is function else None


def _leaves_as_given(arguments: _Arguments) -> dict[str, list[tuple[str, Any]]]:
    """Each argument's leaves by path, to compare after the call (the leaves themselves
    are kept: an identity compared with ``is`` cannot be reused by a new object)."""
    return {name: named_leaves(name, value) for name, value in arguments}


def _check_arguments_unchanged(
    site: _Site, method: str, arguments: _Arguments, given: dict[str, list[tuple[str, Any]]]
) -> None:
    """A container of an argument changed in place by the call: a leaf replaced, added
    or removed (``state["t"] = t + 1``)."""
    for name, value in arguments:
        now = named_leaves(name, value)
        before = given[name]
        if len(now) == len(before) and all(
            path == old_path and leaf is old_leaf
            for (path, leaf), (old_path, old_leaf) in zip(now, before, strict=True)
        ):
            continue
        old_leaves, new_leaves = dict(before), dict(now)
        changes = [
            *(
                (path, "replaced")
                for path in new_leaves.keys() & old_leaves.keys()
                if new_leaves[path] is not old_leaves[path]
            ),
            *((path, "added") for path in new_leaves.keys() - old_leaves.keys()),
            *((path, "removed") for path in old_leaves.keys() - new_leaves.keys()),
        ]
        changed, how = min(changes, default=(name, "reordered"))
        raise _violation(
            site,
            f"{method} changed its argument {name} in place, at {changed}.",
            leaf=changed,
            expected=f"{name} as it was given, and a new tree returned",
            found=f"{changed} {how} during the call",
            rule=_RULE_ARGUMENTS_UNCHANGED,
        )


def _check_call(
    output_type: type, site: _Site, arguments: _Arguments, call: Callable[[], Any]
) -> Any:
    if len(arguments) < 2:
        raise TypeError(f"{describe_module(site.module)}.__call__ takes (state, x, rollout_extras)")
    (state_name, state), (x_name, x) = arguments[0], arguments[1]
    given_extras_name, given_extras = arguments[2] if len(arguments) > 2 else ("", None)
    batch = _Axis("B")
    _check_leading(site, (batch,), x_name, x, _RULE_ONE_B, "argument")
    _check_leading(site, (batch,), state_name, state, _RULE_ONE_B, "argument")
    _check_leading(site, (batch,), given_extras_name, given_extras, _RULE_ONE_B, "argument")
    checks_writes = _checks_writes_here(site.module)
    before = (
        _variable_values(site.module, _is_forward_state, attributes=True) if checks_writes else {}
    )
    given = _leaves_as_given(arguments)
    try:
        result = call()
    except TraceContextError as error:
        raise _write_in_transform_violation(site, _variable_written_in(error)) from error
    _check_arguments_unchanged(site, "__call__", arguments, given)
    if checks_writes:
        _check_unwritten(
            site, before, "__call__", RULE_NO_WRITES, _is_forward_state, attributes=True
        )
    if not isinstance(result, output_type):
        raise _violation(
            site,
            f"returned a {type(result).__name__}, not a {output_type.__name__}.",
            rule="__call__ returns StatefulModuleOutput(next_state, output, "
            "regularization_loss, metrics, rollout_extras)",
        )
    _check_same_tree(site, state_name, state, "next_state", result.next_state, _RULE_CARRY, batch)
    _check_leading(site, (batch,), "output", result.output, _RULE_ONE_B, "returned")
    _check_leading(
        site,
        (batch,),
        "rollout_extras",
        result.rollout_extras,
        _RULE_ONE_B,
        "returned",
    )
    if given_extras is not None:
        _check_same_tree(
            site,
            given_extras_name,
            given_extras,
            "returned rollout_extras",
            result.rollout_extras,
            _RULE_REPLAY,
            batch,
            compare_dtype=False,
        )
    _check_regularization(site, result.regularization_loss, batch)
    _check_metrics(site, result.metrics, batch)
    structure = _structure_key(site.module)
    _EMISSIONS.remember(structure, result.rollout_extras)
    _CARRIES.remember(structure, state)
    return result


# ------------------------------------------------------------------ variable writes


def _is_forward_state(variable: nnx.Variable[Any]) -> bool:
    """Variables a forward pass must leave alone: all but the intermediates ``sow`` and
    ``nnx.capture`` keep, which no forward pass reads. An ``nnx.Rngs`` stream's counter
    is one: a draw from it in ``__call__`` would differ between rollout and replay."""
    return not isinstance(variable, nnx.Intermediate)


def _any_variable(variable: nnx.Variable[Any]) -> bool:
    return True


def _is_rng_stream(holder: _Held) -> bool:
    """An ``nnx.Rngs`` stream's state, which ``initialize_state`` may draw from: it seeds
    the carry's per-env keys."""
    return isinstance(holder, nnx.RngState)


@dataclass(frozen=True)
class _Attribute:
    """A value a module holds outside a Variable, found at ``path`` by the graph walk (a
    plain attribute, an element of an ``nnx.List``, ``nnx.Dict`` or tuple): an array
    (JAX or NumPy), which is Flax NNX state too, or any other value (a number, a string,
    an enum, a NumPy scalar, a dataclass, a function), which NNX keeps static. A write
    replaces either where it lives. ``held`` is the value's type where known."""

    root: Any
    path: tuple[Any, ...]
    held: type | None = None

    @property
    def static(self) -> bool:
        return self.held is not None and not issubclass(self.held, jax.Array | np.ndarray)

    @property
    def kind(self) -> str:
        if self.held is None:
            return "an attribute"
        if not self.static:
            return "an array attribute"
        if self.held.__module__ == "builtins":
            return f"a Python {self.held.__name__} attribute"
        return f"a static attribute of type {self.held.__name__}"


_Held = nnx.Variable[Any] | _Attribute


_Include = Callable[[nnx.Variable[Any]], bool]


def _variable_values(
    root: Any, include: _Include, *, attributes: bool = False
) -> dict[tuple[Any, ...], tuple[_Held, Any]]:
    """Each included variable under ``root`` by path, with the value it holds now; with
    ``attributes``, each array and Python value held outside a variable too.

    The value's containers are copied (its leaves are not, but writeable NumPy arrays),
    so a dict value changed in place still shows what it held.
    """
    return {
        path: (holder, jax.tree.map(_snapshot, value))
        for path, (holder, value) in _holders(root, include, attributes=attributes).items()
    }


def _holders(
    root: Any, include: _Include, *, attributes: bool
) -> dict[tuple[Any, ...], tuple[_Held, Any]]:
    """:func:`_variable_values`'s holders by path with their values as they are (not
    copied); ``nnx.capture``'s intermediates left out, and hijax variables while
    traced (each read of one is a new tracer: nothing to compare)."""
    held: dict[tuple[Any, ...], tuple[_Held, Any]] = {}
    walk = [(tuple(path), node) for path, node in nnx.iter_graph(root) if _CAPTURES not in path]
    flax_nodes = {path for path, node in walk if type(node).__module__.startswith("flax.")}
    for path, node in walk:
        if isinstance(node, nnx.Variable) and include(node):
            value = node.get_raw_value()
            if not (getattr(node, "hijax", False) and _traced(value)):
                held[path] = (node, value)
        elif not (attributes and path):
            continue
        elif (
            isinstance(node, jax.Array | np.ndarray)
            or (
                _is_static_value(node)
                # NNX's own record of a node, and a Flax container's own bookkeeping (an
                # nnx.List's length), follow what it holds, which is compared itself.
                and not str(path[-1]).startswith("_pytree__")
                and not (str(path[-1]).startswith("_") and path[:-1] in flax_nodes)
            )
        ):
            held[path] = (_Attribute(root, path, _value_type(node)), node)
    return held


def _is_static_value(node: Any) -> bool:
    """A value the graph walk yields that NNX keeps static (in the graph's definition):
    neither a variable, an array nor a node holding others; ``None`` is taken as
    nothing held, so that a value put in its place is named as added."""
    return not (
        node is None
        or isinstance(node, nnx.Variable | jax.Array | np.ndarray)
        or graphlib.is_node(node)
    )


def _traced(tree: Any) -> bool:
    return any(isinstance(leaf, Tracer) for leaf in jax.tree.leaves(tree))


def _snapshot(leaf: Any) -> Any:
    """``leaf`` as it is now: a writeable NumPy array copied (it may be changed in
    place), any other leaf itself (JAX arrays are immutable)."""
    return np.copy(leaf) if isinstance(leaf, np.ndarray) and leaf.flags.writeable else leaf


def _same_value(now: Any, before: Any) -> bool:
    """``now`` holds the leaves ``before`` did, in the same tree: the very objects, or
    concrete arrays of equal values (an eager ``nnx.jit`` hands every variable back as a
    new array)."""
    leaves_now, tree_now = jax.tree.flatten(now)
    leaves_before, tree_before = jax.tree.flatten(before)
    return tree_now == tree_before and all(
        a is b or _equal_concrete(a, b) for a, b in zip(leaves_now, leaves_before, strict=True)
    )


def _equal_concrete(a: Any, b: Any) -> bool:
    """``a`` (a leaf now) holds what ``b`` (the leaf before the call) held."""
    if isinstance(a, Tracer) or isinstance(b, Tracer):
        return False
    if isinstance(a, jax.Array) and not isinstance(b, jax.Array):
        # An eager NNX transform hands a NumPy array or a Python number back as a JAX
        # array, in JAX's dtype for it (float32 for a float64 without x64). Integers
        # must hold the same numbers: int64 wrapped into int32 is another value.
        try:
            held, b = np.asarray(b), jnp.asarray(b)
            if held.dtype.kind in "iub" and not np.array_equal(np.asarray(b), held):
                return False
        except (TypeError, ValueError, OverflowError):
            return False
    arrays = jax.Array | np.ndarray
    if not (isinstance(a, arrays) and isinstance(b, arrays)):
        return _equal_static(a, b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if is_key(a):
        a, b = jax.random.key_data(a), jax.random.key_data(b)
    # Bytes, not values: a NaN held and handed back unchanged is equal to itself.
    return np.asarray(a).tobytes() == np.asarray(b).tobytes()


def _equal_static(a: Any, b: Any) -> bool:
    """Static values that are equal, or both NaN (kept, not equal to itself); an object
    that cannot say whether it is equal is taken as changed. Types are not compared: an
    eager ``nnx.jit`` shared by two modules hands each the static values of the call it
    compiled for, equal but maybe of another type (``np.float32`` for ``jnp.float32``)."""
    try:
        return bool(a == b) or bool(a != a and b != b)
    except Exception:  # whatever a user's __eq__ raises
        return False


def _describe_variable(root: Any, path: tuple[Any, ...] | None, variable: Any) -> str:
    if variable is None:
        return "a variable or attribute"
    kind = variable.kind if isinstance(variable, _Attribute) else type(variable).__name__
    if path is None:
        return kind if isinstance(variable, _Attribute) else f"a {kind} variable"
    return f"{type(root).__name__}{format_graph_path(root, path)} ({kind})"


def _check_unwritten(
    site: _Site,
    before: dict[tuple[Any, ...], tuple[_Held, Any]],
    method: str,
    rule: str,
    include: _Include,
    *,
    attributes: bool = False,
    may_write: Callable[[_Held], bool] = lambda holder: False,
) -> None:
    """Nothing ``before`` holds was written, replaced or removed during ``site``'s call
    (but what ``may_write`` allows written or replaced), and nothing of its kinds was
    added (a new array attribute, an element appended to an ``nnx.List``, a variable made
    in the call)."""
    # While JAX traces, a write of a new value and an NNX transform's write-back of the
    # same value look alike: a tracer of the same shape and dtype. A transform hands back
    # every variable it ran with, parameters too, which no module writes on purpose.
    held = _holders(site.module, include, attributes=attributes)
    written_back = any(
        isinstance(holder, nnx.Param) and _rewritten_in_kind(held[path][1], value)
        for path, (holder, value) in before.items()
        if path in held
    )
    for path, (holder, value) in before.items():
        now = held[path][1] if path in held else None
        if path not in held:
            change = "removed"
        elif may_write(holder) and _same_kind(held[path][0], holder):
            continue
        elif held[path][0] is not holder and not (
            isinstance(holder, _Attribute) and _same_kind(held[path][0], holder)
        ):
            change = "replaced"
        elif _same_value(now, value):
            continue
        else:
            change = "wrote"
        name = _describe_variable(site.module, path, holder)
        owner = _Site(_owner(site.module, path), site.method)
        if change == "wrote" and isinstance(holder, nnx.RngState):
            raise _rng_draw_violation(owner, name, method)
        problem = f"{method} {change} {_the(holder)}{name}." + _why(holder, change)
        if change == "wrote" and written_back and _rewritten_in_kind(now, value):
            problem += (
                " Each of its arrays was replaced by a traced one of the same shape and "
                "dtype. If your code does not assign it, an NNX transform inside the call "
                "(nnx.remat, nnx.jit) did: it hands every variable it ran with back as a "
                "new array, changed or not; apply jax.checkpoint or jax.jit to the child's "
                "nnx.split state and nnx.merge it inside instead."
            )
        raise _violation(
            owner,
            problem,
            leaf=name,
            expected="the value it held before the call",
            found=f"{name} {'written' if change == 'wrote' else change} during the call",
            rule=rule,
        )
    # Variables and arrays first: a Python value added with them (an nnx.Rngs stream's
    # tag) says less of what was added.
    for path in sorted(held.keys() - before.keys(), key=lambda p: _static_last(held[p][0], p)):
        added = held[path][0]
        name = _describe_variable(site.module, path, added)
        raise _violation(
            _Site(_owner(site.module, path), site.method),
            f"{method} added {_the(added)}{name}." + _why(added, "added"),
            leaf=name,
            expected="only what the module held before the call",
            found=f"{name} added during the call",
            rule=rule,
        )


def _same_kind(now: _Held, before: _Held) -> bool:
    """Whether ``now`` holds what ``before`` did in kind: a variable of the same type, or
    an array for an array and a static value for a static value."""
    if isinstance(now, _Attribute) and isinstance(before, _Attribute):
        return now.static == before.static
    return type(now) is type(before)


def _static_last(holder: _Held, path: tuple[Any, ...]) -> tuple[bool, int, str]:
    return isinstance(holder, _Attribute) and holder.static, len(path), str(path)


def _the(holder: _Held | None) -> str:
    return "the variable " if isinstance(holder, nnx.Variable) else ""


def _why(holder: _Held, change: str) -> str:
    """Why a change of ``holder`` in a call is one, where its kind does not say it."""
    if isinstance(holder, _Attribute) and holder.static:
        return (
            " A Python value is static to JAX: set in a call, it changes while JAX traces, "
            "once per compilation, not at each compiled call (a counter counts traces). "
            "Keep what changes per step in the carry, and statistics in an nnx.BatchStat "
            "written by update_statistics."
        )
    if isinstance(holder, _Attribute):
        return (
            " An array held outside an nnx.Variable is module state too: in a compiled "
            "call the change is lost. Keep a statistic in an nnx.BatchStat written by "
            "update_statistics, and what changes per step in the carry."
        )
    if change == "replaced":
        return " A new Variable object in its place is a write too, lost in a compiled call."
    if change == "added":
        return " State made in a call is lost in a compiled one: make it in __init__."
    return ""


def _checks_writes_here(module: Any) -> bool:
    """Whether a call of ``module`` takes the snapshot the write checks compare: the
    top-level call does, for everything under it, and so does a call of a module
    outside the top-level module's graph (a child's ``nnx.split`` state merged inside
    ``jax.checkpoint`` or ``jax.jit``, an ``nnx.vmap``'s copy of its members), whose
    state no outer snapshot holds."""
    stack = _ACTIVE_MODULES.get()
    if len(stack) <= 1:
        return True
    graph = _TOP_LEVEL_GRAPH.get()
    if graph is None:
        graph = frozenset(id(node) for _, node in nnx.iter_graph(stack[0]))
        _TOP_LEVEL_GRAPH.set(graph)
    return id(module) not in graph


def _owner(root: Any, path: tuple[Any, ...]) -> Any:
    """The innermost contract module under ``root`` holding the variable at ``path``."""
    modules = {
        tuple(node_path): node
        for node_path, node in nnx.iter_graph(root)
        if _is_contract_module(node)
    }
    for end in range(len(path) - 1, 0, -1):
        if path[:end] in modules:
            return modules[path[:end]]
    return root


def _rewritten_in_kind(now: Any, before: Any) -> bool:
    """Whether every leaf of ``now`` is a tracer standing where a leaf of the same shape
    and dtype stood: a write-back whose values cannot be compared while JAX traces."""
    leaves_now, tree_now = jax.tree.flatten(now)
    leaves_before, tree_before = jax.tree.flatten(before)
    return (
        tree_now == tree_before
        and bool(leaves_now)
        and all(
            isinstance(a, Tracer)
            and a is not b
            and getattr(b, "shape", None) == a.shape
            and getattr(b, "dtype", None) == a.dtype
            for a, b in zip(leaves_now, leaves_before, strict=True)
        )
    )


def _value_type(value: Any) -> type | None:
    """What :class:`_Attribute` names ``value`` by: an array (a tracer included), a
    static value's own type, or nothing known."""
    if isinstance(value, jax.Array | np.ndarray):
        return jax.Array
    return type(value) if _is_static_value(value) else None


def _variable_written_in(error: BaseException) -> nnx.Variable[Any] | _Attribute | None:
    """What the write that raised ``error`` wrote, from its traceback: an
    ``nnx.Variable``, an attribute of a module (as an :class:`_Attribute` of that
    module), or ``None``."""
    written = None
    frame = error.__traceback__
    while frame is not None:
        local = frame.tb_frame.f_locals
        candidate = local.get("self")
        if isinstance(candidate, nnx.Variable):
            written = candidate
        elif (
            frame.tb_frame.f_code.co_name == "__setattr__"
            and isinstance(candidate, nnx.Pytree)
            and isinstance(local.get("name"), str)
        ):
            written = _Attribute(candidate, (local["name"],), _value_type(local.get("value")))
        frame = frame.tb_next
    return written


def _write_in_transform_violation(site: _Site, variable: Any) -> ContractError:
    """``site.method`` (``__call__`` or ``reset_state``) wrote ``variable`` inside a JAX
    transform, where Flax raised ``TraceContextError``."""
    stack = _ACTIVE_MODULES.get()
    root = stack[0] if stack else site.module
    if isinstance(variable, _Attribute):  # an attribute assigned: its owner's path
        owner_path = _graph_path(root, variable.root)
        path = None if owner_path is None else (*owner_path, *variable.path)
    else:
        path = None if variable is None else _graph_path(root, variable)
    if isinstance(variable, _Attribute) and path is None:
        owner = type(variable.root).__name__
        name = f"{owner}.{variable.path[-1]} (an attribute of a {owner} outside the module)"
    else:
        name = _describe_variable(root, path, variable)
    method = site.method
    if isinstance(variable, nnx.RngState):
        return _rng_draw_violation(site, name, method)
    return _violation(
        site,
        f"{method} wrote {_the(variable)}{name} inside a JAX transform (Flax refuses the "
        "write: it belongs to an outer trace).",
        leaf=name,
        expected=f"no variable written in {method}",
        found=f"a write to it during {method}",
        rule=RULE_NO_WRITES if method == "__call__" else _RULE_RESET_NO_WRITES,
    )


def _rng_draw_violation(site: _Site, name: str, method: str) -> ContractError:
    return _violation(
        site,
        f"{method} drew from an nnx.Rngs stream ({name} advanced). Its draws would "
        "differ between the rollout and the loss's replay, and follow each env's row in "
        "the batch: keep per-env keys in the carry instead (new_env_keys in "
        "initialize_state, split_env_keys in __call__ and reset_state; for nnx.Dropout, "
        "pass rngs=nnx.Rngs(dropout=key) per env under jax.vmap).",
        leaf=name,
        expected=f"no nnx.Rngs stream advanced in {method}",
        found=f"a draw from it during {method}",
        rule=RULE_RANDOMNESS,
    )


# ---------------------------------------------------------------- the emission record


_Spec = tuple[tuple[str, tuple[int, ...] | None, str], ...]
"""What a module emitted: per leaf, its path, its trailing shape (after ``B``) and dtype.

Paths rather than tree definitions, so a ``FrozenDict`` history matches a ``dict``
emission with the same keys."""


def _emission_spec(extras: Any, leading: int = 1) -> _Spec:
    """The spec of ``extras`` whose leaves lead with ``leading`` axes (1 emitted, 2 stacked)."""
    return tuple(
        (
            jax.tree_util.keystr(path),
            tuple(int(d) for d in leaf.shape[leading:]) if hasattr(leaf, "shape") else None,
            str(getattr(leaf, "dtype", "")),
        )
        for path, leaf in jax.tree_util.tree_flatten_with_path(extras)[0]
    )


def _structure_key(module: Any) -> Any:
    """What identifies a module across copies: its graph definition, variable shapes and
    plain settings.

    Under ``nnx.jit``, a scan or ``split``/``merge`` a module is a new Python object
    each trace; the rollout's copy and the one ``update_statistics`` runs on share this.
    Read off ``nnx.iter_graph`` (no key sorting: under ``nnx.capture`` an ``nnx.List``
    holds a string key beside its indices), leaving out the intermediates a capture or
    ``sow`` adds for the call.
    """
    key: list[tuple[Any, ...]] = []
    for path, node in nnx.iter_graph(module):
        if isinstance(node, nnx.Intermediate) or _CAPTURES in path:
            continue
        if isinstance(node, nnx.Variable):
            value = node.get_raw_value()
            leaves = [
                (getattr(leaf, "shape", None), str(getattr(leaf, "dtype", "")))
                for leaf in jax.tree.leaves(value)
            ]
            key.append((tuple(path), type(node), tuple(leaves)))
        elif isinstance(node, _SETTINGS):
            key.append((tuple(path), type(node), node))
        elif isinstance(node, jax.ShapeDtypeStruct):  # a shape kept as a setting (a delay's)
            key.append((tuple(path), type(node), tuple(node.shape), str(node.dtype)))
        else:
            key.append((tuple(path), type(node)))
    return tuple(key)


_SETTINGS = (bool, int, float, str, type(None))
"""Plain attributes held in a structure's key by value: a module's settings (a delay
line's length), which tell modules without variables apart."""


_CAPTURES = "__captures__"
"""The attribute ``nnx.capture`` adds to every module for the call's intermediates."""


class _EmissionRecord:
    """Per module structure, the tree specs its checked calls produced: the
    ``rollout_extras`` it emitted, or the carry it built and was given.

    Bounded: the oldest structures are forgotten first, and a few specs are kept per
    structure (a module whose emissions follow its input's shape may emit several;
    modules of one structure differ only in what their keys leave out). A structure
    that had a spec forgotten is no longer checked: what it holds now may not be what
    a module of it was given.
    """

    _MAX_STRUCTURES = 512
    _MAX_SPECS = 16

    def __init__(self) -> None:
        self._specs: dict[Any, dict[_Spec, None]] = {}
        self._incomplete: set[Any] = set()

    def remember(self, key: Any, extras: Any) -> None:
        """Record ``extras`` for the structure ``key`` (:func:`_structure_key`)."""
        specs = self._specs.pop(key, {})
        specs.pop(spec := _emission_spec(extras), None)
        specs[spec] = None
        while len(specs) > self._MAX_SPECS:
            del specs[next(iter(specs))]
            self._incomplete.add(key)
        self._specs[key] = specs
        while len(self._specs) > self._MAX_STRUCTURES:
            self._incomplete.discard(forgotten := next(iter(self._specs)))
            del self._specs[forgotten]

    def recorded(self, module: Any) -> list[_Spec]:
        """What was recorded for ``module``'s structure, newest first; empty when nothing
        was or when a spec of it was forgotten."""
        key = _structure_key(module)
        if key in self._incomplete:
            return []
        return list(reversed(self._specs.get(key, {})))


_EMISSIONS = _EmissionRecord()
_CARRIES = _EmissionRecord()
"""The carry each module structure's checked ``initialize_state`` built and its checked
``__call__`` was given: what its ``reset_state`` must be given (with any leading axes:
the batch, none under ``vmap``, or a container's entity axis besides)."""


def _is_carry_of(spec: _Spec, carry: Any) -> bool:
    """``carry`` has ``spec``'s leaves, dtypes and per-env shapes, after any leading axes."""
    given = _emission_spec(carry, leading=0)
    if [path for path, _, _ in given] != [path for path, _, _ in spec]:
        return False
    for (_, shape, dtype), (_, given_shape, given_dtype) in zip(spec, given, strict=True):
        if shape is None or given_shape is None:
            continue
        trailing = given_shape[len(given_shape) - len(shape) :] if shape else ()
        if dtype != given_dtype or len(given_shape) < len(shape) or trailing != shape:
            return False
    return True


def _check_own_carry(site: _Site, name: str, carry: Any) -> None:
    """``carry`` is what ``site.module``'s ``initialize_state`` builds; unchecked when
    nothing was recorded for its structure."""
    built = _CARRIES.recorded(site.module)
    if not built or any(_is_carry_of(spec, carry) for spec in built):
        return
    leaves = ", ".join(
        f"{name}{path} (..., {', '.join(map(str, shape or ()))}) {dtype}".replace(
            "(..., )", "(...)"
        )
        for path, shape, dtype in built[0]
    )
    raise _violation(
        site,
        f"was given a carry that is not the one its initialize_state builds (called by "
        f"{_caller()}): a container routed it another module's slice of the carry.",
        leaf=name,
        expected=f"the leaves its initialize_state returns: {leaves or 'none (an empty carry)'}",
        found=", ".join(
            f"{leaf_name} {describe_leaf(leaf)}"
            for leaf_name, leaf in named_leaves(name, carry)[:4]
        )
        or "no leaves",
        rule=_RESET_ROUTING.rule,
    )


def _check_regularization(site: _Site, loss: Any, batch: _Axis) -> None:
    if isinstance(loss, int | float) and not isinstance(loss, bool):
        return  # a Python number is a scalar, as in metrics
    shape = getattr(loss, "shape", None)
    if shape is not None and (len(shape) == 0 or (len(shape) == 1 and batch.bind(shape[0], ""))):
        return
    raise _violation(
        site,
        "regularization_loss is neither a scalar nor one value per sample.",
        leaf="regularization_loss",
        expected=f"() or (B,) with {batch}",
        found=describe_leaf(loss),
        rule=_RULE_REG,
    )


def _check_metrics(site: _Site, metrics: Any, batch: _Axis) -> None:
    for leaf_name, leaf in named_leaves("metrics", metrics):
        shape = getattr(leaf, "shape", ())
        if len(shape) == 0 or batch.bind(int(shape[0]), leaf_name):
            continue
        raise _violation(
            site,
            f"metric {leaf_name} is neither a scalar nor batched.",
            leaf=leaf_name,
            expected=f"() or (B, *feat) with {batch}",
            found=describe_leaf(leaf),
            rule=_RULE_METRICS,
        )


def _check_initialize_state(site: _Site, arguments: _Arguments, call: Callable[[], Any]) -> Any:
    (size_name, batch_size), *_ = arguments
    try:
        require_int(str(site), size_name, batch_size)
    except (TypeError, ValueError):
        # A ContractError, as every violation of the module protocol is.
        raise _violation(
            site, f"{size_name} must be a positive int.", leaf=size_name, found=repr(batch_size)
        ) from None
    checks_writes = _checks_writes_here(site.module)
    before = (
        _variable_values(site.module, _is_forward_state, attributes=True) if checks_writes else {}
    )
    state = call()
    if checks_writes:
        _check_unwritten(
            site,
            before,
            "initialize_state",
            _RULE_INIT_NO_WRITES,
            _is_forward_state,
            attributes=True,
            may_write=_is_rng_stream,
        )
    batch = _Axis("B", batch_size, size_name)
    _check_leading(site, (batch,), "state", state, _RULE_INIT, "returned")
    _CARRIES.remember(_structure_key(site.module), state)
    return state


def _check_reset_state(site: _Site, arguments: _Arguments, call: Callable[[], Any]) -> Any:
    (prev_name, prev), *_ = arguments
    outer = _RESET_REACHED.get()
    reached: dict[int, type] = {} if outer is None else outer
    token = _RESET_REACHED.set(reached) if outer is None else None
    try:
        reached[id(site.module)] = type(site.module)
        if outer is not None:
            _check_own_carry(site, prev_name, prev)
        checks_writes = token is not None or _checks_writes_here(site.module)
        before = (
            _variable_values(site.module, _is_forward_state, attributes=True)
            if checks_writes
            else {}
        )
        given = _leaves_as_given(arguments)
        try:
            state = call()
        except TraceContextError as error:
            raise _write_in_transform_violation(site, _variable_written_in(error)) from error
        _check_arguments_unchanged(site, "reset_state", arguments, given)
        if checks_writes:
            _check_unwritten(
                site,
                before,
                "reset_state",
                _RULE_RESET_NO_WRITES,
                _is_forward_state,
                attributes=True,
            )
        _check_same_tree(site, prev_name, prev, "returned state", state, _RULE_RESET, None)
        _warn_kept_carry(site, prev_name, prev)
        if token is not None:  # the top-level call: every module below it was reached
            _check_all_reached(site, site.module, reached, _RESET_ROUTING)
    finally:
        if token is not None:
            _RESET_REACHED.reset(token)
    return state


_WARNED_KEPT_CARRY: set[type] = set()


def _warn_kept_carry(site: _Site, name: str, prev: Any) -> None:
    """Warn, once per class, that a module with a memory keeps it through the default
    ``reset_state``. Per-env keys are no memory: keeping their stream is right."""
    module = site.module
    cls = type(module)
    if cls in _WARNED_KEPT_CARRY or _overrides(module, "reset_state"):
        return
    if _has_contract_children(module):
        return  # a container: its children answer for their own carries
    kept = [path for path, leaf in named_leaves(name, prev) if not is_key(leaf)]
    if not kept:
        return
    _WARNED_KEPT_CARRY.add(cls)
    _warn_at_class(
        cls,
        f"nnx_ppo: {cls.__qualname__} keeps its carry ({', '.join(kept[:3])}) where an "
        "episode ends: it has no reset_state of its own, and the default (as in nnx-ppo "
        "0.3.0) keeps the carry, so its memory runs from one episode into the next. Define "
        "reset_state to reset it (or to return prev_state, keeping it on purpose, which "
        "silences this warning).",
    )


def _warn_at_class(cls: type, message: str) -> None:
    """A ``UserWarning`` pointing at the class statement (called while JAX traces, the
    caller's frames say nothing of where the module was written)."""
    try:
        filename = inspect.getsourcefile(cls) or "<unknown>"
        line = inspect.getsourcelines(cls)[1]
    except (OSError, TypeError):
        filename, line = "<unknown>", 0
    warnings.warn_explicit(message, UserWarning, filename, line, module=cls.__module__)


def is_key(leaf: Any) -> bool:
    """Whether ``leaf`` is an array of typed PRNG keys (``False`` for a leaf without a dtype)."""
    return hasattr(leaf, "dtype") and jax.numpy.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def key_data_or_leaf(leaf: Any) -> Any:
    """A typed PRNG-key array's raw ``uint32`` key data; any other leaf as it is."""
    return jax.random.key_data(leaf) if is_key(leaf) else leaf


@dataclass
class _StatisticsCall:
    """What one top-level ``update_statistics`` shares with the nested calls it makes."""

    time: _Axis
    batch: _Axis
    reached: dict[int, type]  # id to class


def _check_update_statistics(site: _Site, arguments: _Arguments, call: Callable[[], Any]) -> Any:
    (extras_name, extras), *_ = arguments
    shared = _STATISTICS_CALL.get()
    top_level = shared is None
    if shared is None:
        shared = _StatisticsCall(_Axis("T"), _Axis("B"), {})
    token = _STATISTICS_CALL.set(shared) if top_level else None
    try:
        shared.reached[id(site.module)] = type(site.module)
        what = "argument" if top_level else f"argument (passed by {_caller()})"
        batch = shared.batch if top_level else _Axis("B", usual_size=shared.batch.size)
        _check_leading(site, (shared.time, batch), extras_name, extras, _RULE_HISTORY, what)
        if not top_level:
            _check_folded_batch(site, extras_name, extras, batch, shared.batch)
        _check_emitted(site, extras_name, extras, shared.time, batch)
        # A sow there is added state too: training keeps no intermediates of it.
        before = _variable_values(site.module, _any_variable, attributes=True) if top_level else {}
        result = call()
        if top_level:
            _check_unwritten(
                site,
                before,
                "update_statistics",
                RULE_STATISTICS_KIND,
                _any_variable,
                attributes=True,
                may_write=lambda holder: _holds_a_statistic(holder) or _is_rng_stream(holder),
            )
            statistics = {
                path: held for path, held in before.items() if _holds_a_statistic(held[0])
            }
            _check_kept_shapes(site, statistics)
            _check_statistics_updated(site, site.module, before)
            _check_all_reached(site, site.module, shared.reached, _STATISTICS_ROUTING)
    finally:
        if token is not None:
            _STATISTICS_CALL.reset(token)
    return result


def _is_param(variable: nnx.Variable[Any]) -> bool:
    return isinstance(variable, nnx.Param)


def _is_statistic(variable: nnx.Variable[Any]) -> bool:
    return not isinstance(variable, nnx.Param | nnx.RngState)


def _holds_a_statistic(holder: _Held) -> bool:
    """What ``update_statistics`` may write: a variable other than a parameter or an
    ``nnx.Rngs`` stream, or an array held outside variables (Flax NNX state too)."""
    if isinstance(holder, _Attribute):
        return not holder.static
    return _is_statistic(holder)


def _check_kept_shapes(site: _Site, before: dict[tuple[Any, ...], tuple[_Held, Any]]) -> None:
    """Every statistic holds the tree, shapes and dtypes it held before ``update_statistics``
    (one removed holds nothing)."""
    held = _holders(site.module, _is_statistic, attributes=True)
    for path, (variable, value) in before.items():
        name = _describe_variable(site.module, path, variable)
        _check_same_tree(
            site,
            "its value before the call",
            value,
            name,
            held[path][1] if path in held else None,
            _RULE_KEPT_SHAPES,
            batch=None,
        )


def _caller() -> str:
    """The module that made the call now checked (the one below it on the stack), named."""
    stack = _ACTIVE_MODULES.get()
    if len(stack) < 2:
        return "the top-level call"
    return describe_module(stack[-2])


def _check_folded_batch(site: _Site, name: str, history: Any, batch: _Axis, top: _Axis) -> None:
    """A nested call's ``B`` is the top-level call's or a multiple of it: a container may
    fold ``K`` entities per env into its child's batch (``(B * K, *feat)`` calls), so
    the child's history is ``(T, B * K, *feat)``; fewer rows leave envs out."""
    if batch.size is None or top.size is None or batch.size % top.size == 0:
        return
    leaf_name, leaf = named_leaves(name, history)[0]
    raise _violation(
        site,
        f"argument (passed by {_caller()}) {leaf_name} has B={batch.size} on axis 1, which "
        f"is not a multiple of the top-level call's {top}: a nested history holds every "
        "env's steps, its B that of the top-level call or, where a container folds K "
        "entities per env into the batch, K times it.",
        leaf=leaf_name,
        expected=f"(T, B, *feat) or (T, B * K, *feat) with {top}",
        found=describe_leaf(leaf),
        rule=_RULE_HISTORY,
    )


def _check_emitted(site: _Site, name: str, history: Any, time: _Axis, batch: _Axis) -> None:
    """``history`` is what ``site.module`` emitted, stacked; unchecked when nothing was recorded."""
    emitted = _EMISSIONS.recorded(site.module)
    given = _emission_spec(history, leading=2)
    if not emitted or given in emitted:
        return
    expected = emitted[0]
    caller = _caller()
    expected_paths = [path for path, _, _ in expected]
    given_paths = [path for path, _, _ in given]
    if expected_paths != given_paths:
        missing = [name + p for p in expected_paths if p not in given_paths]
        extra = [name + p for p in given_paths if p not in expected_paths]
        found = "; ".join(
            part
            for part in (
                "missing " + ", ".join(missing[:4]) if missing else "",
                "unexpected " + ", ".join(extra[:4]) if extra else "",
            )
            if part
        )
        raise _violation(
            site,
            f"was given a history that is not the tree its __call__ emitted (called by {caller}).",
            leaf=(*missing, *extra, name)[0],
            expected="the leaves it emitted as rollout_extras: "
            + (", ".join(name + p for p in expected_paths) or "none (it emitted None)"),
            found=found or f"the leaves in another order: {', '.join(given_paths)}",
            rule=_RULE_EMITTED,
        )
    axes = f"T={time.size}, B={batch.size}"
    for (path, shape, dtype), (_, given_shape, given_dtype) in zip(expected, given, strict=True):
        if shape is None or (shape, dtype) == (given_shape, given_dtype):
            continue
        leaf = dict(named_leaves(name, history))[name + path]
        stacked = f"(T, B{''.join(f', {d}' for d in shape)}) {dtype}"
        if given_shape is None or len(given_shape) == len(shape):
            expected, found = f"{stacked} with {axes}", describe_leaf(leaf)
        else:  # T and B were read off this very leaf: naming them would mislead
            expected = f"{stacked}: {len(shape) + 2} axes, the T steps of the B envs"
            found = f"{describe_leaf(leaf)}: {leaf.ndim} axes" + (
                ", one step (B, *emitted) rather than the stacked history?"
                if leaf.ndim == len(shape) + 1
                else ""
            )
        raise _violation(
            site,
            f"was given a history whose leaf {name + path} is not what its __call__ emitted "
            f"(called by {caller}).",
            leaf=name + path,
            expected=expected,
            found=found,
            rule=_RULE_EMITTED,
        )


# ----------------------------------------------------------------- statistics routing


def _is_contract_module(node: Any) -> bool:
    return getattr(type(node), "__nnx_ppo_contract__", False)


def is_stats_bearing(node: Any) -> bool:
    """A contract module that defines ``update_statistics`` and holds no sub-modules, or
    holds statistics of its own beside them (not only its children's)."""
    if not _is_contract_module(node):
        return False
    if not _overrides(node, "update_statistics"):
        return False
    return not _has_contract_children(node) or bool(_own_statistics(node))


def _own_statistics(node: Any) -> list[tuple[tuple[Any, ...], Any]]:
    """The statistics of ``node`` outside its contract sub-modules, by path: statistic
    variables, and arrays held outside variables (``update_statistics`` may write either)."""
    entries = [(tuple(path), value) for path, value in nnx.iter_graph(node) if path]
    children = [path for path, value in entries if _is_contract_module(value)]
    return [
        (path, value)
        for path, value in entries
        if (
            isinstance(value, jax.Array | np.ndarray)
            or (
                isinstance(value, nnx.Variable)
                and _is_statistic(value)
                and not isinstance(value, nnx.Intermediate)
            )
        )
        and not any(path[: len(child)] == child for child in children)
    ]


def _own_batch_statistics(node: Any) -> list[tuple[tuple[Any, ...], Any]]:
    """The ``nnx.BatchStat`` variables of ``node`` outside its contract sub-modules: Flax's
    kind for running statistics (``nnx.BatchNorm`` keeps its averages in them). Other
    variables that are not parameters may be constants, which need no update."""
    return [
        (path, value) for path, value in _own_statistics(node) if isinstance(value, nnx.BatchStat)
    ]


def _has_contract_children(node: Any) -> bool:
    return any(
        _is_contract_module(child) and child is not node for _, child in nnx.iter_graph(node)
    )


def _overrides(node: Any, method: str) -> bool:
    """Whether ``node``'s class defines contract method ``method`` (not the default)."""
    function = getattr(type(node), method)
    return _checked_method(function) == method and not getattr(function, _DEFAULT_MARK, False)


@dataclass(frozen=True)
class _Routing:
    """What a top-level call of ``method`` must reach below it, and how a miss reads."""

    method: str
    needs: Callable[[Any], bool]  # whether the call must reach a module below it
    why: str  # completes "<method> never reached X, which ..."
    default: str  # completes "X inherits ..."
    rule: str
    frozen_exempt: bool  # FrozenStatistics holds its modules out of this call


def _module_name(root: Any, path: tuple[Any, ...], node: Any) -> str:
    """``node``, at ``path`` below ``root``, as a message names it: ``Sequential.layers[0]
    (Centre)``, or the root's class."""
    if not path:
        return type(root).__name__
    return f"{type(root).__name__}{format_graph_path(root, path)} ({type(node).__name__})"


def _frozen_paths(nodes: dict[tuple[Any, ...], Any]) -> list[tuple[Any, ...]]:
    """The paths of the nodes whose statistics are held fixed, with all below them."""
    return [path for path, node in nodes.items() if getattr(node, FROZEN_STATISTICS_MARK, False)]


def _is_below(path: tuple[Any, ...], ancestors: list[tuple[Any, ...]]) -> bool:
    return any(path[: len(ancestor)] == ancestor for ancestor in ancestors)


def _check_statistics_updated(
    site: _Site, root: Any, before: dict[tuple[Any, ...], tuple[_Held, Any]]
) -> None:
    """No module below ``root`` keeps ``nnx.BatchStat`` statistics of its own that the
    whole top-level call left unwritten while it inherits the no-op default
    ``update_statistics``, unless ``FrozenStatistics`` holds it fixed: nothing would
    ever update them. (A parent's ``update_statistics`` may write them itself.)"""
    nodes = {tuple(path): node for path, node in nnx.iter_graph(root)}
    frozen = _frozen_paths(nodes)
    for path, node in nodes.items():
        if not _is_contract_module(node) or _overrides(node, "update_statistics"):
            continue
        if _is_below(path, frozen):
            continue
        held = [
            (own, variable)
            for own, variable in _own_batch_statistics(node)
            if not _written((*path, *own), variable, before)
        ]
        if not held:
            continue
        name = _module_name(root, path, node)
        variables = ", ".join(_describe_variable(node, p, v) for p, v in held[:4])
        raise _violation(
            site,
            f"{name} keeps running statistics ({variables}) but inherits the no-op default "
            "update_statistics, and nothing wrote them: they would never change.",
            leaf=name,
            expected=f"{type(node).__name__} to define update_statistics and fold the "
            f"(T, B, *feat) history into them (or a module above it to write them); or, if "
            f"they are held fixed on purpose, {type(node).__name__} wrapped in "
            "FrozenStatistics",
            found=f"{name} inherits the no-op default{_why_default(type(node))}",
            rule=_RULE_STATISTICS_UPDATED,
        )


def _written(
    path: tuple[Any, ...], variable: Any, before: dict[tuple[Any, ...], tuple[_Held, Any]]
) -> bool:
    """Whether the call gave ``variable`` (at ``path``) a new value: any leaf not the very
    object it held before (an equal value written eagerly counts as written)."""
    if path not in before:
        return True
    leaves_now = jax.tree.leaves(variable.get_raw_value())
    leaves_before = jax.tree.leaves(before[path][1])
    return len(leaves_now) != len(leaves_before) or any(
        now is not then for now, then in zip(leaves_now, leaves_before, strict=True)
    )


def _why_default(cls: type) -> str:
    """Why ``cls`` ends up with the default ``update_statistics``, where it shows: a base
    outside the contract that defines it after the contract's default in the bases, or a
    method whose name is a near miss."""
    method = "update_statistics"
    shadowed = [
        klass.__qualname__
        for klass in cls.__mro__
        if method in vars(klass) and not getattr(klass, "__nnx_ppo_contract__", False)
    ]
    if shadowed:
        return (
            f"; {shadowed[0]}.{method} is shadowed by it, since {shadowed[0]} comes after "
            f"StatefulModule in the bases: list {shadowed[0]} first"
        )
    near = difflib.get_close_matches(
        method, [n for n in dir(cls) if n != method and callable(getattr(cls, n, None))], 1, 0.8
    )
    if near:
        return f"; it defines {near[0]}: a misspelling of {method}?"
    return ""


def _check_all_reached(site: _Site, root: Any, reached: dict[int, type], routing: _Routing) -> None:
    nodes = {tuple(path): node for path, node in nnx.iter_graph(root)}
    in_graph = {id(node) for node in nodes.values()}
    # An NNX transform (nnx.vmap over an ensemble's members) calls a copy of a module,
    # which no node of the graph is: a module of a class reached that way counts as reached.
    copied = {cls for module, cls in reached.items() if module not in in_graph}
    frozen = _frozen_paths(nodes)
    method = routing.method

    def name(path: tuple[Any, ...]) -> str:
        return _module_name(root, path, nodes[path])

    for path, node in nodes.items():
        if id(node) in reached or type(node) in copied or not routing.needs(node):
            continue
        if routing.frozen_exempt and _is_below(path, frozen):
            continue
        ancestors = [
            path[:i] for i in range(len(path) - 1, -1, -1) if _is_contract_module(nodes[path[:i]])
        ]
        found = "the top-level call returned without reaching it"
        expected = f"every container on its path to route {method} to it"
        # The nearest container that dropped it: one that inherits the default, or one
        # whose own method ran without passing it on.
        for ancestor in ancestors:
            if not _overrides(nodes[ancestor], method):
                expected = f"{name(ancestor)} to define {method} and route it"
                found = f"{name(ancestor)} inherits {routing.default}"
                break
            if id(nodes[ancestor]) in reached:
                expected = f"{name(ancestor)}.{method} to pass it its slice"
                found = f"{name(ancestor)}.{method} ran but never called it"
                break
        raise _violation(
            site,
            f"{method} never reached {name(path)}, which {routing.why}.",
            leaf=name(path),
            expected=expected,
            found=found,
            rule=routing.rule,
        )


_STATISTICS_ROUTING = _Routing(
    "update_statistics",
    is_stats_bearing,
    "keeps running statistics",
    "the no-op default, dropping its children's statistics",
    _RULE_ROUTING,
    frozen_exempt=True,
)


def _keeps_a_carry(node: Any) -> bool:
    """Whether ``node``'s carry has leaves (evaluated abstractly; unknown counts as yes)."""
    try:
        with checks(False):
            carry = nnx.eval_shape(lambda module: module.initialize_state(1), node)
    except Exception:
        return True
    return bool(jax.tree.leaves(carry))


_RESET_ROUTING = _Routing(
    "reset_state",
    lambda node: (
        _is_contract_module(node) and _overrides(node, "reset_state") and _keeps_a_carry(node)
    ),
    "defines its own reset_state: its carry would go on from the ended episode",
    "the default, which keeps every child's carry",
    rule_text(
        "containers route reset_state to every child the way they route the carry, so "
        "that each child's own reset runs where an episode ends",
        "the-four-rules",
        "custom_containers",
    ),
    frozen_exempt=False,
)


def resets_its_carry(node: Any) -> bool:
    """Whether ``node`` is a contract module that keeps a carry and defines its own
    ``reset_state``: one a top-level ``reset_state`` must reach."""
    return _RESET_ROUTING.needs(node)


# ----------------------------------------------------------------------- installation

_CHECKS: dict[str, _Check] = {
    "initialize_state": _check_initialize_state,
    "reset_state": _check_reset_state,
    "update_statistics": _check_update_statistics,
}


def install_checks(cls: type, output_type: type, *, defaults: bool = False) -> None:
    """Wrap every contract method ``cls`` ends up with, wherever in its MRO it is defined.

    Called on ``StatefulModule`` itself (``defaults=True``: its methods are the
    defaults, e.g. the no-op ``update_statistics``, which must be checked too, so
    that a container inheriting it is caught), from its ``__init_subclass__``, and
    when a contract method is assigned to a class after its creation. A method
    defined on a mixin or another base outside the contract is wrapped on ``cls``;
    one already wrapped (inherited from a checked class) is left alone, so each
    method is wrapped once.
    """
    cls.__nnx_ppo_contract__ = True  # type: ignore[attr-defined]
    checks = {"__call__": functools.partial(_check_call, output_type), **_CHECKS}
    for name, check in checks.items():
        owner, fn = _resolve(cls, name)
        if fn is None or _checked_method(fn) is not None:
            continue
        if isinstance(fn, staticmethod | classmethod) or not callable(fn):
            raise TypeError(
                f"{cls.__qualname__}.{name} is a {type(fn).__name__}, not a method: the "
                f"library calls it on a module, as {_CALLED_WITH[name][0]}"
            )
        wrapped = _checked(cls, fn, name, check, output_type)
        setattr(wrapped, _DEFAULT_MARK, defaults)
        setattr(wrapped, _COPIED_MARK, owner is not cls)
        # type.__setattr__: a metaclass that re-installs checks on assignment must not recurse.
        type.__setattr__(cls, name, wrapped)


def _resolve(cls: type, name: str) -> tuple[type | None, Any]:
    """``name`` as ``cls``'s instances would find it without this module's wrappers of
    mixin methods, and the class defining it.

    Such a wrapper, installed on a base of ``cls``, would otherwise hide a mixin later in
    ``cls``'s MRO that overrides the one it wraps; where it wraps the very function found
    past it, it is returned, to be inherited as it is.
    """
    skipped: Any = None
    for klass in cls.__mro__:
        value = klass.__dict__.get(name)
        if value is None:
            continue
        if klass is not cls and getattr(value, _COPIED_MARK, False):
            skipped = skipped or value
            continue
        if skipped is not None and getattr(skipped, "__wrapped__", None) is value:
            return klass, skipped
        return klass, value
    return None, None
