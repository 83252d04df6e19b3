"""Validation of constructor and config arguments, with errors that name the argument."""

import math
from typing import Any

__all__ = ["require_int", "require_number"]


def require_int(owner: str, name: str, value: Any, minimum: int = 1) -> int:
    """``value`` if it is an ``int`` of at least ``minimum``; else a clear error.

    Raises:
      TypeError: ``value`` is not an ``int`` (a ``bool`` is not accepted).
      ValueError: ``value`` is below ``minimum``.
    """
    wanted = "a positive int" if minimum == 1 else f"an int >= {minimum}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{owner}: {name} must be {wanted}, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{owner}: {name} must be {wanted}, got {value}")
    return value


def require_number(
    owner: str, name: str, value: Any, *, minimum: float = -math.inf, strict: bool = False
) -> float:
    """``value`` as a float if it is a finite number ``>= minimum``; else a clear error.

    Raises:
      TypeError: ``value`` is not a finite real number (a ``bool`` is not accepted).
      ValueError: ``value`` is below ``minimum`` (or equal to it, when ``strict``).
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TypeError(f"{owner}: {name} must be a finite number, got {value!r}")
    if value < minimum or (strict and value == minimum):
        bound = f"> {minimum}" if strict else f">= {minimum}"
        raise ValueError(f"{owner}: {name} must be {bound}, got {value}")
    return float(value)
