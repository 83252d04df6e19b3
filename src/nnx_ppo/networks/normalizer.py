"""Observation standardisation with running statistics.

:class:`Normalizer` keeps a running mean and variance per feature. The forward
pass only reads them; they change only in ``update_statistics``, which folds in
the ``(T, B, *feat)`` history of the inputs the module emitted during rollout.
"""

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Shaped

from nnx_ppo._numerics import corrected_mean
from nnx_ppo.contract.arguments import require_number
from nnx_ppo.contract.axes import BatchedTree, Extras, HistoryTree
from nnx_ppo.contract.checking import format_shape
from nnx_ppo.contract.env_checks import is_size, size_shape
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput

__all__ = ["Normalizer", "NormalizerStatistics", "canonical_tree", "check_feature_shapes"]

# 0.3.0 divided by this before any statistics existed, keeping a freshly built
# network's inputs small; kept so that ported scripts start out identically.
_SCALE_BEFORE_DATA = 10.0


class NormalizerStatistics(nnx.Variable):
    """Running statistics of a :class:`Normalizer`: not a ``Param``, so never trained."""


def canonical_tree(tree: Any) -> Any:
    """``tree`` with every ``Mapping`` (``OrderedDict``, ``FrozenDict``, ...) made a ``dict``.

    JAX treats ``dict`` and other mapping types as different tree nodes; making
    both the declared and the received trees plain dicts lets them line up.
    """
    if isinstance(tree, Mapping):
        return {key: canonical_tree(value) for key, value in tree.items()}
    if isinstance(tree, list | tuple) and not hasattr(tree, "_fields"):
        return type(tree)(canonical_tree(value) for value in tree)
    return tree


def check_feature_shapes(
    where: str, argument: str, declared: Any, received: Any, leading_axes: tuple[str, ...]
) -> None:
    """Raise ``ValueError`` unless ``received`` is ``declared`` with leading axes added.

    Args:
      where: the module and method, for the message (e.g. ``"Normalizer.__call__"``).
      argument: the argument's name, for the message.
      declared: a canonical tree of arrays with the per-sample feature shapes.
      received: a canonical tree whose leaves should be ``(*leading, *feat)``.
      leading_axes: the names of the leading axes, e.g. ``("B",)`` or ``("T", "B")``.
    """
    n_leading = len(leading_axes)
    declared_def = jax.tree_util.tree_structure(declared)
    received_def = jax.tree_util.tree_structure(received)
    if declared_def != received_def:
        raise ValueError(
            f"{where}: {argument} has tree structure {received_def}, but the module was "
            f"built for {declared_def}"
        )
    flat_declared = jax.tree_util.tree_leaves(declared)
    flat_received, _ = jax.tree_util.tree_flatten_with_path(received)
    for feature, (path, leaf) in zip(flat_declared, flat_received, strict=True):
        shape = tuple(getattr(leaf, "shape", ()))
        if len(shape) < n_leading or shape[n_leading:] != tuple(feature.shape):
            expected = format_shape((*leading_axes, *feature.shape))
            raise ValueError(
                f"{where}: {argument}{jax.tree_util.keystr(path)} has shape {shape}, expected "
                f"{expected} as declared at construction"
            )


def _zeros_like_spec(spec: Any) -> Array:
    """float32 zeros for one declared leaf: an int, a shape tuple, or an example array."""
    if is_size(spec):
        shape = size_shape(spec)
    elif hasattr(spec, "shape"):
        shape = tuple(spec.shape)
    else:
        raise TypeError(
            f"Normalizer: a declared leaf must be an int, a shape tuple or an example array, "
            f"got {type(spec).__name__} {spec!r}"
        )
    if any(d < 0 for d in shape):
        raise ValueError(f"Normalizer: shape {shape} has a negative dimension")
    return jnp.zeros(shape, jnp.float32)


class Normalizer(StatefulModule):
    """Standardises its input with running statistics: ``(x - mean) / std``.

    The input is an array ``(B, *shape)`` or a pytree of them; every leaf is
    normalised per feature and returned as float32, optionally clipped to
    ``[-clip, clip]``. The standard deviation is ``sqrt(max(var, epsilon))``, where
    ``var`` is the population variance of all samples seen; before any sample
    has been seen the mean is zero and the scale is 10.

    Stateless carry ``()``. Emits its raw input as ``rollout_extras``, in rollout
    and in replay alike: ``update_statistics`` receives those emissions stacked
    to ``(T, B, *shape)`` and folds all ``T * B`` samples in with one batched
    Chan/Welford merge. The statistics (``mean``, ``M2``, ``counter``) are
    :class:`NormalizerStatistics` variables, never written by ``__call__``.

    Args:
      shape: the per-sample feature shape: an int, a shape (a tuple or list of
        ints; NumPy integers count), or a pytree (dicts and other mappings, lists,
        tuples) whose leaves are ints, shapes or example arrays (unbatched).
      clip: if given, the normalised value is clipped to ``[-clip, clip]`` (``math.inf``
        clips nothing, as ``None``).
      epsilon: the floor of the variance, so constant features do not divide by zero.

    Example::

        Normalizer({"joints": 12, "camera": (8, 8)}, clip=5.0)
    """

    def __init__(self, shape: Any, *, clip: float | None = None, epsilon: float = 1e-6) -> None:
        if clip is not None and not (isinstance(clip, float) and clip == math.inf):
            clip = require_number("Normalizer", "clip", clip, minimum=0.0, strict=True)
        epsilon = require_number("Normalizer", "epsilon", epsilon, minimum=0.0, strict=True)
        if is_size(shape):
            zeros = _zeros_like_spec(shape)
        else:
            zeros = jax.tree.map(
                _zeros_like_spec,
                canonical_tree(shape),
                is_leaf=lambda s: is_size(s) or hasattr(s, "shape"),
            )
            if not jax.tree.leaves(zeros):
                raise ValueError(f"Normalizer: the declared tree {shape!r} has no leaves")
        self.clip = clip
        self.epsilon = epsilon
        self.mean = NormalizerStatistics(zeros)
        self.M2 = NormalizerStatistics(jax.tree.map(jnp.zeros_like, zeros))
        self.counter = NormalizerStatistics(jnp.zeros((), jnp.float32))

    def __call__(
        self,
        state: tuple[()],
        x: BatchedTree,
        rollout_extras: Extras = None,
    ) -> StatefulModuleOutput:
        x = canonical_tree(x)
        check_feature_shapes("Normalizer.__call__", "x", self.mean.get_value(), x, ("B",))
        count = self.counter.get_value()

        def standardise(
            value: Shaped[Array, "B *feat"], mean: Float[Array, "*feat"], m2: Float[Array, "*feat"]
        ) -> Float[Array, "B *feat"]:
            variance = jnp.maximum(m2 / jnp.maximum(count, 1.0), self.epsilon)
            std = jnp.where(count > 0, jnp.sqrt(variance), _SCALE_BEFORE_DATA)
            normalised = (value.astype(jnp.float32) - mean) / std
            if self.clip is not None:
                normalised = jnp.clip(normalised, -self.clip, self.clip)
            return normalised

        output = jax.tree.map(standardise, x, self.mean.get_value(), self.M2.get_value())
        return StatefulModuleOutput((), output, jnp.zeros(()), {}, x)

    def update_statistics(self, rollout_extras: HistoryTree) -> None:
        """Fold the ``(T, B, *shape)`` history of inputs into the running statistics."""
        history = canonical_tree(rollout_extras)
        check_feature_shapes(
            "Normalizer.update_statistics",
            "rollout_extras",
            self.mean.get_value(),
            history,
            ("T", "B"),
        )
        first = jax.tree.leaves(history)[0]
        n_new = float(first.shape[0] * first.shape[1])
        n_old = self.counter.get_value()
        n_total = n_old + n_new
        # Chan et al.'s pairwise merge: the new samples' own mean and M2 are taken
        # about their own mean (two passes, the mean corrected once), which keeps
        # float32 accurate: a constant feature gets M2 0, not its mean's rounding.
        # Reduced over (T, B) in place, not flattened first: a B split over devices
        # then stays split, each device summing its own envs.
        samples = jax.tree.map(lambda v: v.astype(jnp.float32), history)
        new_mean = jax.tree.map(lambda v: corrected_mean(v, axis=(0, 1)), samples)
        new_m2 = jax.tree.map(
            lambda v, m: jnp.sum(jnp.square(v - m), axis=(0, 1)), samples, new_mean
        )
        delta = jax.tree.map(jnp.subtract, new_mean, self.mean.get_value())
        self.mean.set_value(
            jax.tree.map(lambda m, d: m + d * (n_new / n_total), self.mean.get_value(), delta)
        )
        self.M2.set_value(
            jax.tree.map(
                lambda m2, b, d: m2 + b + jnp.square(d) * (n_old * (n_new / n_total)),
                self.M2.get_value(),
                new_m2,
                delta,
            )
        )
        self.counter.set_value(n_total)
