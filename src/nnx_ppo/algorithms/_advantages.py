"""Score a rollout: generalised advantage estimates per reward leaf.

Truncation: an episode cut short by a time limit (``truncated``) bootstraps
from the value of its true final observation, ``V(next_obs)`` under the carry
before the reset; a terminated one bootstraps from zero. Either way the GAE
trace stops at the episode's end.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import jax
import jax.numpy as jnp
from jaxtyping import Array, PyTree, ScalarLike

from nnx_ppo.algorithms import rollout
from nnx_ppo.algorithms.types import (
    Transition,
)
from nnx_ppo.contract.axes import BoolHistory, FloatHistory
from nnx_ppo.contract.checking import typechecked
from nnx_ppo.contract.errors import DOCS_URL

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _explaining_last_value(gae: Callable[_P, _R]) -> Callable[_P, _R]:
    """``gae``, naming what replaced nnx-ppo 0.3.0's ``last_value`` keyword, where Python
    would say only that ``next_values`` is missing."""

    @functools.wraps(gae)
    def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        if "last_value" in kwargs:
            raise TypeError(
                "gae: last_value, the (B,) value after the rollout's last step in nnx-ppo "
                "0.3.0, is next_values now: the value of each step's next observation, "
                "(T, B), before any reset (Transition.next_value_estimates), which also "
                f"bootstraps a step truncated mid-rollout (see {DOCS_URL}migration.html)."
            )
        return gae(*args, **kwargs)

    return call


@_explaining_last_value
@typechecked
def gae(
    rewards: FloatHistory,
    values_excl_last: FloatHistory,
    next_values: FloatHistory,
    done: BoolHistory,
    truncation: BoolHistory,
    lambda_: ScalarLike,
    gamma: ScalarLike,
) -> FloatHistory:
    """Generalised advantage estimates of one reward leaf.

    ``delta_t = r_t + gamma * V(next_obs_t) * (not terminated_t) - V(obs_t)`` with
    ``terminated = done and not truncation``, and
    ``A_t = delta_t + gamma * lambda * (not done_t) * A_{t+1}``: termination cuts the
    bootstrap, truncation keeps it (from the true final observation), and any
    episode end cuts the trace. The last step's ``A_{T}`` is zero.

    Args:
      rewards, values_excl_last: per step, ``(T, B)``; ``values_excl_last`` is
        ``V(obs_t)`` (0.3.0's names for the arguments are kept).
      next_values: ``V(next_obs)`` per step, pre-reset (``Transition.next_value_estimates``).
      done, truncation: episode ends, and which of them were time limits.
      lambda_, gamma: GAE's lambda and the discount.

    Raises:
      ContractError: an input is not ``(T, B)`` with the ``T`` and ``B`` of
        ``rewards``; the message names the argument and both shapes.
    """
    terminated = jnp.logical_and(done, jnp.logical_not(truncation))
    deltas = jnp.asarray(
        rewards + gamma * jnp.where(terminated, 0.0, next_values) - values_excl_last
    )

    def step(later: Array, inputs: tuple[Array, Array]) -> tuple[Array, Array]:
        delta, ended = inputs  # one step's (B,) rows
        advantage = delta + gamma * lambda_ * jnp.where(ended, 0.0, later)
        return advantage, advantage

    ended = jnp.asarray(done)
    _, advantages = jax.lax.scan(step, jnp.zeros_like(deltas[0]), (deltas, ended), reverse=True)
    return jax.lax.stop_gradient(advantages)


@typechecked
def compute_advantages(
    rollout_data: Transition, gae_lambda: ScalarLike, discounting_factor: ScalarLike
) -> tuple[PyTree[FloatHistory], PyTree[FloatHistory]]:
    """GAE per reward leaf from the rollout's own value estimates.

    Returns:
      ``(advantages, value_targets)``, trees like the rewards with ``(T, B)``
      leaves; ``value_targets = advantages + value_estimates``.
    """
    values = rollout_data.network_output.value_estimates
    advantages = jax.tree.map(
        functools.partial(gae, lambda_=gae_lambda, gamma=discounting_factor),
        rollout_data.rewards,
        values,
        rollout_data.next_value_estimates,
        rollout.per_reward_leaf(rollout_data.done, rollout_data.rewards),
        rollout.per_reward_leaf(rollout_data.truncated, rollout_data.rewards),
    )
    return advantages, jax.tree.map(jnp.add, advantages, values)
