"""The module contract: :class:`StatefulModule` and what its calls return.

See the batching contract page of the docs for the axes of each method. In short:
``__call__`` sees ``(B, *feat)`` leaves, ``update_statistics`` sees ``(T, B, *feat)``,
``initialize_state(n)`` returns ``(n, *feat)`` leaves, and all of it is checked
while JAX traces.
"""

import abc
import dataclasses
from typing import Any, TypeAlias

import jax
from flax import nnx
from jaxtyping import Array, Float, PyTree, Shaped

from nnx_ppo.contract import install_checks

__all__ = [
    "CarryOrSlice",
    "ModuleState",
    "PPONetworkOutput",
    "Replaceable",
    "StatefulModule",
    "StatefulModuleOutput",
]

ModuleState: TypeAlias = PyTree[Shaped[Array, "B ..."]]
"""A module's carry state: any pytree of arrays that lead with the batch axis."""

CarryOrSlice: TypeAlias = PyTree[Shaped[Array, "..."]]
"""What ``reset_state`` sees: a batched carry, or (under ``vmap``) one env's slice of it,
without the batch axis. Annotate ``reset_state`` with this, not with :data:`ModuleState`."""


class Replaceable:
    """Gives frozen dataclasses a ``replace(**changes)`` method."""

    def replace(self, **changes: Any) -> Any:
        """Return a copy with the given fields replaced."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class StatefulModuleOutput(Replaceable):
    """What a :class:`StatefulModule` call returns. A frozen pytree dataclass.

    Attributes:
      next_state: the carry for the next step; the same tree, shapes and dtypes as
        the ``state`` the call was given.
      output: the module's output, a pytree of ``(B, *feat)`` arrays.
      regularization_loss: a scalar or ``(B,)``; added to the training loss (an
        action sampler's entropy bonus lives here, as a negative loss).
      metrics: a nested dict of scalars or ``(B, ...)`` arrays, for logging.
      rollout_extras: what the module needs back in loss replay or in
        ``update_statistics``; ``(B, *feat)`` leaves, or ``None``.
    """

    next_state: ModuleState
    output: Any
    regularization_loss: Float[Array, ""] | Float[Array, " B"]
    metrics: dict[Any, Any]
    rollout_extras: Any = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PPONetworkOutput(Replaceable):
    """What a PPO network's ``output`` is: built by ``PPOAdapter``.

    Attributes:
      actions: a pytree of actions, leaves ``(B, *action)`` (``(T, B, ...)`` once stacked).
      loglikelihoods: a pytree like ``actions``, leaves ``(B,)``.
      value_estimates: a pytree like the reward tree, leaves ``(B,)``.
    """

    actions: Any
    loglikelihoods: Any
    value_estimates: Any


class StatefulModule(nnx.Module, abc.ABC):
    """The base of every network module: an ``nnx.Module`` with an explicit carry.

    A module has two kinds of state. Its NNX variables (parameters, running
    statistics) persist across episodes; ``__call__`` must not write any that
    change what a forward pass returns, and running statistics change only in
    :meth:`update_statistics`. Its *carry* (the hidden state of a recurrent cell,
    a delay line, per-env random keys) is passed in and returned explicitly, and
    is reset with :meth:`reset_state` when an environment resets.

    Every subclass is checked automatically: ``__call__``, ``initialize_state``,
    ``reset_state`` and ``update_statistics`` are wrapped at class creation with
    the contract's checks, and any jaxtyping annotation written on their
    signatures is checked too. Violations raise :class:`nnx_ppo.ContractError`
    while JAX traces. ``nnx_ppo.checks(False)`` or ``NNX_PPO_CHECKS=0`` turns
    the checks off.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        install_checks(cls, StatefulModuleOutput)

    @abc.abstractmethod
    def __call__(
        self, state: ModuleState, x: Any, rollout_extras: Any = None
    ) -> StatefulModuleOutput:
        """Run one step on a flat batch.

        Args:
          state: the carry, leaves ``(B, *feat)``.
          x: the input, a pytree of ``(B, *feat)`` arrays (never a time axis).
          rollout_extras: ``None`` in rollout and inference; in loss replay, the
            slice of the extras this module emitted at this step, ``(B, *feat)``.

        Returns:
          A :class:`StatefulModuleOutput`.
        """

    def initialize_state(self, batch_size: int) -> ModuleState:
        """A fresh carry for ``batch_size`` environments. Stateless modules return ``()``."""
        del batch_size
        return ()

    def reset_state(self, prev_state: CarryOrSlice) -> CarryOrSlice:
        """The carry after an episode reset, same tree, shapes and dtypes as ``prev_state``.

        Called on a batched carry and, under ``vmap``, on one env's unbatched slice,
        so it must not assume a leading axis. The default keeps the carry.
        """
        return prev_state

    def update_statistics(self, rollout_extras: Any) -> None:
        """Fold a rollout's emissions, leaves ``(T, B, *feat)``, into running statistics.

        Called once per training step, after the gradient phase. Containers route
        each child its slice, as in ``__call__``. The default does nothing.
        """
        del rollout_extras


install_checks(StatefulModule, StatefulModuleOutput, defaults=True)
