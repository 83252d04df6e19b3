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
import jax.numpy as jnp
from flax import nnx
from jaxtyping import PyTree

from nnx_ppo.contract import ContractError, checks_enabled, install_checks
from nnx_ppo.contract.axes import (
    BatchedTree,
    Carry,
    CarrySlice,
    Extras,
    FloatBatch,
    HistoryTree,
    RegularizationLoss,
)
from nnx_ppo.contract.checking import (
    CONTRACT_METHODS,
    describe_leaf,
    named_leaves,
    structure_difference,
)
from nnx_ppo.contract.errors import rule_text
from nnx_ppo.jax_dataclass import Replaceable

__all__ = [
    "ACTIVATION_KEY",
    "EntryTypeError",
    "MissingEntryError",
    "ModuleState",
    "PPONetworkOutput",
    "StatefulModule",
    "StatefulModuleOutput",
    "checked_ppo_output",
    "require_stateful_module",
    "stateless_hint",
]


ACTIVATION_KEY = "__activation__"
"""The ``metrics`` key under which a ``Recorder`` returns the activations it recorded.

Defined here, where 0.3.0 had it, and re-exported by :mod:`nnx_ppo.networks.recording`.
"""


class MissingEntryError(KeyError, IndexError, ValueError):
    """A module's input lacks an entry the module reads by key or index.

    Raised by ``Filter``, ``Map`` and ``Concat``. It is a :class:`KeyError` and an
    :class:`IndexError`, the types nnx-ppo 0.3.0 let escape from the failed lookup,
    and a :class:`ValueError`, the type of this version's other bad-input errors,
    so ``except`` clauses written for either version catch it.
    """

    def __str__(self) -> str:
        # KeyError's str() quotes its argument as if it were a bare key; ours is a sentence.
        return str(self.args[0]) if self.args else ""


class EntryTypeError(TypeError, ValueError):
    """A module indexes its input by key, but the input (or a part of it) cannot be indexed so.

    Raised by ``Filter`` and ``Concat``. A :class:`TypeError`, as 0.3.0's failed
    lookup was, and a :class:`ValueError`, as this version's other bad-input errors.
    """


ModuleState: TypeAlias = Carry
"""A module's carry, leaves ``(B, ...)``: :data:`nnx_ppo.contract.axes.Carry` by its 0.3.0 name."""


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

    next_state: Carry
    output: BatchedTree
    regularization_loss: RegularizationLoss
    metrics: dict[Any, Any]
    rollout_extras: Extras = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PPONetworkOutput(Replaceable):
    """What a PPO network's ``output`` is: built by ``PPOAdapter``.

    Attributes:
      actions: a pytree of actions, leaves ``(B, *action)`` (``(T, B, ...)`` once stacked).
      loglikelihoods: a pytree like ``actions``, leaves ``(B,)``; or, for a tree of
        actions, one ``(B,)`` array, their joint log-likelihood (one PPO ratio for all).
      value_estimates: a pytree like the reward tree, leaves ``(B,)``.
    """

    actions: BatchedTree
    loglikelihoods: PyTree[FloatBatch]
    value_estimates: PyTree[FloatBatch]


_RULE_PPO_OUTPUT = rule_text(
    "a PPO network's output is PPONetworkOutput: actions a tree of (B, *action) leaves, "
    "loglikelihoods the same tree with (B,) leaves (summed over each action's "
    "dimensions) or one joint (B,) array, value_estimates one (B,) leaf per reward leaf",
    "the-ppo-network-output",
)


def checked_ppo_output(
    output: Any, where: str, rewards: PyTree[FloatBatch] | None = None
) -> PPONetworkOutput:
    """``output`` after checking it is a PPO network's output; wherever the library uses one.

    Args:
      output: a network's ``StatefulModuleOutput.output``.
      where: who consumes it (e.g. ``"unroll_env"``), named in an error.
      rewards: the reward tree the values estimate, leaves ``(B,)``, when known.

    Raises:
      ContractError: ``output`` is not a ``PPONetworkOutput``, or one of its leaves
        is misshaped; the message names the leaf, what was expected and found.
    """
    if not isinstance(output, PPONetworkOutput):
        raise ContractError.violation(
            where,
            "the network's output is not a PPONetworkOutput.",
            expected="output=PPONetworkOutput(actions, loglikelihoods, value_estimates)",
            found=describe_leaf(output),
            rule=_RULE_PPO_OUTPUT,
        )
    if not checks_enabled():
        return output
    actions = named_leaves("actions", output.actions)
    if not actions:
        _ppo_output_violation(where, "actions", "a tree of (B, *action) arrays", "no leaves")
    batch = _leading_size(actions[0][1])
    for name, leaf in actions:
        if _leading_size(leaf) != batch:
            _ppo_output_violation(where, name, f"(B, *action) with B={batch}", leaf)
    action_tree = jax.tree.structure(output.actions)
    likelihood_tree = jax.tree.structure(output.loglikelihoods)
    joint = jax.tree_util.treedef_is_leaf(likelihood_tree) and likelihood_tree.num_leaves == 1
    if likelihood_tree != action_tree and not joint:
        _ppo_output_violation(
            where,
            "loglikelihoods",
            f"the tree of actions: {action_tree}, or one joint (B,) array",
            f"tree {likelihood_tree}",
        )
    for name, leaf in named_leaves("loglikelihoods", output.loglikelihoods):
        if getattr(leaf, "shape", None) != (batch,) or not _is_float(leaf):
            _ppo_output_violation(where, name, f"(B,) floats with B={batch}", leaf)
    if rewards is not None and jax.tree.structure(output.value_estimates) != jax.tree.structure(
        rewards
    ):
        _ppo_output_violation(
            where,
            "value_estimates",
            f"one value per reward leaf: the tree {jax.tree.structure(rewards)}",
            structure_difference(
                "value_estimates", rewards, "value_estimates", output.value_estimates
            ),
        )
    for name, leaf in named_leaves("value_estimates", output.value_estimates):
        if getattr(leaf, "shape", None) != (batch,) or not _is_float(leaf):
            _ppo_output_violation(where, name, f"(B,) floats with B={batch}", leaf)
    return output


def _is_float(leaf: Any) -> bool:
    """Whether ``leaf`` holds floats: an integer value or log-likelihood would round the
    loss's ratios and targets."""
    return jnp.issubdtype(getattr(leaf, "dtype", jnp.int32), jnp.floating)


def _leading_size(leaf: Any) -> int | None:
    shape = getattr(leaf, "shape", None)
    return int(shape[0]) if shape else None


def _ppo_output_violation(where: str, leaf: str, expected: str, found: Any) -> None:
    raise ContractError.violation(
        where,
        f"the network's PPONetworkOutput has a misshaped {leaf}.",
        leaf=f"network_output.{leaf}",
        expected=expected,
        found=found if isinstance(found, str) else describe_leaf(found),
        rule=_RULE_PPO_OUTPUT,
    )


class _ContractMeta(type(nnx.Module)):
    """Checks a contract method assigned to a class after its creation, too."""

    def __setattr__(cls, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name in CONTRACT_METHODS:
            install_checks(cls, StatefulModuleOutput)


class StatefulModule(nnx.Module, abc.ABC, metaclass=_ContractMeta):
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
        self, state: Carry, x: BatchedTree, rollout_extras: Extras = None
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

    def initialize_state(self, batch_size: int) -> Carry:
        """A fresh carry for ``batch_size`` environments. Stateless modules return ``()``."""
        del batch_size
        return ()

    def reset_state(self, prev_state: CarrySlice) -> CarrySlice:
        """The carry after an episode reset, same tree, shapes and dtypes as ``prev_state``.

        Called on a batched carry and, under ``vmap``, on one env's unbatched slice,
        so it must not assume a leading axis. The default keeps the carry.
        """
        return prev_state

    def update_statistics(self, rollout_extras: HistoryTree) -> None:
        """Fold a rollout's emissions, leaves ``(T, B, *feat)``, into running statistics.

        Called once per training step, after the gradient phase. Containers route
        each child its slice, as in ``__call__``. The default does nothing.
        """
        del rollout_extras


install_checks(StatefulModule, StatefulModuleOutput, defaults=True)


def require_stateful_module(what: str, value: object) -> None:
    """Raise ``TypeError`` unless ``value`` is a :class:`StatefulModule`; ``what`` names
    it (``"Sequential layer 0"``). A plain NNX module or function is pointed to
    :class:`~nnx_ppo.networks.feedforward.Stateless`."""
    if isinstance(value, StatefulModule):
        return
    if isinstance(value, type):  # Flattener for Flattener(): its metaclass said nothing
        if issubclass(value, StatefulModule):
            raise TypeError(
                f"{what} is the class {value.__name__}, not a module: did you mean "
                f"{value.__name__}(...)?"
            )
        raise TypeError(f"{what} is the class {value.__name__}, not a StatefulModule instance")
    hint = stateless_hint(value)
    raise TypeError(f"{what} is a {type(value).__name__}, not a StatefulModule{hint}")


def stateless_hint(value: object) -> str:
    """What to do with ``value``, a callable that is no ``StatefulModule`` (an
    ``nnx.Linear``, ``jnp.tanh``): a sentence to append to a message; ``""`` for others."""
    if isinstance(value, nnx.Module):
        return (
            "; subclass nnx_ppo.networks.StatefulModule to write the contract's methods, or "
            "wrap a stateless NNX module in nnx_ppo.networks.Stateless"
        )
    if callable(value) and not isinstance(value, type):
        return "; wrap a stateless NNX module or function in nnx_ppo.networks.Stateless"
    return ""
