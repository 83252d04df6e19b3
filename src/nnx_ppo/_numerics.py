"""Float32 moments that do not turn rounding into spread.

The float32 mean of equal values is often a rounding off them (the mean of 15 times
2.5 is 2.5000002), so a variance taken about it is that rounding squared: dividing
by its square root scales rounding up to unit size. One correction pass (the first
mean plus the mean of what is left) gives equal values their value back exactly, and
any other sample a more accurate mean.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp
from jaxtyping import Array, Float


def corrected_mean(
    x: Float[Array, "..."], axis: int | Sequence[int] | None = None
) -> Float[Array, "..."]:
    """The mean over ``axis`` (every axis by default), with one correction pass."""
    axes = None if axis is None else tuple(axis) if isinstance(axis, Sequence) else (axis,)
    first = jnp.mean(x, axis=axes, keepdims=True)
    corrected = first + jnp.mean(x - first, axis=axes, keepdims=True)
    return jnp.squeeze(corrected, axis=axes) if axes is not None else corrected.reshape(())


def moments(x: Float[Array, "..."]) -> tuple[Float[Array, ""], Float[Array, ""]]:
    """The mean (:func:`corrected_mean`) and population variance of every entry: the
    variance is exactly 0 for equal values."""
    mean = corrected_mean(x)
    return mean, jnp.mean(jnp.square(x - mean))


def variance(x: Float[Array, "..."]) -> Float[Array, ""]:
    """The population variance of every entry (:func:`moments`)."""
    return moments(x)[1]


def fraction_explained(
    unexplained: Float[Array, ""], targets: Float[Array, "..."]
) -> Float[Array, ""]:
    """``1 - unexplained / variance(targets)``; NaN where the targets do not vary, as
    there is no variance to explain (a fixed floor in the denominator made it a huge
    negative number instead)."""
    spread = variance(targets)
    return jnp.where(spread > 0, 1.0 - unexplained / jnp.where(spread > 0, spread, 1.0), jnp.nan)
