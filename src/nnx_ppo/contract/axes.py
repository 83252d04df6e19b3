"""The contract's vocabulary: one jaxtyping alias per idea, used on every public signature.

``B`` is the flat batch axis of a module call (one row per environment), ``T`` the
time axis of a rollout. Every array-facing signature in the package is written with
these aliases, and where an annotation is written it is checked (with beartype,
dimension names bound across the call): on the contract methods of every
:class:`~nnx_ppo.networks.types.StatefulModule` by the installed checks, and on the
engine's public functions by :func:`nnx_ppo.contract.checking.typechecked`.

Leaves are ``Shaped`` (any dtype) where a pytree may hold integer or boolean
observations, and ``Float`` where the value is one float array. NumPy arrays are
accepted wherever JAX arrays are, as JAX accepts them. :func:`align_leading` lines
a per-env (or per-step-and-env) array up with a leaf that has those axes first.

Example::

    from nnx_ppo.contract.axes import BatchedTree, Carry, Extras

    class MyCell(StatefulModule):
        def __call__(self, state: Carry, x: BatchedTree, rollout_extras: Extras = None):
            ...
"""

from __future__ import annotations

from typing import TypeAlias

import numpy as np
from jaxtyping import Array, Bool, Float, Key, PyTree, Shaped

__all__ = [
    "AnyArray",
    "Batched",
    "BatchedTree",
    "BoolHistory",
    "Carry",
    "CarrySlice",
    "Extras",
    "FloatBatch",
    "FloatHistory",
    "History",
    "HistoryTree",
    "Mask",
    "PerEnvKeys",
    "RegularizationLoss",
    "Scalar",
    "Unbatched",
    "align_leading",
]

AnyArray: TypeAlias = Array | np.ndarray
"""A JAX or a NumPy array, the leaf of every alias here; for a layer's own annotation of
an input, as in ``Float[AnyArray, "B {self.in_features}"]``."""

Batched: TypeAlias = Shaped[AnyArray, "B ..."]
"""One array of a module call, the batch axis then features (each argument its own)."""

BatchedTree: TypeAlias = PyTree[Shaped[AnyArray, "B ..."]]
"""A module's input or output: a pytree whose every leaf leads with ``B``."""

Carry: TypeAlias = PyTree[Shaped[AnyArray, "B ..."]]
"""A module's carry (its scan state): every leaf leads with ``B``."""

CarrySlice: TypeAlias = PyTree[Shaped[AnyArray, "..."]]
"""What ``reset_state`` sees: a batched carry, or under ``vmap`` one env's slice of it."""

Extras: TypeAlias = PyTree[Shaped[AnyArray, "B ..."]] | None
"""The ``rollout_extras`` of one call, ``(B, *feat)`` leaves or ``None``."""

History: TypeAlias = Shaped[AnyArray, "T B ..."]
"""One leaf of a rollout history, time then batch then features (each leaf its own)."""

HistoryTree: TypeAlias = PyTree[Shaped[AnyArray, "T B ..."]]
"""What ``update_statistics`` receives: the stacked emissions, leaves ``(T, B, *feat)``."""

FloatBatch: TypeAlias = Float[AnyArray, " B"]
"""One float per sample, such as a log-likelihood or a value estimate."""

FloatHistory: TypeAlias = Float[AnyArray, "T B"]
"""One float per step and env, such as the rewards, values or advantages of a rollout."""

BoolHistory: TypeAlias = Bool[AnyArray, "T B"]
"""One flag per step and env, such as where episodes ended and which were truncated."""

RegularizationLoss: TypeAlias = Float[AnyArray, ""] | Float[AnyArray, " B"]
"""A module's regularization, a scalar or one value per sample."""

PerEnvKeys: TypeAlias = Key[Array, " B"]
"""One typed PRNG key per environment, carried in state."""

Mask: TypeAlias = Bool[AnyArray, " B"]
"""One boolean per environment (e.g. which envs reset)."""

Scalar: TypeAlias = Shaped[AnyArray, ""]
"""A zero-dimensional array."""

Unbatched: TypeAlias = PyTree[Shaped[AnyArray, "..."]]
"""One environment's observation, action or state: no batch axis."""


def align_leading(
    values: Shaped[AnyArray, "*lead"], leaf: Shaped[AnyArray, "..."]
) -> Shaped[AnyArray, "..."]:
    """``values`` with size-1 axes appended up to ``leaf``'s rank.

    ``values`` covers ``leaf``'s leading axes (a ``(B,)`` mask for a ``(B, ...)`` leaf,
    a ``(T, B)`` one for a ``(T, B, ...)`` leaf), so the result broadcasts against
    ``leaf`` along them: ``where(align_leading(mask, leaf), leaf, 0)``.
    """
    return values.reshape(values.shape + (1,) * (np.ndim(leaf) - values.ndim))
