"""The jaxtyping annotations a module or engine function writes, checked item by item.

jaxtyping holds one dimension memo for the whole call (``B`` and ``T`` bound across
arguments and result, ``{self.width}`` read off the module) and beartype checks
each leaf inside it. beartype alone checks one item of a ``dict``, ``list`` or
``tuple[X, ...]`` per call, so the walk here visits every item and every leaf of a
container or pytree and names the first that does not match. The caller, which
knows the module or function, turns an :class:`AnnotationMismatch` into a
:class:`~nnx_ppo.ContractError`.
"""

from __future__ import annotations

import abc
import collections.abc
import contextlib
import dataclasses
import functools
import inspect
import io
import os
import re
import sys
import types
import typing
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jaxtyping
import numpy as np
import typing_extensions
from beartype import beartype
from beartype.door import is_bearable
from jaxtyping import AbstractArray, AnnotationError, PyTree, jaxtyped, print_bindings
from jaxtyping import _storage as jaxtyping_storage

__all__ = ["AnnotationMismatch", "annotation_checked", "checked_leaf_by_leaf"]


_LIBRARY_FILES = (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    os.path.dirname(os.path.abspath(jaxtyping.__file__)),
    "<frozen",
)
"""Where the frames a warning looks past lie: nnx_ppo, jaxtyping and frozen modules."""


def _outside_the_library_level() -> int:
    """The ``stacklevel`` that points a warning at the caller's first frame outside nnx_ppo.

    A class's checks are installed from ``__init_subclass__``, called through the
    metaclasses (``abc``, frozen) and this package; the frame that matters to the
    user is their class statement, past all of those. A record's fields are first read
    while a call is checked, inside jaxtyping's wrapper: there it is the user's call.
    """
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_LIBRARY_FILES):
        frame, level = frame.f_back, level + 1
    return level


FieldsChecked = Callable[[Any], bool]
"""Whether the field annotations of a ``NamedTuple``, ``TypedDict`` or dataclass hint
are checked, item by item like a container's."""


def annotation_checked(
    fn: Callable[..., Any], where: str, fields_checked: FieldsChecked
) -> Callable[..., Any]:
    """Wrap ``fn`` (the method ``where``) so the jaxtyping annotations on its signature are checked.

    Annotations that cannot be resolved where the method was defined (forward
    references to names local to a function) are left unchecked, with a warning
    naming the method; the contract's own axis checks still run.
    """
    return _annotation_checked_now(fn, where, fields_checked, defer_unresolved=True)


def _resolved_at_first_call(
    fn: Callable[..., Any], where: str, fields_checked: FieldsChecked
) -> Callable[..., Any]:
    """``fn``, whose annotations are resolved and wrapped when it is first called."""
    resolved: Callable[..., Any] | None = None

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        nonlocal resolved
        if resolved is None:
            resolved = _annotation_checked_now(fn, where, fields_checked)
        return resolved(*args, **kwargs)

    return call


def _annotation_checked_now(
    fn: Callable[..., Any],
    where: str,
    fields_checked: FieldsChecked,
    defer_unresolved: bool = False,
) -> Callable[..., Any]:
    """:func:`annotation_checked`, resolving the annotations now; ``fn`` itself, with a
    warning, where they cannot be resolved or checked. With ``defer_unresolved``, a
    name not defined yet is looked up again at the first call."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception as error:
        if defer_unresolved and isinstance(error, NameError):
            # A name the module defines below the class (postponed annotations): it
            # exists by the first call.
            return _resolved_at_first_call(fn, where, fields_checked)
        warnings.warn(
            f"nnx_ppo: the annotations of {where} are not checked: resolving them raised "
            f"{type(error).__name__}: {error}. Define the names they use at module level "
            "to have them checked; the contract's axis checks run either way.",
            stacklevel=_outside_the_library_level(),
        )
        return fn
    if not hints:
        return fn
    with contextlib.suppress(Exception):  # most often every hint is checkable
        return checked_leaf_by_leaf(fn, hints, fields_checked)
    checkable = {}
    for name, hint in hints.items():
        try:
            _require_checkable(hint)
        except Exception as error:
            annotation = "return annotation" if name == "return" else f"annotation of {name}"
            warnings.warn(
                f"nnx_ppo: the {annotation} in {where} is not checked: beartype cannot "
                f"check {_hint_text(hint)} at run time ({type(error).__name__}). A "
                "typing.Protocol without @runtime_checkable does this: make it checkable "
                "to have it checked; the method's other annotations and the contract's "
                "axis checks run either way.",
                stacklevel=_outside_the_library_level(),
            )
        else:
            checkable[name] = hint
    if not checkable:
        return fn
    try:
        return checked_leaf_by_leaf(fn, checkable, fields_checked)
    except Exception as error:
        warnings.warn(
            f"nnx_ppo: the annotations of {where} are not checked: jaxtyping could not wrap "
            f"it ({type(error).__name__}: {error}). Another decorator around the method "
            "(nnx.jit) does this: put the decorator inside the method to have them checked; "
            "the contract's axis checks run either way.",
            stacklevel=_outside_the_library_level(),
        )
        return fn


def _require_checkable(hint: Any) -> None:
    """Raise what beartype raises when asked to check ``hint`` (a ``typing.Protocol``
    without ``@runtime_checkable`` cannot be), so one such hint leaves the others checked."""

    def probe(value: Any) -> None:
        del value

    probe.__annotations__ = {"value": hint}
    beartype(probe)


class AnnotationMismatch(Exception):
    """A value that does not match its annotation, raised inside the call's dimension memo.

    The caller, who knows the module the call ran on, turns it into a ContractError.
    """

    def __init__(
        self,
        what: str,
        leaf: str,
        hint: Any,
        value: Any,
        bindings: str,
        arguments: Mapping[str, Any],
    ) -> None:
        super().__init__(what)
        self.what, self.leaf, self.hint, self.value, self.bindings, self.arguments = (
            what,
            leaf,
            hint,
            value,
            bindings,
            arguments,
        )

    def problem(self) -> str:
        """What is wrong, in one sentence: ``argument x['h'] does not match its jaxtyping
        annotation.``"""
        if isinstance(self.value, _KeyFault):
            return self.value.problem(self.what)
        return f"{self.what} does not match its jaxtyping annotation."

    def expected(self) -> str:
        """The annotation as written, ``{self.name}`` and ``{argument}`` dimensions shown
        with the call's values and the sizes bound before the mismatch:
        ``Float[Array, 'B h=3'] with B=8``."""
        annotation = _with_argument_values(_hint_text(self.hint), self.arguments)
        return f"{annotation} with {self.bindings}" if self.bindings else annotation

    def found(self) -> str:
        """The value on one line, each array as its dtype and shape: ``f32[8,2]``; for a
        missing key, the mapping that lacks it."""
        if isinstance(self.value, _KeyFault):
            return self.value.found()
        return _value_text(self.value)


def checked_leaf_by_leaf(
    fn: Callable[..., Any], hints: dict[str, Any], fields_checked: FieldsChecked
) -> Callable[..., Any]:
    """``fn`` with its arguments and result checked against ``hints``, leaf by leaf.

    beartype alone checks one item of a ``dict``, ``list`` or ``tuple[X, ...]`` per call
    (its constant-time strategy), so the other items of a container went unchecked; and a
    pytree that failed was reported whole. Here every item and every leaf is checked
    with beartype, inside one jaxtyping dimension memo for the whole call (holding the
    arguments, so ``{self.width}`` dimensions resolve), and a violation names its leaf.
    """
    # Refuses, when the class is made, what jaxtyping cannot wrap (a decorator's object
    # in place of the function), with the hints that will be checked.
    jaxtyped(typechecker=beartype)(_annotated_copy(fn, hints))
    signature = inspect.signature(fn)
    parameters = signature.parameters

    def run(*args: Any, **kwargs: Any) -> Any:
        if jaxtyping.config.jaxtyping_disable:  # JAXTYPING_DISABLE: no memo, and no checks
            return fn(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        given = list(bound.arguments.items())
        # The arguments a "{batch_size}" dimension reads, defaults included, as jaxtyping's.
        bound.apply_defaults()
        call = _Call(bound.arguments, fields_checked)
        for name, value in given:
            if name not in hints:
                continue
            kind = parameters[name].kind
            if kind is inspect.Parameter.VAR_POSITIONAL:
                items = [(f"[{index}]", item) for index, item in enumerate(value)]
            elif kind is inspect.Parameter.VAR_KEYWORD:
                items = [(f"[{key!r}]", item) for key, item in value.items()]
            else:
                items = [("", value)]
            for suffix, item in items:
                _require_match(f"argument {name}{suffix}", name + suffix, item, hints[name], call)
        result = fn(*args, **kwargs)
        if "return" in hints:
            _require_match("the return value", "return value", result, hints["return"], call)
        return result

    # Unannotated, so that jaxtyping only holds the memo and the checks are all ours.
    run.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[p.replace(annotation=inspect.Parameter.empty) for p in parameters.values()],
        return_annotation=inspect.Signature.empty,
    )
    for attribute in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(run, attribute, getattr(fn, attribute, None))
    return jaxtyped(typechecker=beartype)(run)


def _annotated_copy(fn: Callable[..., Any], hints: dict[str, Any]) -> Callable[..., Any]:
    """A copy of the function ``fn`` whose annotations are ``hints``."""
    code = typing.cast(types.FunctionType, fn)
    copy = types.FunctionType(
        code.__code__, code.__globals__, code.__name__, code.__defaults__, code.__closure__
    )
    copy.__kwdefaults__ = code.__kwdefaults__
    copy.__annotations__ = hints
    return copy


@dataclasses.dataclass(frozen=True)
class _Call:
    """What a check of one call reads besides the value and its hint."""

    arguments: Mapping[str, Any]
    fields_checked: FieldsChecked


def _require_match(what: str, name: str, value: Any, hint: Any, call: _Call) -> None:
    mismatch = _first_mismatch(value, hint, "", call.fields_checked)
    if mismatch is not None:
        path, leaf, leaf_hint = mismatch
        if path and what.startswith("the "):
            what = f"{what} at {path}"
        else:
            what += path
        raise AnnotationMismatch(
            what, name + path, leaf_hint, leaf, _dimension_bindings(), call.arguments
        )


_UNIONS = (typing.Union, types.UnionType)


def _first_mismatch(
    value: Any, hint: Any, path: str, fields_checked: FieldsChecked
) -> tuple[str, Any, Any] | None:
    """The first leaf of ``value`` (its path, the leaf, the leaf's hint) that ``hint`` refuses.

    Mappings (``dict``, ``Mapping``, ``OrderedDict``, ...), sequences (``list``,
    ``Sequence``, ...), tuples, jaxtyping ``PyTree`` s of arrays and, where
    ``fields_checked`` says so, the fields of a ``NamedTuple``, dataclass or
    ``TypedDict`` are walked item by item; any other hint is checked whole by beartype.
    """
    origin, members = typing.get_origin(hint), typing.get_args(hint)
    if origin in _UNIONS:
        if any(_union_member_accepts(value, member, path, fields_checked) for member in members):
            return None
        # Name the leaf when exactly one member is a container of the value's kind.
        alike = [m for m in members if _is_container_of(value, m, fields_checked)]
        if len(alike) != 1:
            return (path, value, hint)
        return _first_mismatch(value, alike[0], path, fields_checked)
    leaf_hint = _pytree_leaf_hint(hint)
    if leaf_hint is not None:
        structure = hint.structure
        if structure is None:
            return _first_failing_leaf(value, hint, leaf_hint, path, fields_checked)
        # jaxtyping binds the structure's name, and ``?`` dimensions leaf by leaf: it
        # decides, and the walk only names the leaf it refused.
        if _bearable(value, hint):
            return None
        if _bearable(value, PyTree[Any, structure]):  # binds the name: a leaf is at fault
            # A ``?`` dimension, which only jaxtyping's own walk binds, leaves the tree whole.
            with contextlib.suppress(AnnotationError):
                failing = _first_failing_leaf(value, hint, leaf_hint, path, fields_checked)
                return failing or (path, value, hint)
        return (path, value, hint)
    items: list[tuple[str, Any, Any]] = []
    fields = _fields_of(value, hint) if fields_checked(hint) else None
    if fields is not None:
        items = fields
    elif (
        _is_container_of(value, hint, fields_checked, collections.abc.Mapping) and len(members) == 2
    ):
        key_hint, item_hint = members
        for key in value:
            if not _bearable(key, key_hint):
                return (f"{path} (key {key!r})", key, key_hint)
        items = [(f"[{key!r}]", item, item_hint) for key, item in value.items()]
    elif (
        _is_container_of(value, hint, fields_checked, collections.abc.Sequence)
        and origin is not tuple
        and len(members) == 1
        and not isinstance(value, str | bytes)
    ):
        items = [(f"[{index}]", item, members[0]) for index, item in enumerate(value)]
    elif origin is tuple and isinstance(value, tuple):
        if len(members) == 2 and members[1] is Ellipsis:
            item_hints: Sequence[Any] = [members[0]] * len(value)
        elif len(members) == len(value):
            item_hints = members
        else:
            return (path, value, hint)
        pairs = zip(value, item_hints, strict=True)
        items = [(f"[{index}]", item, item_hint) for index, (item, item_hint) in enumerate(pairs)]
    for suffix, item, item_hint in items:
        if isinstance(item, _KeyFault):
            return (path + suffix, item, item_hint)
        found = _first_mismatch(item, item_hint, path + suffix, fields_checked)
        if found is not None:
            return found
    return None if _bearable(value, hint) else (path, value, hint)


def _first_failing_leaf(
    value: Any, hint: Any, leaf_hint: Any, path: str, fields_checked: FieldsChecked
) -> tuple[str, Any, Any] | None:
    """The first leaf of the ``PyTree`` ``value`` that ``leaf_hint`` refuses, as
    :func:`_first_mismatch` names it; the tree itself where JAX cannot flatten it."""
    try:
        leaves = jax.tree_util.tree_flatten_with_path(value)[0]
    except (TypeError, ValueError):  # keys JAX cannot sort: jaxtyping refuses it too
        return (path, value, hint)
    for key_path, leaf in leaves:
        leaf_path = path + jax.tree_util.keystr(key_path)
        found = _first_mismatch(leaf, leaf_hint, leaf_path, fields_checked)
        if found is not None:
            return found
    return None


def _union_member_accepts(
    value: Any, member: Any, path: str, fields_checked: FieldsChecked
) -> bool:
    """beartype's own check first: for a PyTree it is jaxtyping's, whole, so an accepted
    PyTree needs no walk; another container is then walked item by item. A member refused
    partway (a ``tuple`` beartype checks item by item, a walk past a matching item) has
    bound dimensions by then: they are discarded, so that neither the next member nor a
    later argument is checked against the sizes of a member that does not apply."""
    bindings = _saved_bindings()
    accepted = _bearable(value, member) and (
        _pytree_leaf_hint(member) is not None
        or _first_mismatch(value, member, path, fields_checked) is None
    )
    if not accepted:
        _restore_bindings(bindings)
    return accepted


_Bindings = tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]
"""jaxtyping's memo of one call: sizes, variadic shapes, PyTree structures, arguments."""


def _saved_bindings() -> _Bindings:
    """A copy of what the call has bound so far. jaxtyping takes the same copy around each
    array or PyTree it refuses; it has no public name for it, hence its ``_storage``."""
    sizes, shapes, structures, arguments = jaxtyping_storage.get_shape_memo()
    return sizes.copy(), shapes.copy(), structures.copy(), arguments.copy()


def _restore_bindings(bindings: _Bindings) -> None:
    jaxtyping_storage.set_shape_memo(*bindings)


def _fields_of(value: Any, hint: Any) -> list[tuple[str, Any, Any]] | None:
    """Each field of ``value`` with its path and annotation, where ``hint`` is a
    ``NamedTuple`` or dataclass ``value`` is an instance of, or a ``TypedDict`` and
    ``value`` a mapping; else ``None``. A key the ``TypedDict`` requires and the mapping
    lacks is a :class:`_MissingKey` in its place; one it may lack is left out. A key it
    does not declare is checked against its ``extra_items`` type, is an
    :class:`_UndeclaredKey` where it is closed, and is left out where it is open (PEP 728:
    an open ``TypedDict``'s value may hold more keys, as a subtype's does)."""
    if _is_typeddict(hint):
        if not isinstance(value, collections.abc.Mapping):
            return None
        hints = _field_hints(hint)
        missing: list[tuple[str, Any, Any]] = [
            (f"[{key!r}]", _MissingKey(key, value, hint), hints.get(key, hint))
            for key in _required_keys(hint)
            if key not in value
        ]
        declared = [(f"[{key!r}]", value[key], hints[key]) for key in hints if key in value]
        extra_items = _extra_items(hint)
        undeclared = (
            [] if extra_items is _OPEN else [k for k in value if k not in _declared_keys(hint)]
        )
        extra = [
            (f"[{key!r}]", _UndeclaredKey(key, value, hint), hint)
            if extra_items is _CLOSED
            else (f"[{key!r}]", value[key], extra_items)
            for key in undeclared
        ]
        return missing + declared + extra
    if not (_is_record_class(hint) and isinstance(value, hint)):
        return None
    fields = _field_hints(hint).items()
    # A dataclass field made with init=False may be unset: there is nothing to check.
    return [
        (f".{name}", getattr(value, name), field) for name, field in fields if hasattr(value, name)
    ]


@dataclasses.dataclass(frozen=True)
class _KeyFault(abc.ABC):
    """Stands in for the value of ``key`` where ``mapping`` breaks the keys of the
    ``TypedDict`` ``record``."""

    key: Any
    mapping: Mapping[Any, Any]
    record: type

    @abc.abstractmethod
    def problem(self, what: str) -> str:
        """What is wrong, in one sentence, ``what`` naming the key's place."""

    @abc.abstractmethod
    def found(self) -> str:
        """The mapping's keys, on one line."""


class _MissingKey(_KeyFault):
    """A key the ``TypedDict`` requires and the mapping lacks."""

    def problem(self, what: str) -> str:
        return (
            f"{what} is missing: the TypedDict {self.record.__qualname__} requires the key "
            f"{self.key!r}. Pass it, or mark the key that may be absent NotRequired[...] "
            "(or the TypedDict total=False)."
        )

    def found(self) -> str:
        return f"no key {self.key!r} in {_value_text(self.mapping)}"


class _UndeclaredKey(_KeyFault):
    """A key the mapping holds and the closed ``TypedDict`` does not declare."""

    def problem(self, what: str) -> str:
        return (
            f"{what} is not a key of the TypedDict {self.record.__qualname__}, which is "
            "closed. Leave it out, declare it, or give the TypedDict extra_items=... "
            "with the type of the keys it does not declare."
        )

    def found(self) -> str:
        keys = ", ".join(repr(key) for key in self.mapping)
        return f"the keys {keys}; {self.record.__qualname__} declares " + (
            ", ".join(repr(key) for key in _declared_keys(self.record)) or "none"
        )


_OPEN = object()
_CLOSED = object()


@functools.cache
def _extra_items(record: type) -> Any:
    """What the ``TypedDict`` ``record`` says of the keys it does not declare (PEP 728):
    the type of their values, :data:`_CLOSED` where it has none, :data:`_OPEN` where it
    takes any. A class that says nothing takes what the ``TypedDict`` it derives from
    says, as type checkers read it (the runtime does not pass it down)."""
    extra_items = getattr(record, "__extra_items__", typing_extensions.NoExtraItems)
    if extra_items is not typing_extensions.NoExtraItems:
        return _without_read_only(extra_items)
    closed = getattr(record, "__closed__", None)
    if closed is not None:
        return _CLOSED if closed else _OPEN
    parents = [base for base in getattr(record, "__orig_bases__", ()) if _is_typeddict(base)]
    return _extra_items(parents[0]) if parents else _OPEN


@functools.cache
def _declared_keys(record: type) -> tuple[str, ...]:
    """Every key the ``TypedDict`` ``record`` declares, those it may lack included, in
    the order it annotates them (its parents' first), or sorted where its annotations
    cannot be read (Python 3.14 evaluates them when read)."""
    declared = record.__required_keys__ | record.__optional_keys__
    try:
        annotated = [key for key in record.__annotations__ if key in declared]
    except Exception:
        return tuple(sorted(declared))
    return (*annotated, *sorted(declared.difference(annotated)))


@functools.cache
def _required_keys(record: type) -> tuple[str, ...]:
    """The keys the ``TypedDict`` ``record`` requires, in the order it annotates them.

    Under postponed annotations Python 3.11 builds the class while ``NotRequired[...]``
    and ``Required[...]`` are still strings, so its ``__required_keys__`` follows its
    ``total`` alone; the resolved annotations keep the marks, and a marked key follows
    its mark. Where the annotations cannot be resolved, :func:`_field_hints` warns that
    the fields are not checked, and no key is required.
    """
    try:
        hints = typing.get_type_hints(record, include_extras=True)
    except Exception:
        return ()
    by_total: frozenset[str] = getattr(record, "__required_keys__", frozenset())
    marks = {key: _key_mark(hint) for key, hint in hints.items()}
    return tuple(
        key
        for key, mark in marks.items()
        if mark is typing.Required or (mark is None and key in by_total)
    )


# typing_extensions' test knows typing's TypedDicts and its own (typing's does not know
# typing_extensions' on Python 3.11).
_is_typeddict = typing_extensions.is_typeddict


def _is_read_only(hint: Any) -> bool:
    return typing.get_origin(hint) is typing_extensions.ReadOnly


def _without_read_only(hint: Any) -> Any:
    return _without_read_only(typing.get_args(hint)[0]) if _is_read_only(hint) else hint


def _key_mark(hint: Any) -> Any:
    """``typing.Required`` or ``typing.NotRequired`` where ``hint`` is marked with it
    (inside ``Annotated[...]`` or ``ReadOnly[...]`` too), else ``None``."""
    origin = typing.get_origin(hint)
    if origin is typing.Annotated or _is_read_only(hint):
        return _key_mark(typing.get_args(hint)[0])
    return origin if origin in (typing.Required, typing.NotRequired) else None


def _is_record_class(hint: Any) -> bool:
    """A ``NamedTuple`` or a dataclass."""
    return isinstance(hint, type) and (
        dataclasses.is_dataclass(hint) or (issubclass(hint, tuple) and hasattr(hint, "_fields"))
    )


@functools.cache
def _field_hints(record: type) -> dict[str, Any]:
    """The field annotations of ``record`` that can be checked, resolved once; one that
    cannot be resolved or checked is left out, with a warning naming it."""
    try:
        hints = typing.get_type_hints(record)
    except Exception as error:
        warnings.warn(
            f"nnx_ppo: the field annotations of {record.__qualname__} are not checked: "
            f"resolving them raised {type(error).__name__}: {error}. Define the names they "
            "use at module level to have them checked; the contract's axis checks run "
            "either way.",
            stacklevel=_outside_the_library_level(),
        )
        return {}
    if dataclasses.is_dataclass(record):
        names = [field.name for field in dataclasses.fields(record)]
    else:  # a NamedTuple's fields, or a TypedDict's keys: every annotation
        names = list(hints)
        # ReadOnly (PEP 705) only qualifies the key, as Required does, which
        # get_type_hints strips; it strips ReadOnly only where typing has it.
        hints = {name: _without_read_only(hint) for name, hint in hints.items()}
    checkable = {}
    for name in names:
        try:
            _require_checkable(hints[name])
        except Exception as error:
            warnings.warn(
                f"nnx_ppo: the annotation of field {name} of {record.__qualname__} is not "
                f"checked: beartype cannot check {_hint_text(hints[name])} at run time "
                f"({type(error).__name__}). A typing.Protocol without @runtime_checkable "
                "does this: make it checkable to have it checked; the other fields and the "
                "contract's axis checks run either way.",
                stacklevel=_outside_the_library_level(),
            )
        else:
            checkable[name] = hints[name]
    return checkable


def _bearable(value: Any, hint: Any) -> bool:
    try:
        return is_bearable(value, hint)
    except (TypeError, ValueError):  # a value jaxtyping cannot flatten (unsortable keys)
        return False


def _is_container_of(
    value: Any, hint: Any, fields_checked: FieldsChecked, kind: type = object
) -> bool:
    """Whether ``hint`` is a container of ``kind`` that ``value`` is (``dict[...]``, a
    ``PyTree`` of arrays, a record whose fields are checked, ...)."""
    if _pytree_leaf_hint(hint) is not None:
        return kind is object and value is not None
    if kind is object and fields_checked(hint) and _fields_of(value, hint) is not None:
        return True
    origin = typing.get_origin(hint)
    return isinstance(origin, type) and issubclass(origin, kind) and isinstance(value, origin)


def _pytree_leaf_hint(hint: Any) -> Any:
    """The leaf hint of a jaxtyping ``PyTree[leaf]`` or ``PyTree[leaf, "S"]`` of arrays,
    else ``None``.

    A ``PyTree`` whose leaf type is itself a container is left to jaxtyping whole: its
    leaves are not those JAX's flattening finds.
    """
    if not (isinstance(hint, type) and issubclass(hint, PyTree)):
        return None
    leaf_hint = getattr(hint, "leaftype", None)
    return leaf_hint if _is_array_hint(leaf_hint) else None


def _is_array_hint(hint: Any) -> bool:
    if typing.get_origin(hint) in _UNIONS:
        return all(_is_array_hint(member) for member in typing.get_args(hint))
    return isinstance(hint, type) and issubclass(hint, AbstractArray | jax.Array | np.ndarray)


def _dimension_bindings() -> str:
    """The dimension sizes bound so far in this call, ``"B=8, T=4"``, or ``""``."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        print_bindings()
    lines = printed.getvalue().strip().splitlines()
    return ", ".join(line for line in lines if not line.endswith("are as follows."))


_ARGUMENT_DIMENSION = re.compile(r"\{(\w+(?:\.\w+)*)\}")
"""A dimension jaxtyping reads off the call's arguments: ``"{batch_size}"``, or the
module's attribute ``"{self.in_features}"``."""


def _with_argument_values(annotation: str, arguments: Mapping[str, Any]) -> str:
    """``annotation`` with each ``{argument}`` or ``{self.name}`` dimension shown as
    ``argument=value`` or ``name=value``; an expression other than a name is left as written."""

    def value(match: re.Match[str]) -> str:
        first, *attributes = match.group(1).split(".")
        held = arguments.get(first)
        for attribute in attributes:
            held = getattr(held, attribute, None)
        label = match.group(1).removeprefix("self.")
        return f"{label}={held}" if isinstance(held, int) else match.group(0)

    return _ARGUMENT_DIMENSION.sub(value, annotation)


_NUMPY_OR_JAX = re.compile(
    r"Union\[(\w+)\[Array, ('[^']*')\], \1\[ndarray, \2\]\]"
    r"|(\w+)\[Array, ('[^']*')\] \| \3\[ndarray, \4\]"
)
"""A JAX-or-NumPy union inside a written hint (``PyTree[Union[...]]`` or
``PyTree[... | ...]``), shown as the JAX type."""

_HINT_NAMES = (
    ("jaxtyping.", ""),
    ("jaxlib._jax.Array", "Array"),
    ("jax.Array", "Array"),
    ("numpy.ndarray", "ndarray"),
    ("typing.", ""),
)


def _hint_text(hint: Any) -> str:
    """``Float[Array, 'B 3']``, ``dict[str, Float[Array, 'B 3']]``: a hint as users write it.

    The contract's aliases accept NumPy arrays too; a union shows only the JAX member of
    each JAX and NumPy pair.
    """
    if typing.get_origin(hint) in _UNIONS:
        texts = [_hint_text(member) for member in typing.get_args(hint)]
        as_jax = {text: text.replace("[ndarray, ", "[Array, ") for text in texts}
        return " | ".join(t for t in texts if as_jax[t] == t or as_jax[t] not in texts)
    if hint is type(None):
        return "None"
    if isinstance(hint, type):
        text = hint.__qualname__ if hint.__module__ == "builtins" else hint.__name__
    else:
        text = repr(hint)
    for long, short in _HINT_NAMES:
        text = text.replace(long, short)
    return _NUMPY_OR_JAX.sub(
        lambda pair: f"{pair[1] or pair[3]}[Array, {pair[2] or pair[4]}]", text
    )


_FOUND_LIMIT = 400
"""Characters of a violating value shown; a pytree's repr can be pages long."""


_SHORT_DTYPES = (("bfloat", "bf"), ("float", "f"), ("uint", "u"), ("int", "i"), ("complex", "c"))


class _Summary:
    """Stands in for an array in a value's repr: ``f32[8,3]``, ``f64[8,3](numpy)``."""

    def __init__(self, leaf: jax.Array | np.ndarray) -> None:
        dtype = str(leaf.dtype)
        for long, short in _SHORT_DTYPES:
            if dtype.startswith(long):
                dtype = short + dtype.removeprefix(long)
                break
        numpy = "(numpy)" if isinstance(leaf, np.ndarray) else ""
        self.text = f"{dtype}[{','.join(str(size) for size in leaf.shape)}]{numpy}"

    def __repr__(self) -> str:
        return self.text


def _holds_itself(value: Any, enclosing: frozenset[int] = frozenset()) -> bool:
    """Whether a dict, list or tuple in ``value`` contains itself."""
    if not isinstance(value, dict | list | tuple):
        return False
    if id(value) in enclosing:
        return True
    items = value.values() if isinstance(value, dict) else value
    return any(_holds_itself(item, enclosing | {id(value)}) for item in items)


def _value_text(value: Any) -> str:
    """``value`` on one line, each array as its dtype and shape, cut at :data:`_FOUND_LIMIT`."""
    try:
        if _holds_itself(value):  # JAX's flattening would recurse until the interpreter fails
            raise ValueError
        shown = jax.tree_util.tree_map(
            lambda leaf: _Summary(leaf) if isinstance(leaf, jax.Array | np.ndarray) else leaf,
            value,
        )
        text = repr(shown)
    except Exception:  # a pytree that cannot be rebuilt (unsortable keys, checked fields)
        text = repr(value)
    text = " ".join(text.split())
    return text if len(text) <= _FOUND_LIMIT else text[:_FOUND_LIMIT] + " ..."
