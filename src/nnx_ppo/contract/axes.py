"""jaxtyping aliases for the axes of the contract, in one place.

``B`` is the flat batch axis of a module call, ``T`` the time axis of a rollout
history. Every array-facing signature of the package is written with these.
"""

from __future__ import annotations

from typing import Any, TypeAlias

from jaxtyping import Array, Bool, Float, Key, PyTree, Shaped

__all__ = [
    "Batched",
    "BatchedTree",
    "Carry",
    "FloatBatch",
    "History",
    "HistoryTree",
    "PerEnvKeys",
    "RegularizationLoss",
    "Scalar",
]

Batched: TypeAlias = Shaped[Array, "B *feat"]
"""One array leaf of a module call: a flat batch axis, then features."""

BatchedTree: TypeAlias = PyTree[Shaped[Array, "B ..."]]
"""A pytree whose every leaf leads with the batch axis ``B``."""

Carry: TypeAlias = PyTree[Shaped[Array, "B ..."]]
"""A module's carry state: every leaf leads with ``B`` (the scan carry)."""

History: TypeAlias = Shaped[Array, "T B *feat"]
"""One leaf of a rollout history: time, then batch, then features."""

HistoryTree: TypeAlias = PyTree[Shaped[Array, "T B ..."]]
"""A pytree whose every leaf leads with ``(T, B)``."""

FloatBatch: TypeAlias = Float[Array, " B"]
"""One float per sample."""

Scalar: TypeAlias = Shaped[Array, ""]
"""A zero-dimensional array."""

RegularizationLoss: TypeAlias = Float[Array, ""] | Float[Array, " B"]
"""A module's regularization: a scalar, or one value per sample."""

PerEnvKeys: TypeAlias = Key[Array, " B"]
"""One typed PRNG key per environment, carried in state."""

Extras: TypeAlias = Any
"""The ``rollout_extras`` channel: a pytree shaped like the state tree, or None."""

Mask: TypeAlias = Bool[Array, " B"]
"""One boolean per environment (e.g. which envs reset)."""
