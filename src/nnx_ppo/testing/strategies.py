"""Hypothesis strategies for contract tests of stateful modules and containers.

Every strategy draws from a few fixed sizes and shapes on purpose: JAX compiles
once per distinct shape, so a property test that reuses shapes across examples
stays fast, also on a laptop or a small CI runner.

* :func:`batch_sizes`, :func:`time_lengths`: the ``B`` and ``T`` of a test.
* :func:`pytree_observations`: batched pytrees of arrays, random or shaped like an
  example (an observation, a carry state, a rollout_extras tree).
* :func:`container_nestings`: random nestings of the four containers over small
  leaf modules, each a :class:`Nesting` with the input spec it accepts.

Example::

    import jax
    from hypothesis import given, strategies as st
    from nnx_ppo.testing import strategies as nst

    @given(nst.container_nestings(), nst.batch_sizes(), st.data())
    def test_output_is_batched(nesting, batch_size, data):
        x = data.draw(nst.pytree_observations(nesting.input_spec, batch_size=batch_size))
        out = nesting.module(nesting.module.initialize_state(batch_size), x)
        assert all(leaf.shape[0] == batch_size for leaf in jax.tree.leaves(out.output))
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from hypothesis import strategies as st
from jaxtyping import Array, PyTree, Shaped

from nnx_ppo.contract.arguments import require_int
from nnx_ppo.contract.axes import BatchedTree
from nnx_ppo.contract.checking import held_dtype
from nnx_ppo.networks.containers import Concat, Parallel, Sequential, Splitter
from nnx_ppo.networks.types import StatefulModule
from nnx_ppo.testing.modules import LEAF_FACTORIES, LeafFactory

__all__ = [
    "BATCH_SIZES",
    "FEATURE_SHAPES",
    "INPUT_WIDTHS",
    "TIME_LENGTHS",
    "Nesting",
    "batch_sizes",
    "container_nestings",
    "pytree_observations",
    "time_lengths",
]

BATCH_SIZES: tuple[int, ...] = (1, 2, 3, 5, 8)
"""The batch sizes :func:`batch_sizes` draws from (1 and a prime or two on purpose)."""

TIME_LENGTHS: tuple[int, ...] = (1, 2, 4)
"""The rollout lengths :func:`time_lengths` draws from."""

FEATURE_SHAPES: tuple[tuple[int, ...], ...] = ((), (1,), (3,), (2, 3))
"""The per-sample shapes of the leaves :func:`pytree_observations` invents."""

INPUT_WIDTHS: tuple[int, ...] = (2, 3, 4)
"""The input feature counts :func:`container_nestings` draws from."""

_DRAWN_KINDS = (jax.dtypes.prng_key, jnp.bool_, jnp.integer, jnp.inexact)
"""The kinds of dtype :func:`pytree_observations` invents values of."""

_DRAWN_DTYPES = "floats (complex too), integers, booleans and PRNG keys"
"""What :func:`pytree_observations` invents leaves of, in words, for messages."""

_KEYS = ("a", "b", "c")
_SEEDS = st.integers(0, 2**32 - 1)


def batch_sizes() -> st.SearchStrategy[int]:
    """A batch size ``B`` from :data:`BATCH_SIZES`.

    Use ``batch_sizes().filter(lambda b: b > 1)`` where a test needs two rows.
    """
    return st.sampled_from(BATCH_SIZES)


def time_lengths() -> st.SearchStrategy[int]:
    """A rollout length ``T`` from :data:`TIME_LENGTHS`."""
    return st.sampled_from(TIME_LENGTHS)


# ------------------------------------------------------------------------ observations


def _can_draw(dtype: Any) -> bool:
    """Whether :func:`pytree_observations` can invent values of ``dtype``."""
    return any(jnp.issubdtype(dtype, kind) for kind in _DRAWN_KINDS)


def _random_leaf(
    rng: np.random.Generator, shape: tuple[int, ...], dtype: Any
) -> Shaped[Array, "..."]:
    # The dtype JAX holds: asked for float64 with x64 off, it warns at every draw.
    dtype = held_dtype(dtype)
    if jnp.issubdtype(dtype, jax.dtypes.prng_key):
        seed = int(rng.integers(0, 2**31 - 1))
        return jax.random.split(jax.random.key(seed), math.prod(shape)).reshape(shape)
    if jnp.issubdtype(dtype, jnp.bool_):
        return jnp.asarray(rng.random(shape) < 0.5)
    if jnp.issubdtype(dtype, jnp.unsignedinteger):
        return jnp.asarray(rng.integers(0, 4, shape), dtype=dtype)
    if jnp.issubdtype(dtype, jnp.integer):
        return jnp.asarray(rng.integers(-3, 4, shape), dtype=dtype)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        # Both parts drawn: a module that mixes envs in the imaginary part alone would
        # go unseen on inputs whose imaginary part is 0.
        parts = rng.standard_normal((2, *shape))
        return jnp.asarray(parts[0] + 1j * parts[1], dtype=dtype)
    if jnp.issubdtype(dtype, jnp.inexact):
        return jnp.asarray(rng.standard_normal(shape), dtype=dtype)
    raise TypeError(
        f"pytree_observations cannot invent values of dtype {dtype}; it draws {_DRAWN_DTYPES}"
    )


def _batched_like(example: Any, batch_size: int, seed: int) -> Any:
    rng = np.random.default_rng(seed)

    def leaf(path: Any, spec: Any) -> Any:
        if not (hasattr(spec, "shape") and hasattr(spec, "dtype")):
            raise TypeError(
                f"pytree_observations: example leaf {jax.tree_util.keystr(path)} is a "
                f"{type(spec).__name__}; give arrays or jax.ShapeDtypeStruct leaves"
            )
        return _random_leaf(rng, (batch_size, *spec.shape), spec.dtype)

    return jax.tree_util.tree_map_with_path(leaf, example)


def _observation_specs(depth: int) -> st.SearchStrategy[dict[str, Any]]:
    leaf = st.sampled_from(FEATURE_SHAPES).map(lambda s: jax.ShapeDtypeStruct(s, jnp.float32))
    child = leaf if depth <= 1 else st.one_of(leaf, st.deferred(lambda: _observation_specs(1)))
    return st.dictionaries(st.sampled_from(_KEYS), child, min_size=1, max_size=len(_KEYS))


def pytree_observations(
    example: Any = None, *, batch_size: int | None = None
) -> st.SearchStrategy[BatchedTree]:
    """Batched pytrees of random arrays: ``(B, *shape)`` leaves.

    Args:
      example: ``None`` to invent a tree: nested dicts (up to two levels, keys
        from ``"a"``, ``"b"``, ``"c"``) of float32 leaves with per-sample shapes
        from :data:`FEATURE_SHAPES`. Otherwise a pytree describing **one**
        sample, with arrays or ``jax.ShapeDtypeStruct`` leaves: the result has its
        structure, and each leaf ``(B, *leaf.shape)`` of the leaf's dtype as JAX
        holds it, float64 as float32 unless x64 is on (floats standard normal,
        complex numbers with both parts so, integers in ``[-3, 3]`` (``[0, 3]``
        unsigned), booleans, or PRNG keys). Use it for carry states and
        rollout_extras, e.g. ``jax.eval_shape`` of ``initialize_state(1)`` with the
        leading axis dropped.
      batch_size: the ``B`` of every leaf, a positive int; drawn from
        :func:`batch_sizes` if None.

    Raises:
      TypeError, ValueError: ``batch_size`` is not a positive int.
    """
    specs = _observation_specs(depth=2) if example is None else st.just(example)
    sizes = (
        batch_sizes()
        if batch_size is None
        else st.just(require_int("pytree_observations", "batch_size", batch_size))
    )
    return st.builds(_batched_like, specs, sizes, _SEEDS)


# -------------------------------------------------------------------------- nestings


@dataclass(frozen=True, repr=False)
class Nesting:
    """A module drawn by :func:`container_nestings`, with the input it accepts.

    Attributes:
      module: the root :class:`~nnx_ppo.networks.types.StatefulModule`.
      input_spec: one sample of its input, a pytree of ``jax.ShapeDtypeStruct``
        without the batch axis; draw inputs with
        ``pytree_observations(nesting.input_spec, batch_size=B)``.
      description: the nesting in one line, e.g.
        ``"Sequential[Splitter(a=1, b=2), Concat{a: Linear(1->3), b: RunningSum(2->2)}]"``.
    """

    module: StatefulModule
    input_spec: PyTree[jax.ShapeDtypeStruct]
    description: str

    def __repr__(self) -> str:
        # Hypothesis prints drawn values with repr: show the structure, not the weights.
        return f"Nesting({self.description})"


@dataclass(frozen=True)
class _Block:
    """A module mapping ``(B, in_width)`` to ``(B, out_width)``."""

    module: StatefulModule
    out_width: int
    description: str


def _share(budget: int, parts: int) -> list[int]:
    """Split ``budget`` leaves as evenly as possible among ``parts`` children."""
    return [budget // parts + (1 if i < budget % parts else 0) for i in range(parts)]


def _output_width(module: StatefulModule, in_width: int, factory: LeafFactory) -> int:
    state = nnx.eval_shape(lambda m: m.initialize_state(1), module)
    x = jax.ShapeDtypeStruct((1, in_width), jnp.float32)
    output = nnx.eval_shape(lambda m, s, x: m(s, x).output, module, state, x)
    if not isinstance(output, jax.ShapeDtypeStruct) or output.ndim != 2:
        raise TypeError(
            f"container_nestings: leaf factory {getattr(factory, '__name__', factory)!r} built "
            f"a {type(module).__name__} whose output on (B, {in_width}) is {output}, "
            "not one (B, n) array"
        )
    return int(output.shape[1])


class _Builder:
    """Draws the parts of one nesting; every block maps ``(B, n)`` to ``(B, m)``."""

    def __init__(self, draw: st.DrawFn, factories: tuple[LeafFactory, ...], rngs: nnx.Rngs) -> None:
        self.draw = draw
        self.factories = factories
        self.rngs = rngs

    def keys(self, most: int) -> list[str]:
        return self.draw(
            st.lists(st.sampled_from(_KEYS), min_size=1, max_size=min(most, 3), unique=True)
        )

    def leaf(self, width: int) -> _Block:
        factory = self.draw(st.sampled_from(self.factories))
        module = factory(width, self.rngs)
        if not isinstance(module, StatefulModule):
            raise TypeError(
                f"container_nestings: leaf factory {getattr(factory, '__name__', factory)!r} "
                f"returned a {type(module).__name__}, not a StatefulModule"
            )
        out_width = _output_width(module, width, factory)
        name = type(module).__name__
        return _Block(module, out_width, f"{name}({width}->{out_width})")

    def block(self, width: int, depth: int, budget: int) -> _Block:
        kinds = ["leaf"]
        if depth > 0 and budget > 1:
            kinds += ["sequential", "fan", "split"] if width > 1 else ["sequential", "fan"]
        kind = self.draw(st.sampled_from(kinds))
        if kind == "sequential":
            return self.sequential(width, depth, budget)
        if kind == "fan":
            return self.fan(width, depth, budget)
        if kind == "split":
            return self.split(width, depth, budget)
        return self.leaf(width)

    def sequential(self, width: int, depth: int, budget: int) -> _Block:
        parts = self.draw(st.integers(1, min(3, budget)))
        blocks = []
        for share in _share(budget, parts):
            blocks.append(self.block(width, depth - 1, share))
            width = blocks[-1].out_width
        module = Sequential([b.module for b in blocks])
        return _Block(module, width, f"Sequential[{', '.join(b.description for b in blocks)}]")

    def concat(self, widths: dict[str, int], depth: int, budgets: list[int]) -> _Block:
        blocks = {
            key: self.block(w, depth, b)
            for (key, w), b in zip(widths.items(), budgets, strict=True)
        }
        module = Concat({key: b.module for key, b in blocks.items()})
        out_width = sum(b.out_width for b in blocks.values())
        inner = ", ".join(f"{key}: {b.description}" for key, b in blocks.items())
        return _Block(module, out_width, f"Concat{{{inner}}}")

    def parallel(
        self, width: int, keys: list[str], depth: int, budgets: list[int]
    ) -> tuple[_Block, dict[str, int]]:
        """A Parallel (its output is a dict) and the width of each of its outputs."""
        blocks = {key: self.block(width, depth, b) for key, b in zip(keys, budgets, strict=True)}
        module = Parallel({key: b.module for key, b in blocks.items()})
        inner = ", ".join(f"{key}: {b.description}" for key, b in blocks.items())
        widths = {key: b.out_width for key, b in blocks.items()}
        return _Block(module, sum(widths.values()), f"Parallel{{{inner}}}"), widths

    def fan(self, width: int, depth: int, budget: int) -> _Block:
        """Sequential[Parallel{k: block(width)}, Concat{k: block(out_k)}]."""
        keys = self.keys(budget // 2)
        shares = _share(budget, len(keys))
        parallel, widths = self.parallel(width, keys, depth - 1, [s // 2 for s in shares])
        concat = self.concat(widths, depth - 1, [s - s // 2 for s in shares])
        module = Sequential([parallel.module, concat.module])
        return _Block(
            module,
            concat.out_width,
            f"Sequential[{parallel.description}, {concat.description}]",
        )

    def split(self, width: int, depth: int, budget: int) -> _Block:
        """Sequential[Splitter(k=size), Concat{k: block(size)}]."""
        keys = self.keys(min(width, budget))
        cuts = self.draw(
            st.lists(
                st.integers(1, width - 1),
                min_size=len(keys) - 1,
                max_size=len(keys) - 1,
                unique=True,
            )
        )
        edges = [0, *sorted(cuts), width]
        sizes = {key: edges[i + 1] - edges[i] for i, key in enumerate(keys)}
        splitter = Splitter(**sizes)
        concat = self.concat(sizes, depth - 1, _share(budget, len(keys)))
        module = Sequential([splitter, concat.module])
        shown = ", ".join(f"{key}={size}" for key, size in sizes.items())
        return _Block(
            module, concat.out_width, f"Sequential[Splitter({shown}), {concat.description}]"
        )


@st.composite
def _nestings(
    draw: st.DrawFn, factories: tuple[LeafFactory, ...], max_depth: int, max_leaves: int
) -> Nesting:
    builder = _Builder(draw, factories, nnx.Rngs(draw(st.integers(0, 2**16))))
    forms = ["block", "parallel", "concat"] if max_depth > 0 else ["block"]
    form = draw(st.sampled_from(forms))
    if form == "concat":
        keys = builder.keys(max_leaves)
        widths = {key: draw(st.sampled_from(INPUT_WIDTHS)) for key in keys}
        block = builder.concat(widths, max_depth - 1, _share(max_leaves, len(keys)))
        spec: Any = {key: jax.ShapeDtypeStruct((w,), jnp.float32) for key, w in widths.items()}
        return Nesting(block.module, spec, block.description)
    width = draw(st.sampled_from(INPUT_WIDTHS))
    spec = jax.ShapeDtypeStruct((width,), jnp.float32)
    if form == "parallel":
        keys = builder.keys(max_leaves)
        block, _ = builder.parallel(width, keys, max_depth - 1, _share(max_leaves, len(keys)))
    else:
        block = builder.block(width, max_depth, max_leaves)
    return Nesting(block.module, spec, block.description)


def container_nestings(
    leaf_factories: Sequence[LeafFactory] = LEAF_FACTORIES,
    *,
    max_depth: int = 2,
    max_leaves: int = 6,
) -> st.SearchStrategy[Nesting]:
    """Random nestings of ``Sequential``, ``Parallel``, ``Concat`` and ``Splitter``.

    The root takes either one ``(B, n)`` array or a dict of them (a ``Concat``
    root) and returns an array or, for a ``Parallel`` root, a dict of arrays.
    Inside, every container level is one of: a ``Sequential`` chain; a fan,
    ``Sequential[Parallel{k: ...}, Concat{k: ...}]``; or a split,
    ``Sequential[Splitter(k=size), Concat{k: ...}]``.

    Args:
      leaf_factories: what the leaves are built from, each called as
        ``factory(in_features, rngs)`` and returning a module that maps
        ``(B, in_features)`` to one ``(B, n)`` array. Defaults to one stateless,
        one stateful and one stats-bearing leaf from :mod:`nnx_ppo.testing.modules`.
        Pass your own module's factory to test it inside every container.
      max_depth: how many container levels may nest above a leaf (0: a leaf alone).
      max_leaves: at most this many leaves per nesting (keeps calls fast).

    Returns:
      A strategy of :class:`Nesting`.
    """
    factories = tuple(leaf_factories)
    if not factories or not all(callable(f) for f in factories):
        raise ValueError("container_nestings needs at least one callable leaf factory")
    depth = require_int("container_nestings", "max_depth", max_depth, minimum=0)
    leaves = require_int("container_nestings", "max_leaves", max_leaves)
    return _nestings(factories, depth, leaves)
