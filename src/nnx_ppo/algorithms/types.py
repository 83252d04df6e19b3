"""The data the PPO engine passes around: environments, transitions, training state.

Axes follow the contract (the docs' batching contract page): ``B`` is the environment axis
(``n_envs``), ``T`` the time axis of a rollout. A :class:`Transition` holds one
step, leaves ``(B, ...)``, or a whole rollout stacked by the scan, leaves
``(T, B, ...)``.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import jax
from flax import nnx
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray, PyTree, Shaped

from nnx_ppo.algorithms._removed import missing_attribute
from nnx_ppo.contract.axes import Carry, FloatBatch
from nnx_ppo.envs.state import EnvState, RLEnv, Shared
from nnx_ppo.jax_dataclass import Replaceable
from nnx_ppo.networks.types import PPONetworkOutput, StatefulModule

__all__ = [
    "EnvState",
    "LoggingLevel",
    "RLEnv",
    "RunningEpisodes",
    "Shared",
    "TrainingState",
    "Transition",
]


def __getattr__(name: str) -> Any:
    """``DistillationState`` at 0.3.0's path: defined in ``algorithms.distillation``.

    That module imports this one, so it is fetched on first use (PEP 562); it is not
    in ``__all__``, whose names are this module's own.
    """
    if name == "DistillationState":
        from nnx_ppo.algorithms import distillation

        return distillation.DistillationState
    raise missing_attribute(__name__, name)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Transition(Replaceable):
    """One step of experience for every env, or a rollout of them stacked over time.

    Per step every array leaf is ``(B, ...)``; :func:`~nnx_ppo.algorithms.rollout.unroll_env`
    stacks ``T`` steps into ``(T, B, ...)``. ``*T`` below is that optional axis.

    Attributes:
      obs: what the network saw before acting.
      network_output: what it returned (actions, their log-likelihoods, values).
      rewards: the reward of the step, a pytree of ``(*T, B)`` leaves.
      done: the episode ended at this step (terminated or truncated).
      truncated: the episode was cut short by a time limit at this step; implies
        ``done``. Read from ``info["truncated"]`` or ``info["truncation"]``.
      next_obs: the observation the step produced, **before** any reset: the true
        final observation of an episode that ended here.
      metrics: ``{"env": env metrics, "net": network metrics}``.
      rollout_extras: what the network's modules emitted for replay and statistics.
      next_value_estimates: the value of ``next_obs`` under the pre-reset carry,
        leaves like ``network_output.value_estimates``; GAE bootstraps truncated
        episodes from it.
      carries: the carry each step was taken with, leaves ``(*T, B, ...)``; kept
        only for a carry without floating-point leaves (per-env keys, counters),
        so that the loss can replay every step in one flat batch. ``None`` otherwise.
    """

    obs: PyTree[Shaped[Array, "..."]]  # (*T, B, *feat): jaxtyping allows one variadic axis
    network_output: PPONetworkOutput
    rewards: PyTree[Float[Array, "*T B"]]
    done: Bool[Array, "*T B"] | PyTree[Bool[Array, "*T B"]]
    truncated: Bool[Array, "*T B"] | PyTree[Bool[Array, "*T B"]]
    next_obs: PyTree[Shaped[Array, "..."]]  # (*T, B, *feat), like obs
    metrics: dict[str, Any]
    rollout_extras: PyTree[Shaped[Array, "..."]] | None = None  # (*T, B, *feat) or None
    next_value_estimates: PyTree[Float[Array, "*T B"]] = None
    carries: PyTree[Shaped[Array, "..."]] | None = None  # (*T, B, *feat) or None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RunningEpisodes(Replaceable):
    """The episodes in progress in the training envs, carried across training steps.

    Attributes:
      returns: the undiscounted return so far, a pytree like the reward, ``(B,)`` leaves.
      lengths: the steps taken so far, ``(B,)``.
    """

    returns: PyTree[FloatBatch]
    lengths: Int[Array, " B"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainingState(Replaceable):
    """Everything a training run carries from one PPO step to the next.

    ``steps_taken`` is a Python ``int`` kept on the host (a static pytree field):
    exact at any count, unlike a ``float32`` counter that stops counting at 2**24.
    The compiled step never sees it; :func:`~nnx_ppo.algorithms.ppo.ppo_step`
    advances it.

    Attributes:
      networks: the PPO network (a ``StatefulModule`` emitting ``PPONetworkOutput``).
      network_states: the carry of every training env, leaves ``(n_envs, ...)``.
      env_states: the batched env states, leaves ``(n_envs, ...)``.
      optimizer: an ``nnx.Optimizer`` over the network's ``nnx.Param`` s.
      rng_key: the key the next step splits.
      steps_taken: env steps taken so far (``n_envs * rollout_length`` per PPO step).
      running_episodes: returns and lengths of the episodes in progress; ``None``
        until the first step fills it.
    """

    networks: StatefulModule
    network_states: Carry
    env_states: EnvState
    optimizer: nnx.Optimizer
    rng_key: PRNGKeyArray
    steps_taken: int = dataclasses.field(default=0, metadata={"static": True})
    running_episodes: RunningEpisodes | None = None


class LoggingLevel(enum.Flag):
    """Which metrics a training or evaluation step computes and logs.

    ``ROLLOUT_OBS`` (the whole observation tree) stays out of ``ALL``: cheap for
    small observations, very costly for images, so it is opt-in.
    """

    LOSSES = enum.auto()
    CRITIC_EXTRA = enum.auto()
    ACTOR_EXTRA = enum.auto()
    ROLLOUT_STATS = enum.auto()
    ROLLOUT_OBS = enum.auto()
    ENV_METRICS = enum.auto()
    NETWORK_METRICS = enum.auto()
    GRAD_NORM = enum.auto()
    WEIGHTS = enum.auto()
    THROUGHPUT = enum.auto()
    BASIC = LOSSES
    ALL = (
        LOSSES
        | ACTOR_EXTRA
        | CRITIC_EXTRA
        | ROLLOUT_STATS
        | ENV_METRICS
        | NETWORK_METRICS
        | GRAD_NORM
        | WEIGHTS
        | THROUGHPUT
    )
    NONE = 0
