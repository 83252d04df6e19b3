"""The factories' kernel initialiser, drawn by compiled programs instead of op by op."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.core import Tracer
from jaxtyping import Array, Float, Key

from nnx_ppo._compile import fast_compile_options
from nnx_ppo._threefry import partitionable_bits

Initializer = Callable[..., Array]
"""``(key, shape, dtype) -> array``: flax's initialiser signature."""

SMALLEST_DRAW = 4096
"""Draws of matrices up to this many entries share one program (larger: one per power of 2)."""


@functools.cache
def variance_scaling_uniform(scale: float) -> Initializer:
    """``nnx.initializers.variance_scaling(scale, "fan_in", "uniform")``, in few programs.

    Called eagerly, as a module's ``__init__`` calls it, flax's initialiser
    dispatches each of its operations as a program of its own, and XLA compiles
    each once per shape: about 0.3 s for the uniform draw of one kernel shape on
    CPU. Here a float32 matrix of ``n`` entries is the first ``n`` of a flat draw
    of ``max(SMALLEST_DRAW, next power of 2)`` entries, one program per such size
    compiled with :func:`~nnx_ppo._compile.fast_compile_options`: the small
    layers of a network share one program. JAX's counter-based key bits make
    entry ``i`` of a draw the same whatever its size, so the values are flax's
    to float32 rounding (bit for bit on the machines measured). Other shapes and
    dtypes get one program per shape. Traced (a network built inside ``nnx.jit``
    or ``nnx.eval_shape``), it is flax's initialiser itself: compiler options
    belong to the outermost program.
    """
    initializer = nnx.initializers.variance_scaling(scale, "fan_in", "uniform")
    options = fast_compile_options()
    per_shape = jax.jit(initializer, static_argnums=(1, 2), compiler_options=options)
    flat = jax.jit(_flat_uniform, static_argnums=(2,), compiler_options=options)

    def draw(key: Key[Array, ""], shape: Sequence[int], dtype: Any = jnp.float32) -> Array:
        shape, dtype = tuple(shape), jnp.dtype(dtype)
        if isinstance(key, Tracer):
            return initializer(key, shape, dtype)
        # Only counter-based bits (JAX's default) are the same for every draw size.
        if len(shape) != 2 or dtype != jnp.float32 or not partitionable_bits():
            return per_shape(key, shape, dtype)
        entries = math.prod(shape)
        size = max(SMALLEST_DRAW, 1 << max(entries - 1, 0).bit_length())
        # As flax computes it: fan_in is the input axis, the variance a float32 array.
        variance = np.asarray(scale / shape[0], np.float32)
        drawn = np.asarray(flat(key, variance, size))[:entries].reshape(shape)
        # Placed as the per-shape program's output would be: on the key's device.
        return jax.device_put(drawn, key.sharding if key.committed else None)

    return draw


def zeros(key: Key[Array, ""], shape: Sequence[int], dtype: Any = jnp.float32) -> Array:
    """``nnx.initializers.zeros``, made by NumPy and transferred: no program to compile.

    ``jnp.zeros`` compiles a program per shape (10-20 ms apiece on CPU), as each
    bias of a network is drawn. ``key`` is unused, as in flax.
    """
    del key
    return jax.device_put(np.zeros(tuple(shape), jnp.dtype(dtype)))


def _flat_uniform(key: Key[Array, ""], variance: Float[Array, ""], size: int) -> Array:
    return jax.random.uniform(key, (size,), jnp.float32, -1) * jnp.sqrt(3 * variance)
