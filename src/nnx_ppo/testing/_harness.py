"""What ``check_module`` and ``check_env`` share: the property table, the failure, the numbers.

Each checker keeps its properties in one ordered table of :class:`PropertyCheck`
rows; the checks run in the table's order, and the checker's docstring lists them
from the same table (:func:`document_properties`), so the order, the rules, the
docstring and the docs cannot drift apart.
"""

from __future__ import annotations

import enum
import functools
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import jax
import numpy as np
from jaxtyping import Array, PyTree, Shaped

from nnx_ppo.contract import ContractError, format_violation
from nnx_ppo.contract.checking import is_key, key_data_or_leaf
from nnx_ppo.contract.errors import _user_code_frame, rule_text

__all__ = [
    "Condition",
    "ContractPropertyError",
    "PropertyCheck",
    "as_numpy",
    "contract_leaf",
    "describe_difference",
    "document_properties",
    "host",
    "is_key",
    "property_failure",
    "show_values",
    "widened",
]

Case = TypeVar("Case")


@dataclass(frozen=True)
class Condition(Generic[Case]):
    """When a property applies: a sentence for the docs, and the test on one case."""

    text: str
    holds: Callable[[Case], bool]


@dataclass(frozen=True)
class PropertyCheck(Generic[Case]):
    """One row of a checker's table: the property, its rule, what is compared, and how.

    ``check(case)`` raises :class:`ContractPropertyError` when the property fails;
    ``applies`` (``None``: always) says when the checker runs it.
    """

    property: enum.StrEnum
    rule: str
    compared: str
    check: Callable[[Case], None]
    applies: Condition[Case] | None = None


def document_properties(docstring: str | None, table: Sequence[PropertyCheck[Any]]) -> str | None:
    """``docstring`` with its ``<properties>`` line replaced by the table as a numbered list.

    The list is indented like the placeholder. ``None`` (Python run with ``-OO``)
    stays ``None``.
    """
    if docstring is None:
        return None
    lines = docstring.splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.strip() == "<properties>"]
    indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
    items: list[str] = []
    for number, row in enumerate(table, start=1):
        when = "" if row.applies is None else f" Only when {row.applies.text}."
        head = f"{indent}{number}. "
        body = indent + " " * (len(head) - len(indent))
        fill = functools.partial(textwrap.fill, width=88, subsequent_indent=body)
        items.append(fill(f"``{row.property}``: {row.compared}.{when}", initial_indent=head))
        # A rule is plain text (failures quote it); "*feat" is not reST emphasis.
        rule = row.rule.replace("*", "\\*")
        items.append(fill(f"Rule: {rule}.", initial_indent=body))
    return "\n".join([*lines[:at], *items, *lines[at + 1 :]])


class ContractPropertyError(AssertionError):
    """A module or an environment broke a property of the contract.

    Raised by :func:`~nnx_ppo.testing.check_module` and
    :func:`~nnx_ppo.testing.check_env`. An ``AssertionError``, so pytest reports it
    as a test failure. Where a contract check raised :class:`nnx_ppo.ContractError`
    (or the module raised), the message quotes that error, and it is kept as
    :attr:`cause` (not chained, so that a failure report shows the message once).

    Attributes:
      property: the name of the broken property (a
        :class:`~nnx_ppo.testing.ModuleProperty` or
        :class:`~nnx_ppo.testing.EnvProperty` value).
      subject: the class name of the module or environment checked.
      sizes: the sizes of the failing example, e.g. ``{"B": 2, "T": 1}``; for a
        module, the smallest that Hypothesis found.
      leaf: the leaf (or variable) that differed, when one did.
      cause: the error raised by a contract check or by the code checked, when one was.
    """

    def __init__(
        self,
        message: str,
        *,
        property: str,
        subject: str,
        sizes: dict[str, int],
        leaf: str | None,
        cause: BaseException | None = None,
    ) -> None:
        super().__init__(message)
        self.property = property
        self.subject = subject
        self.sizes = dict(sizes)
        self.leaf = leaf
        self.cause = cause


# Reported under the name users import it by.
ContractPropertyError.__module__ = "nnx_ppo.testing"


PROPERTY_SECTIONS = {"check_module": "what-check-module-checks", "check_env": "environments"}
"""Each checker's section of the testing-kit page, which lists its properties."""


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
    hint: str | None = None,
) -> ContractPropertyError:
    """Build the error of a failed property.

    The first line names the property and the sizes, then one fact per line as in
    every contract message; an error that caused the failure is quoted below, and a
    hint, when there is one, closes the message.
    """
    shown = ", ".join(f"{name}={size}" for name, size in sizes.items())
    if rule is not None:
        rule = rule_text(rule, PROPERTY_SECTIONS[checker], "testing_kit")
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
        where = None if isinstance(cause, ContractError) else _user_code_frame(cause)
        if where is not None:
            message += f"\n    raised in your code at {where}"
    if hint is not None:
        message += f"\n  hint:     {hint}"
    return ContractPropertyError(
        message, property=prop, subject=subject, sizes=sizes, leaf=leaf, cause=cause
    )


def contract_leaf(error: BaseException) -> str | None:
    """The leaf a :class:`~nnx_ppo.ContractError` names; else ``None``."""
    return error.leaf if isinstance(error, ContractError) else None


# -------------------------------------------------------------------------- host arrays


def host(tree: PyTree[Shaped[Array, "..."]]) -> PyTree[Shaped[Any, "..."]]:
    """Leaves as NumPy arrays (PRNG keys stay JAX arrays, NumPy has no key dtype).

    The kit slices, permutes and stacks rows on the host: done with JAX outside a
    compiled function, every new shape would compile a small program of its own.
    """
    return jax.tree.map(lambda leaf: leaf if is_key(leaf) else np.asarray(leaf), tree)


def as_numpy(leaf: Any) -> np.ndarray:
    """A leaf as a NumPy array, a PRNG key as its raw key data."""
    return np.asarray(key_data_or_leaf(leaf))


def widened(values: np.ndarray) -> np.ndarray:
    """``values`` in float64, or complex128 where complex: compared or subtracted as
    float64, a complex leaf would lose its imaginary part."""
    return values.astype(np.complex128 if np.iscomplexobj(values) else np.float64)


def show_values(values: np.ndarray) -> str:
    """A short one-line rendering of an array for a message."""
    text = np.array2string(values, precision=4, threshold=8, separator=", ")
    return " ".join(text.split())


def describe_difference(a: np.ndarray, b: np.ndarray) -> str:
    """How two arrays differ, in one line: shape, dtype, first differing index, largest gap.

    Never the whole arrays: a message names where to look, the values stay in the
    debugger.
    """
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"shape {a.shape} {a.dtype} in one, shape {b.shape} {b.dtype} in the other"
    differ = a != b
    if np.issubdtype(a.dtype, np.inexact):
        differ &= ~(np.isnan(a) & np.isnan(b))
    count = int(np.count_nonzero(differ))
    first = tuple(int(i) for i in np.argwhere(differ)[0]) if count else ()
    text = f"shape {a.shape} {a.dtype}, {count} of {a.size} entries differ"
    if count:
        text += f"; first at index {first}: {a[first].item()} vs {b[first].item()}"
    if count and np.issubdtype(a.dtype, np.number):
        gap = np.abs(widened(a) - widened(b))
        text += f"; largest difference {np.nanmax(np.where(differ, gap, 0.0)):.3g}"
    return text
