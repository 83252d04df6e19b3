"""JAX's default random keys, hashed by straight-line code for several runs at once.

JAX lowers the Threefry-2x32 hash behind ``jax.random``'s default keys as a
5-iteration loop on CPU. XLA compiles such a loop into one kernel only while its
state fits a small budget (``xla_cpu_small_while_loop_byte_threshold``, 1 kB).
One run's draws in a PPO step (a key per env, a few noise values) fit; several
runs ``vmap``-ed in one program do not, and each of their loops then runs as
dozens of tiny kernels, and makes LLVM compile more. The several-runs program
therefore hashes with :data:`STRAIGHT_LINE_THREEFRY`: a key type whose split,
fold-in and bits compute exactly the numbers JAX's own keys give, with the 20
rounds written out so that XLA fuses them like any element-wise work.

Keys enter and leave that program as JAX's own (:func:`straight_line_keys`,
:func:`standard_keys`), so nothing outside sees the difference and every seeded
result is unchanged; ``tests/test_threefry.py`` checks the equality draw by draw.
The env states keep JAX's own keys inside the program too, and the env's
``reset`` and ``step`` get theirs as straight-line keys, handing back JAX's own
(``rollout._env_draws_straight_line``): an env that keeps its key in its state
finds there the type its ``reset`` gave it. One run's programs
keep JAX's loop: the straight-line hash ran the small CartPole configuration's
whole-run call about 18% slower (``benchmarks/README.md``, "Several runs' keys
hashed without JAX's loop").
"""

from __future__ import annotations

import math
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.random import define_prng_impl, threefry_prng_impl
from jaxtyping import Array, Shaped, UInt32

from nnx_ppo.contract.checking import is_key

_Tree = TypeVar("_Tree")
"""Any pytree; its keys are rewrapped, its structure kept. (``rollout.Tree``'s twin: this
module sits below the engine, which imports it.)"""

_STANDARD = "threefry2x32"
"""``jax.random.key_impl`` of JAX's default keys."""

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
"""Threefry-2x32's rotation distances, alternating between blocks of four rounds."""

_KEY_PARITY = np.uint32(0x1BD11BDA)
"""The constant Threefry xors into the key words to make the third word of its schedule."""

_LARGEST_STRAIGHT_LINE_DRAW = 2**32
"""Draws this large or larger need 64-bit counters; they go to JAX's own implementation."""


def _rotate_left(x: UInt32[Array, "*s"], distance: int) -> UInt32[Array, "*s"]:
    return lax.shift_left(x, np.uint32(distance)) | lax.shift_right_logical(
        x, np.uint32(32 - distance)
    )


def _hash(
    key: UInt32[Array, "2"], high: UInt32[Array, "*s"], low: UInt32[Array, "*s"]
) -> tuple[UInt32[Array, "*s"], UInt32[Array, "*s"]]:
    """Threefry-2x32 (20 rounds) of the counter words ``(high, low)`` under ``key``."""
    schedule = (key[0], key[1], key[0] ^ key[1] ^ _KEY_PARITY)
    x0, x1 = high + schedule[0], low + schedule[1]
    for block in range(5):
        for distance in _ROTATIONS[block % 2]:
            x0 = x0 + x1
            x1 = _rotate_left(x1, distance) ^ x0
        x0 = x0 + schedule[(block + 1) % 3]
        x1 = x1 + schedule[(block + 2) % 3] + np.uint32(block + 1)
    return x0, x1


def _counters(shape: tuple[int, ...]) -> tuple[UInt32[Array, "*s"], UInt32[Array, "*s"]]:
    """The 64-bit row-major index of each element of ``shape`` as ``(high, low)`` words."""
    low = lax.iota(np.uint32, math.prod(shape)).reshape(shape)
    return jnp.zeros(shape, np.uint32), low


def _split(key: UInt32[Array, "2"], shape: tuple[int, ...]) -> UInt32[Array, "*s 2"]:
    if math.prod(shape) >= _LARGEST_STRAIGHT_LINE_DRAW:
        return threefry_prng_impl.split(key, shape)
    return jnp.stack(_hash(key, *_counters(shape)), axis=-1)


def _random_bits(
    key: UInt32[Array, "2"], bit_width: int, shape: tuple[int, ...]
) -> Shaped[Array, "*s"]:
    if math.prod(shape) >= _LARGEST_STRAIGHT_LINE_DRAW:
        return threefry_prng_impl.random_bits(key, bit_width, shape)
    high, low = _hash(key, *_counters(shape))
    if bit_width == 64:
        wide = jnp.dtype("uint64")
        shifted = lax.shift_left(lax.convert_element_type(high, wide), np.uint64(32))
        return shifted | lax.convert_element_type(low, wide)
    return lax.convert_element_type(high ^ low, jnp.dtype(f"uint{bit_width}"))


def _fold_in(key: UInt32[Array, "2"], data: Any) -> UInt32[Array, "2"]:
    message = lax.convert_element_type(jnp.asarray(data), np.uint32)
    return jnp.stack(_hash(key, jnp.zeros((), np.uint32), message))


STRAIGHT_LINE_THREEFRY = define_prng_impl(
    key_shape=(2,),
    seed=threefry_prng_impl.seed,
    split=_split,
    random_bits=_random_bits,
    fold_in=_fold_in,
    name="threefry2x32_straight_line",
    tag="fry_sl",
)
"""JAX's Threefry-2x32 keys, hashed without a loop: the same numbers from every draw."""


def _rewrap(tree: _Tree, source: Any, target: Any) -> _Tree:
    def rewrap(leaf: Any) -> Any:
        if is_key(leaf) and jax.random.key_impl(leaf) == source:
            return jax.random.wrap_key_data(jax.random.key_data(leaf), impl=target)
        return leaf

    return jax.tree.map(rewrap, tree)


def partitionable_bits() -> bool:
    """Whether JAX draws its keys' numbers by the (default) partitionable scheme."""
    return bool(jax.config.values["jax_threefry_partitionable"])


def straight_line_keys(tree: _Tree) -> _Tree:
    """``tree`` with each of JAX's default keys as the same key of :data:`STRAIGHT_LINE_THREEFRY`.

    A no-op when ``jax_threefry_partitionable`` is off: the straight-line hash gives
    the numbers of JAX's (default) partitionable scheme only.
    """
    if not partitionable_bits():
        return tree
    return _rewrap(tree, _STANDARD, STRAIGHT_LINE_THREEFRY)


def standard_keys(tree: _Tree) -> _Tree:
    """``tree`` with each :data:`STRAIGHT_LINE_THREEFRY` key back as JAX's default key."""
    return _rewrap(tree, STRAIGHT_LINE_THREEFRY, _STANDARD)
