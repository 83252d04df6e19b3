"""Small example leaf modules, one of each kind a container must route correctly.

* :class:`Linear`: stateless; carries nothing and emits nothing.
* :class:`RunningSum`: stateful; its carry is a per-env running sum and step count.
* :class:`StatsRecorder`: stats-bearing; emits its input as ``rollout_extras`` and
  records, in NNX variables, every history ``update_statistics`` hands it.

They are deliberately tiny and per-sample pure, so property tests built from them
(see :mod:`nnx_ppo.testing.strategies`) run fast and can compare rows exactly.
Each has a :data:`LeafFactory` (``make_linear``, ``make_running_sum``,
``make_stats_recorder``) for :func:`~nnx_ppo.testing.strategies.container_nestings`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeAlias

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float

from nnx_ppo.contract.arguments import require_int
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput

__all__ = [
    "LEAF_FACTORIES",
    "LeafFactory",
    "Linear",
    "RunningSum",
    "StatsRecorder",
    "make_linear",
    "make_running_sum",
    "make_stats_recorder",
]

LeafFactory: TypeAlias = Callable[[int, nnx.Rngs], StatefulModule]
"""Builds a leaf that maps ``(B, in_features)`` to one ``(B, n)`` array, given
``in_features`` and an ``nnx.Rngs`` for its parameters."""


def _check_width(owner: str, features: int, x: Array) -> None:
    # A width mismatch would otherwise surface as a broadcasting error deep in XLA.
    width = math.prod(x.shape[1:])
    if width != features:
        raise ValueError(
            f"{owner} was built for {features} input features but got {width} "
            f"(input shape {tuple(x.shape)})"
        )


class Linear(StatefulModule):
    """A stateless affine map of the flattened features: ``(B, *feat) -> (B, out_features)``.

    ``prod(feat)`` must equal ``in_features``, so any trailing shape works.
    Carry: ``()``. Emits no ``rollout_extras``; regularization is a scalar zero.
    """

    def __init__(self, in_features: int, out_features: int, *, rngs: nnx.Rngs) -> None:
        require_int("Linear", "in_features", in_features)
        require_int("Linear", "out_features", out_features)
        self.in_features = in_features
        self.out_features = out_features
        scale = 1.0 / math.sqrt(in_features)
        self.kernel = nnx.Param(
            jax.random.normal(rngs.params(), (in_features, out_features)) * scale
        )
        self.bias = nnx.Param(0.1 * jax.random.normal(rngs.params(), (out_features,)))

    def __call__(
        self, state: tuple[()], x: Float[Array, "B *feat"], rollout_extras: None = None
    ) -> StatefulModuleOutput:
        _check_width("Linear", self.in_features, x)
        flat = x.reshape(x.shape[0], self.in_features)
        y = flat @ self.kernel[...] + self.bias[...]
        return StatefulModuleOutput((), y, jnp.zeros(()), {}, None)


class RunningSum(StatefulModule):
    """Adds its input to a per-env running sum and outputs the new sum.

    Carry: ``{"total": (B, features) float32, "steps": (B,) int32}``; ``reset_state``
    zeroes both, on a batched carry or on one env's slice. Output: the new total,
    ``(B, features)``. Metrics: ``{"steps": (B,)}``. Regularization: ``(B,)``, a small
    penalty on the squared total. Emits no ``rollout_extras``.
    """

    def __init__(self, features: int) -> None:
        require_int("RunningSum", "features", features)
        self.features = features

    def initialize_state(self, batch_size: int) -> dict[str, Array]:
        return {
            "total": jnp.zeros((batch_size, self.features), jnp.float32),
            "steps": jnp.zeros((batch_size,), jnp.int32),
        }

    def reset_state(self, prev_state: dict[str, Array]) -> dict[str, Array]:
        return jax.tree.map(jnp.zeros_like, prev_state)

    def __call__(
        self,
        state: dict[str, Array],
        x: Float[Array, "B features"],
        rollout_extras: None = None,
    ) -> StatefulModuleOutput:
        _check_width("RunningSum", self.features, x)
        total = state["total"] + x
        steps = state["steps"] + 1
        penalty = 1e-3 * jnp.sum(total**2, axis=-1)
        return StatefulModuleOutput(
            {"total": total, "steps": steps}, total, penalty, {"steps": steps}, None
        )


class StatsRecorder(StatefulModule):
    """Centres its input by a running mean, emits the input, and records histories.

    Output: ``x - mean``, ``(B, features)``, where ``mean = total / max(samples, 1)``.
    Carry: ``()``. Emits its input ``x`` as ``rollout_extras`` (also in replay), so
    ``update_statistics`` receives it stacked as ``(T, B, features)``.

    Every history it receives is folded into ``nnx.BatchStat`` variables, so a test
    can check exactly what reached it:

    * ``updates``: how many times ``update_statistics`` was called;
    * ``samples``: the sum of their ``T * B``;
    * ``total``: ``(features,)``, the sum of every sample's features.
    """

    def __init__(self, features: int) -> None:
        require_int("StatsRecorder", "features", features)
        self.features = features
        self.updates = nnx.BatchStat(jnp.zeros((), jnp.int32))
        self.samples = nnx.BatchStat(jnp.zeros((), jnp.int32))
        self.total = nnx.BatchStat(jnp.zeros((features,), jnp.float32))

    def __call__(
        self,
        state: tuple[()],
        x: Float[Array, "B features"],
        rollout_extras: Float[Array, "B features"] | None = None,
    ) -> StatefulModuleOutput:
        _check_width("StatsRecorder", self.features, x)
        mean = self.total[...] / jnp.maximum(self.samples[...], 1)
        return StatefulModuleOutput((), x - mean, jnp.zeros(()), {}, x)

    def update_statistics(self, rollout_extras: Float[Array, "T B features"]) -> None:
        self.updates[...] = self.updates[...] + 1
        self.samples[...] = self.samples[...] + rollout_extras.shape[0] * rollout_extras.shape[1]
        self.total[...] = self.total[...] + jnp.sum(rollout_extras, axis=(0, 1))


def make_linear(in_features: int, rngs: nnx.Rngs) -> Linear:
    """A :class:`Linear` leaf with 3 outputs (a fixed width keeps shapes few)."""
    return Linear(in_features, 3, rngs=rngs)


def make_running_sum(in_features: int, rngs: nnx.Rngs) -> RunningSum:
    """A :class:`RunningSum` leaf over ``in_features``; it needs no randomness."""
    del rngs
    return RunningSum(in_features)


def make_stats_recorder(in_features: int, rngs: nnx.Rngs) -> StatsRecorder:
    """A :class:`StatsRecorder` leaf over ``in_features``; it needs no randomness."""
    del rngs
    return StatsRecorder(in_features)


LEAF_FACTORIES: tuple[LeafFactory, ...] = (make_linear, make_running_sum, make_stats_recorder)
"""One factory of each kind, stateless, stateful and stats-bearing."""
