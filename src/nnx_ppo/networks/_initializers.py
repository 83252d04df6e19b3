"""The factories' kernel initialiser, drawn by compiled programs instead of op by op."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.core import Tracer
from jaxtyping import Array, Key

from nnx_ppo._compile import fast_compile_options

Initializer = Callable[..., Array]
"""``(key, shape, dtype) -> array``: flax's initialiser signature."""


@functools.cache
def variance_scaling_uniform(scale: float) -> Initializer:
    """``nnx.initializers.variance_scaling(scale, "fan_in", "uniform")``, one program per draw.

    Called eagerly, as a module's ``__init__`` calls it, flax's initialiser
    dispatches each of its operations as a program of its own, and XLA compiles
    each once per shape: about 0.3 s for the uniform draw of one kernel shape on
    CPU. Here each shape's draw is one program, compiled with
    :func:`~nnx_ppo._compile.fast_compile_options` (it runs once per network), at
    a fraction of that cost. The values are flax's to float32 rounding (bit for
    bit on the machines measured). Cached per ``scale``, so every network built
    with it reuses the programs. Traced (a network built inside ``nnx.jit`` or
    ``nnx.eval_shape``), it is flax's initialiser itself: compiler options
    belong to the outermost program.
    """
    initializer = nnx.initializers.variance_scaling(scale, "fan_in", "uniform")
    jitted = jax.jit(initializer, static_argnums=(1, 2), compiler_options=fast_compile_options())

    def draw(key: Key[Array, ""], shape: Sequence[int], dtype: Any = jnp.float32) -> Array:
        if isinstance(key, Tracer):
            return initializer(key, tuple(shape), jnp.dtype(dtype))
        return jitted(key, tuple(shape), jnp.dtype(dtype))

    return draw
