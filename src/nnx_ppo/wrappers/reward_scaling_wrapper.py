"""Multiply every reward leaf by a constant."""

from __future__ import annotations

import jax
import numpy as np
from jaxtyping import PRNGKeyArray

from nnx_ppo.contract.arguments import require_number
from nnx_ppo.contract.axes import Unbatched
from nnx_ppo.envs.state import EnvState, RLEnv
from nnx_ppo.wrappers.base import Wrapper

__all__ = ["RewardScalingWrapper"]


class RewardScalingWrapper(Wrapper):
    """Scales the reward, a scalar or every leaf of a reward pytree, by ``reward_scale``.

    Applies to the states of both ``reset`` and ``step``. Every other attribute
    is the wrapped env's.

    Args:
      env: one unbatched environment.
      reward_scale: a finite number.
    """

    def __init__(self, env: RLEnv, reward_scale: float) -> None:
        super().__init__(env)
        if isinstance(reward_scale, np.ndarray | jax.Array) and reward_scale.ndim == 0:
            reward_scale = reward_scale.item()  # a 0-d array, as 0.3.0 took
        require_number("RewardScalingWrapper", "reward_scale", reward_scale)
        self.reward_scale = float(reward_scale)

    def reset(self, rng: PRNGKeyArray) -> EnvState:
        """The wrapped env's reset, reward scaled."""
        return self._scaled(self.env.reset(rng))

    def step(self, state: EnvState, action: Unbatched) -> EnvState:
        """The wrapped env's step, reward scaled."""
        return self._scaled(self.env.step(state, action))

    def _scaled(self, state: EnvState) -> EnvState:
        return state.replace(reward=jax.tree.map(lambda r: r * self.reward_scale, state.reward))
