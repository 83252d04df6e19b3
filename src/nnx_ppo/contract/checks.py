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
2. the jaxtyping annotations on the method's own signature (checked with
   beartype, dimension names bound across the call);
3. after a top-level ``update_statistics``: every stats-bearing descendant was
   reached (a container that forgets rule 4 of the contract fails loudly).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import re
import sys
import typing
import warnings
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import jax
from beartype import beartype
from beartype.roar import BeartypeCallHintViolation
from flax import nnx
from jaxtyping import TypeCheckError, jaxtyped

from nnx_ppo.contract.arguments import require_int
from nnx_ppo.contract.errors import ContractError

__all__ = [
    "CHECKS_ENV_VAR",
    "checks",
    "checks_enabled",
    "describe_leaf",
    "describe_module",
    "format_graph_path",
    "install_checks",
    "is_stats_bearing",
    "named_leaves",
    "structure_difference",
]

CHECKS_ENV_VAR = "NNX_PPO_CHECKS"
"""Set to ``0`` (or ``false``/``off``/``no``) to turn the contract checks off."""

_OFF_VALUES = frozenset({"0", "false", "off", "no"})
_CHECKS_OVERRIDE: ContextVar[bool | None] = ContextVar("nnx_ppo_checks", default=None)
_ACTIVE_MODULES: ContextVar[tuple[Any, ...]] = ContextVar("nnx_ppo_active", default=())
_STATS_REACHED: ContextVar[set[int] | None] = ContextVar("nnx_ppo_stats", default=None)

_CHECKED_MARK = "__nnx_ppo_checked__"
_DEFAULT_MARK = "__nnx_ppo_default__"

_RULE_ONE_B = (
    "one batch size B binds every leaf of state, x, rollout_extras and of the returned "
    "next_state, output and rollout_extras of a __call__ (SPEC section 1)"
)
_RULE_CARRY = (
    "next_state is a scan carry: it must have exactly the tree structure, shapes and "
    "dtypes of state (SPEC section 1)"
)
_RULE_RESET = (
    "reset_state returns the structure, shapes and dtypes it was given; it is called on "
    "a batched carry and, under vmap, on one env's slice (SPEC section 1)"
)
_RULE_INIT = "initialize_state(batch_size) returns leaves that lead with batch_size"
_RULE_HISTORY = (
    "update_statistics receives the rollout's stacked emissions: every leaf is "
    "(T, B, *feat) with one T and one B (SPEC section 1)"
)
_RULE_REPLAY = (
    "given stored rollout_extras (loss replay), a module emits extras with the "
    "structure of the stored ones (SPEC section 2)"
)
_RULE_REG = "regularization_loss is a scalar or has shape (B,)"
_RULE_METRICS = "metric leaves are scalars or lead with B"
_RULE_ROUTING = (
    "containers route update_statistics to every child the way __call__ routes "
    "rollout_extras (SPEC section 3, rule 4)"
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
    """``path`` (from ``nnx.iter_graph(root)``) as Python would write it: ``.layers[2]``."""
    node = root
    parts: list[str] = []
    for key in path:
        if isinstance(node, nnx.List | list | tuple):
            parts.append(f"[{key}]")
            node = node[key]
        elif isinstance(node, nnx.Dict | dict):
            parts.append(f"[{key!r}]")
            node = node[key]
        else:
            parts.append(f".{key}")
            node = getattr(node, key)
    return "".join(parts)


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

    def __str__(self) -> str:
        return f"{describe_module(self.module)}.{self.method}"


@contextlib.contextmanager
def _entered(module: Any) -> Iterator[None]:
    token = _ACTIVE_MODULES.set((*_ACTIVE_MODULES.get(), module))
    try:
        yield
    finally:
        _ACTIVE_MODULES.reset(token)


def _violation(site: _Site, problem: str, **details: str | None) -> ContractError:
    return ContractError.violation(str(site), problem, **details)


# ------------------------------------------------------------------------ leaf checks


def describe_leaf(leaf: Any) -> str:
    """``"shape (8, 3) float32"``, or what the leaf is when it is not an array."""
    shape = getattr(leaf, "shape", None)
    if shape is None:
        return f"a {type(leaf).__name__} (not an array)"
    return f"shape {tuple(shape)} {leaf.dtype}"


def named_leaves(name: str, tree: Any) -> list[tuple[str, Any]]:
    """The leaves of ``tree`` with their paths written after ``name``: ``("state['h']", leaf)``."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [(name + jax.tree_util.keystr(path), leaf) for path, leaf in flat]


@dataclass
class _Axis:
    """One named axis (``B`` or ``T``) bound by the first leaf that shows it."""

    label: str
    size: int | None = None
    source: str | None = None

    def bind(self, size: int, source: str) -> bool:
        if self.size is None:
            self.size, self.source = size, source
            return True
        return self.size == size

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
        bound = ", ".join(str(a) for a in axes)
        if shape is None or len(shape) < len(axes):
            raise _violation(
                site,
                f"{what} {leaf_name} has no leading ({pattern.removesuffix(', *feat')}) axes.",
                leaf=leaf_name,
                expected=f"({pattern}) with {bound}",
                found=describe_leaf(leaf),
                rule=rule,
            )
        for axis, size in zip(axes, shape, strict=False):
            if not axis.bind(int(size), leaf_name):
                raise _violation(
                    site,
                    f"{what} {leaf_name} has {axis.label}={size} on axis "
                    f"{axes.index(axis)}, but {axis}.",
                    leaf=leaf_name,
                    expected=f"({pattern}) with {bound}",
                    found=describe_leaf(leaf),
                    rule=rule,
                )


def _named_shape(shape: tuple[int, ...], batch: _Axis | None) -> str:
    dims = [str(d) for d in shape]
    if batch is not None and batch.size is not None and dims and shape[0] == batch.size:
        dims[0] = f"B={batch.size}"
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


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
        same_dtype = not compare_dtype or ref_leaf.dtype == leaf.dtype
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


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _outside_the_library_level() -> int:
    """The ``stacklevel`` that points a warning at the caller's first frame outside nnx_ppo.

    A class's checks are installed from ``__init_subclass__``, called through the
    metaclasses (``abc``, frozen) and this package; the frame that matters to the
    user is their class statement, past all of those.
    """
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(
        (_PACKAGE_DIR, "<frozen")
    ):
        frame, level = frame.f_back, level + 1
    return level


def _annotation_checked(fn: Callable[..., Any], where: str) -> Callable[..., Any]:
    """Wrap ``fn`` (the method ``where``) so the jaxtyping annotations on its signature are checked.

    Annotations that cannot be resolved where the method was defined (forward
    references to names local to a function) are left unchecked, with a warning
    naming the method; the contract's own axis checks still run.
    """
    try:
        hints = typing.get_type_hints(fn)
    except Exception as error:
        warnings.warn(
            f"nnx_ppo: the annotations of {where} are not checked: resolving them raised "
            f"{type(error).__name__}: {error}. Define the names they use at module level "
            "to have them checked; the contract's axis checks run either way.",
            stacklevel=_outside_the_library_level(),
        )
        return fn
    if not hints:
        return fn
    return jaxtyped(typechecker=beartype)(fn)


_RULE_ANNOTATIONS = (
    "annotations a module writes on its own methods are checked, with dimension names "
    "bound across the call"
)
# jaxtyping's report is several paragraphs; these pick out its facts, one per line.
_ANNOTATED_PARAMETER = re.compile(r"typechecking parameter '([^']+)'")
_ANNOTATED_ACTUAL = re.compile(r"^Actual value: (.*)$", re.MULTILINE)
_ANNOTATED_EXPECTED = re.compile(r"^Expected type: (.*?)\.?$", re.MULTILINE)
_ANNOTATED_BOUND = re.compile(r"axis annotation are as follows\.\n(.*)\Z", re.DOTALL)


def _annotation_violation(site: _Site, error: Exception) -> ContractError:
    text = str(error).strip()
    actual = _ANNOTATED_ACTUAL.search(text)
    expected = _ANNOTATED_EXPECTED.search(text)
    if actual is None or expected is None:
        return _violation(
            site,
            "an argument or the return value does not match the jaxtyping annotations on "
            "its signature.",
            found=text,
            rule=_RULE_ANNOTATIONS,
        )
    parameter = _ANNOTATED_PARAMETER.search(text)
    what = f"argument {parameter.group(1)}" if parameter else "the return value"
    annotation = expected.group(1).removeprefix("<class '").removesuffix("'>")
    annotation = annotation.replace("jaxlib._jax.Array", "Array").replace("jax.Array", "Array")
    bound = _ANNOTATED_BOUND.search(text)
    if bound is not None:
        annotation += " with " + ", ".join(bound.group(1).split())
    return _violation(
        site,
        f"{what} does not match its jaxtyping annotation.",
        leaf=parameter.group(1) if parameter else "return value",
        expected=annotation,
        found=actual.group(1),
        rule=_RULE_ANNOTATIONS,
    )


def _call_annotated(site: _Site, typed: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return typed(*args, **kwargs)
    except ContractError:
        raise
    except (TypeCheckError, BeartypeCallHintViolation) as error:
        raise _annotation_violation(site, error) from error


# ------------------------------------------------------------------------- the methods


def _bound_arguments(
    signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[tuple[str, Any]]:
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return list(bound.arguments.items())


_Arguments = list[tuple[str, Any]]
"""A call's arguments after ``self``, as (parameter name, value) pairs."""

_Check = Callable[[_Site, _Arguments, Callable[[], Any]], Any]
"""Checks one call: given where it runs, its arguments, and the (annotation-checked)
method to run, it returns the method's result or raises ``ContractError``."""


def _checked(cls: type, fn: Callable[..., Any], method: str, check: _Check) -> Callable[..., Any]:
    """``cls``'s method ``fn`` (named ``method``), run by ``check`` when checks are on."""
    typed = _annotation_checked(fn, f"{cls.__qualname__}.{method}")
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def checked(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not checks_enabled():
            return fn(self, *args, **kwargs)
        arguments = _bound_arguments(signature, (self, *args), kwargs)[1:]
        site = _Site(self, method)
        with _entered(self):
            run = functools.partial(_call_annotated, site, typed, self, *args, **kwargs)
            return check(site, arguments, run)

    setattr(checked, _CHECKED_MARK, method)
    return checked


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
    result = call()
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
    return result


def _check_regularization(site: _Site, loss: Any, batch: _Axis) -> None:
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
    state = call()
    batch = _Axis("B", batch_size, size_name)
    _check_leading(site, (batch,), "state", state, _RULE_INIT, "returned")
    return state


def _check_reset_state(site: _Site, arguments: _Arguments, call: Callable[[], Any]) -> Any:
    (prev_name, prev), *_ = arguments
    state = call()
    _check_same_tree(site, prev_name, prev, "returned state", state, _RULE_RESET, None)
    return state


def _check_update_statistics(site: _Site, arguments: _Arguments, call: Callable[[], Any]) -> Any:
    (extras_name, extras), *_ = arguments
    reached = _STATS_REACHED.get()
    token = _STATS_REACHED.set(set()) if reached is None else None
    try:
        reached_now = _STATS_REACHED.get()
        assert reached_now is not None
        reached_now.add(id(site.module))
        history_axes = (_Axis("T"), _Axis("B"))
        _check_leading(site, history_axes, extras_name, extras, _RULE_HISTORY, "argument")
        result = call()
        if token is not None:
            _check_all_reached(site, site.module, reached_now)
    finally:
        if token is not None:
            _STATS_REACHED.reset(token)
    return result


# ----------------------------------------------------------------- statistics routing


def _is_contract_module(node: Any) -> bool:
    return getattr(type(node), "__nnx_ppo_contract__", False)


def is_stats_bearing(node: Any) -> bool:
    """A contract module that defines ``update_statistics`` and holds no sub-modules."""
    if not _is_contract_module(node):
        return False
    if not _overrides_update_statistics(node):
        return False
    return not any(
        _is_contract_module(child) and child is not node for _, child in nnx.iter_graph(node)
    )


def _overrides_update_statistics(node: Any) -> bool:
    method = type(node).update_statistics
    return getattr(method, _CHECKED_MARK, None) == "update_statistics" and not getattr(
        method, _DEFAULT_MARK, False
    )


def _check_all_reached(site: _Site, root: Any, reached: set[int]) -> None:
    nodes = {tuple(path): node for path, node in nnx.iter_graph(root)}

    def name(path: tuple[Any, ...]) -> str:
        if not path:
            return type(root).__name__
        return (
            f"{type(root).__name__}{format_graph_path(root, path)} ({type(nodes[path]).__name__})"
        )

    for path, node in nodes.items():
        if id(node) in reached or not is_stats_bearing(node):
            continue
        ancestors = [
            path[:i] for i in range(len(path) - 1, -1, -1) if _is_contract_module(nodes[path[:i]])
        ]
        found = "the top-level call returned without reaching it"
        expected = "every container on its path to route update_statistics to it"
        # The nearest container that dropped it: one that inherits the no-op default,
        # or one whose own update_statistics ran without passing it on.
        for ancestor in ancestors:
            if not _overrides_update_statistics(nodes[ancestor]):
                expected = f"{name(ancestor)} to define update_statistics and route it"
                found = (
                    f"{name(ancestor)} inherits the no-op default, dropping its children's "
                    "statistics"
                )
                break
            if id(nodes[ancestor]) in reached:
                expected = f"{name(ancestor)}.update_statistics to pass it its slice"
                found = f"{name(ancestor)}.update_statistics ran but never called it"
                break
        raise _violation(
            site,
            f"update_statistics never reached {name(path)}, which keeps running statistics.",
            leaf=name(path),
            expected=expected,
            found=found,
            rule=_RULE_ROUTING,
        )


# ----------------------------------------------------------------------- installation

_CHECKS: dict[str, _Check] = {
    "initialize_state": _check_initialize_state,
    "reset_state": _check_reset_state,
    "update_statistics": _check_update_statistics,
}


def install_checks(cls: type, output_type: type, *, defaults: bool = False) -> None:
    """Wrap the contract methods ``cls`` defines itself with their checks.

    Called on ``StatefulModule`` itself (``defaults=True``: its methods are the
    defaults, e.g. the no-op ``update_statistics``, which must be checked too, so
    that a container inheriting it is caught) and from its ``__init_subclass__``;
    methods inherited from a parent are already wrapped there.
    """
    cls.__nnx_ppo_contract__ = True  # type: ignore[attr-defined]
    checks = {"__call__": functools.partial(_check_call, output_type), **_CHECKS}
    for name, check in checks.items():
        fn = cls.__dict__.get(name)
        if fn is not None and getattr(fn, _CHECKED_MARK, None) is None:
            wrapped = _checked(cls, fn, name, check)
            setattr(wrapped, _DEFAULT_MARK, defaults)
            setattr(cls, name, wrapped)
