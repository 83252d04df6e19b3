"""Validation of constructor and config arguments, with errors that name the argument.

This is the one place where the library checks that an argument is an int or a
finite number within bounds, a flag or a PRNG key; every constructor, config and
checker calls it. NumPy scalars are accepted alongside Python's (a size computed
with NumPy is still a size); ``bool`` is not an int, although Python counts it as
one. Each helper hides its own frame from pytest's tracebacks
(``__tracebackhide__``): a failing test shows the caller's line and the message.
"""

import inspect
import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.core import Tracer

__all__ = [
    "as_whole",
    "is_int",
    "one_key_ndim",
    "require_bool",
    "require_callable",
    "require_called_eagerly",
    "require_int",
    "require_key",
    "require_number",
    "require_sizes",
]


def is_int(value: Any) -> bool:
    """Whether ``value`` is an ``int`` or a NumPy integer (a ``bool`` is neither)."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def as_whole(value: Any) -> Any:
    """``value`` as an ``int`` where it is a whole number written another way (a whole
    float such as ``1e6`` or ``np.float32(3)``, or a 0-d integer or whole float array);
    anything else as it is, for :func:`require_int` to judge. nnx-ppo 0.3.0 took counts
    in these forms."""
    if isinstance(value, float | np.floating) and float(value).is_integer():
        return int(value)
    dtype = getattr(value, "dtype", None)
    if dtype is None or np.ndim(value) != 0:
        return value
    if np.issubdtype(dtype, np.integer):
        return int(value)
    if np.issubdtype(dtype, np.floating) and float(value).is_integer():
        return int(value)
    return value


def _allowed(minimum: float | None, maximum: float | None, strict: bool = False) -> str:
    """What a value must do to lie within the bounds (one at least): ``"be >= 0"``."""
    if minimum is not None and maximum is not None:
        return f"lie in {'(' if strict else '['}{minimum}, {maximum}]"
    if minimum is not None:
        return f"be {'>' if strict else '>='} {minimum}"
    return f"be <= {maximum}"


def require_int(
    owner: str, name: str, value: Any, minimum: int | None = 1, maximum: int | None = None
) -> int:
    """``value`` as an ``int`` if it is one in ``[minimum, maximum]``; else a clear error.

    Args:
      owner: who takes the argument (a class or function name), for the message.
      name: the argument's name, for the message.
      value: the argument.
      minimum: the least value allowed; ``None`` for no lower bound.
      maximum: the greatest value allowed; ``None`` for no upper bound.

    Raises:
      TypeError: ``value`` is not an ``int`` or NumPy integer (a ``bool`` is not accepted).
      ValueError: ``value`` lies outside ``[minimum, maximum]``.
    """
    __tracebackhide__ = True
    if not is_int(value):
        raise TypeError(f"{owner}: {name} must be an int, got {type(value).__name__} {value!r}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        positive = minimum == 1 and maximum is None
        allowed = "be a positive int" if positive else _allowed(minimum, maximum)
        raise ValueError(f"{owner}: {name} must {allowed}, got {value}")
    return int(value)


def require_number(
    owner: str,
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    strict: bool = False,
) -> float:
    """``value`` as a ``float`` if it is a finite number within bounds; else a clear error.

    Args:
      owner: who takes the argument (a class or function name), for the message.
      name: the argument's name, for the message.
      value: the argument.
      minimum: the least value allowed; ``None`` for no lower bound.
      maximum: the greatest value allowed; ``None`` for no upper bound.
      strict: exclude ``minimum`` itself (``minimum=0.0, strict=True``: positive).

    A 0-d NumPy or JAX array of integers or floats is taken as its number.

    Raises:
      TypeError: ``value`` is not a finite real number: NaN, an infinity, a ``bool``
        or no number at all.
      ValueError: ``value`` lies outside the bounds.
    """
    __tracebackhide__ = True
    if _is_concrete_scalar(value):  # a 0-d array: jnp.array(5.0), np.float32 arrays
        value = value.item()
    real = isinstance(value, int | float | np.integer | np.floating)
    if isinstance(value, bool) or not real or not math.isfinite(value):
        raise TypeError(
            f"{owner}: {name} must be a finite number, got {type(value).__name__} {value!r}"
        )
    below = minimum is not None and (value < minimum or (strict and value == minimum))
    if below or (maximum is not None and value > maximum):
        raise ValueError(f"{owner}: {name} must {_allowed(minimum, maximum, strict)}, got {value}")
    return float(value)


def _is_concrete_scalar(value: Any) -> bool:
    """A 0-d NumPy or JAX array of integers or floats, not traced: it has one number."""
    return (
        isinstance(value, np.ndarray | jax.Array)
        and not isinstance(value, Tracer)
        and value.shape == ()
        and value.dtype.kind in "iuf"
    )


def require_bool(owner: str, name: str, value: Any, *, also: str | None = None) -> bool:
    """``value`` as a ``bool`` if it is one (a NumPy ``bool`` too); else a clear error.

    A flag is never taken by its truth: ``bool("false")`` is ``True``.

    Args:
      owner: who takes the argument (a class or function name), for the message.
      name: the argument's name, for the message.
      value: the argument.
      also: the argument's other settings, which the caller handles before calling
        this, for the message (``"'per_episode'"``).

    Raises:
      TypeError: ``value`` is not a ``bool``.
    """
    __tracebackhide__ = True
    if not isinstance(value, bool | np.bool_):
        allowed = "True or False" if also is None else f"True, False or {also}"
        raise TypeError(f"{owner}: {name} must be {allowed}, got {type(value).__name__} {value!r}")
    return bool(value)


def require_sizes(owner: str, name: str, value: Any) -> list[int]:
    """``value``, a sequence of positive ints (layer widths), as a list; else a clear error.

    Raises:
      TypeError: ``value`` is no sequence (a bare ``64``, a string), or an entry is not
        an int.
      ValueError: an entry is not positive.
    """
    __tracebackhide__ = True
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise TypeError(
            f"{owner}: {name} must be a sequence of ints, e.g. [64, 64], got "
            f"{type(value).__name__} {value!r}"
        )
    return [require_int(owner, f"{name} entry", size) for size in value]


def require_callable(
    owner: str, name: str, value: Any, arguments: Sequence[str] | None = None
) -> None:
    """Raise ``TypeError`` unless ``value`` is callable or ``None`` (an optional callback),
    and, given the names of the ``arguments`` it will be called with, can take them."""
    __tracebackhide__ = True
    if value is None:
        return
    if not callable(value):
        raise TypeError(
            f"{owner}: {name} must be a function or None, got {type(value).__name__} {value!r}"
        )
    if arguments is None:
        return
    try:
        signature = inspect.signature(value)
        # A decorator's wrapper is what gets called: one that supplies an argument itself
        # declares the wrapped function's signature through functools.wraps.
        wrapper = inspect.signature(value, follow_wrapped=False)
    except (TypeError, ValueError):  # a callable Python cannot describe (some built-ins)
        return
    try:
        signature.bind(*arguments)
    except TypeError as error:
        try:
            wrapper.bind(*arguments)
        except TypeError:
            raise TypeError(
                f"{owner}: {name} is called as {name}({', '.join(arguments)}), but "
                f"{getattr(value, '__name__', type(value).__name__)}{signature} cannot take "
                f"that: {error}"
            ) from None


def require_key(owner: str, name: str, value: Any) -> Any:
    """``value`` if it is one PRNG key: a typed key of shape ``()`` (``jax.random.key``) or
    a raw ``uint32`` key of shape ``(k,)``, its words (``(2,)`` from
    ``jax.random.PRNGKey``); else a clear error.

    Raises:
      TypeError: ``value`` is no key (an int seed, an array of another dtype).
      ValueError: ``value`` holds several keys, or a raw key of another shape.
    """
    __tracebackhide__ = True
    one_ndim = one_key_ndim(value)
    if one_ndim is None:
        dtype = getattr(value, "dtype", None)
        seed = f"; for the seed {value}, pass jax.random.key({value})" if is_int(value) else ""
        found = (
            f"{type(value).__name__} {value!r}"
            if dtype is None or is_int(value)
            else f"a {dtype} array of shape {tuple(np.shape(value))}"
        )
        raise TypeError(f"{owner}: {name} must be one PRNG key, got {found}{seed}")
    shape, typed = tuple(value.shape), one_ndim == 0
    if len(shape) != one_ndim:
        several = len(shape) > one_ndim
        fix = f"; pass one of them, e.g. {name}[0]" if several else ""
        raise ValueError(
            f"{owner}: {name} must be one PRNG key, a typed key of shape () or a raw uint32 "
            f"key of shape (2,), got {'keys' if typed else 'a uint32 array'} of shape "
            f"{shape}{fix}"
        )
    return value


def one_key_ndim(value: Any) -> int | None:
    """The rank of one PRNG key of ``value``'s kind: 0 for a typed key, 1 for a raw
    ``uint32`` key (its axis holds the key's words: 2 for threefry, 4 for rbg); ``None``
    where ``value`` is no key array."""
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        return None
    if jax.numpy.issubdtype(dtype, jax.dtypes.prng_key):
        return 0
    return 1 if dtype == np.uint32 else None


def require_called_eagerly(owner: str, tree: Any) -> None:
    """Refuse a call made inside ``jax.jit``, ``nnx.jit`` or another JAX transform (a
    leaf of ``tree`` is traced): ``owner`` compiles its own programs and hands its
    results to the host, which a traced call cannot."""
    if any(isinstance(leaf, Tracer) for leaf in jax.tree.leaves(tree)):
        raise TypeError(
            f"{owner} was called inside jax.jit, nnx.jit or another JAX transform: it "
            "compiles its own programs and returns its metrics as Python floats, which a "
            "traced call cannot. Call it without the transform: unlike nnx-ppo 0.3.0's, it "
            "compiles itself, once per env, network structure and settings."
        )
