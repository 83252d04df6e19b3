"""The one exception type of the contract, and the builder of its messages."""

from __future__ import annotations

import sysconfig
import traceback
from pathlib import Path

import jax
import jaxtyping

__all__ = ["DOCS_URL", "ContractError", "format_violation", "rule_text"]

DOCS_URL = "https://nnx-ppo.readthedocs.io/en/latest/"
"""Where the documentation lives; contract messages link into its pages."""


def rule_text(rule: str, anchor: str, page: str = "contract") -> str:
    """A rule in words, followed by the link to the docs section that explains it.

    Args:
      rule: the rule, one sentence without a final period.
      anchor: the section's anchor on ``page`` (its title, lower-cased and hyphenated).
      page: the docs page, without ``.html``.
    """
    return f"{rule} (see {DOCS_URL}{page}.html#{anchor})"


class ContractError(jaxtyping.TypeCheckError):
    """A module, container or environment broke the nnx-ppo batching contract.

    Raised while JAX traces, so it surfaces before anything is compiled. It is a
    subclass of :class:`jaxtyping.TypeCheckError` (itself a :class:`TypeError`),
    so code that already catches jaxtyping's errors catches this one too.

    Attributes:
      where: the module (with its path in the network) and method, or the env field.
      leaf: the argument and leaf path that broke the rule, e.g. ``"state['h']"``.
      expected: the expected axes with their bound sizes.
      found: what was found.
      rule: the contract rule, in words.
      (Each is ``None`` when the message does not state it.)
    """

    where: str | None = None
    leaf: str | None = None
    expected: str | None = None
    found: str | None = None
    rule: str | None = None

    @classmethod
    def violation(
        cls,
        where: str,
        problem: str,
        *,
        leaf: str | None = None,
        expected: str | None = None,
        found: str | None = None,
        rule: str | None = None,
    ) -> "ContractError":
        """An error whose message :func:`format_violation` writes, its parts kept as attributes."""
        error = cls(
            format_violation(where, problem, leaf=leaf, expected=expected, found=found, rule=rule)
        )
        error.where, error.leaf, error.expected, error.found, error.rule = (
            where,
            leaf,
            expected,
            found,
            rule,
        )
        return error


def format_violation(
    where: str,
    problem: str,
    *,
    leaf: str | None = None,
    expected: str | None = None,
    found: str | None = None,
    rule: str | None = None,
) -> str:
    """Build a contract-violation message with one fact per line.

    Args:
      where: the module (class and path in the network) and method, e.g.
        ``"Sequential.layers[2] (MyLSTM).__call__"``.
      problem: one sentence saying what is wrong.
      leaf: the argument and leaf path, e.g. ``"state['h']"``.
      expected: the expected axes with bound sizes, e.g. ``"(B, *feat) with B=8"``.
      found: what was found, e.g. ``"shape (16,) float32"``.
      rule: the contract rule that was broken, in words.
    """
    lines = [f"{where}: {problem}"]
    for label, value in (
        ("leaf", leaf),
        ("expected", expected),
        ("found", found),
        ("rule", rule),
    ):
        if value is not None:
            lines.append(f"  {label + ':':<9} {value}")
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty and mesh.size > 1:
        sizes = ", ".join(f"{name}={size}" for name, size in mesh.shape.items())
        lines.append(
            f"  {'devices:':<9} traced over a mesh ({sizes}): B and every shape above are "
            "global, the whole batch, not one device's share"
        )
    return "\n".join(lines)


_LIBRARY_DIRS = (
    str(Path(__file__).resolve().parents[1]),  # nnx_ppo
    sysconfig.get_paths()["stdlib"],
    sysconfig.get_paths()["purelib"],  # JAX, Flax, Hypothesis, ...
    sysconfig.get_paths()["platlib"],
)


def _user_code_frame(error: BaseException) -> str | None:
    """``file:line in function`` of the innermost frame of ``error``'s traceback outside
    nnx-ppo, the standard library and installed packages: the user's line that raised;
    ``None`` where every frame is the library's (or Python's, or a package's)."""
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        path = str(Path(frame.filename).resolve())
        if not path.startswith(_LIBRARY_DIRS) and not frame.filename.startswith("<"):
            return f"{frame.filename}:{frame.lineno} in {frame.name}"
    return None
