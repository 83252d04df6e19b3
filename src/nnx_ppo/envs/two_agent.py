"""Two agents in one environment, each steering a point to its own target."""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from nnx_ppo.contract.arguments import as_whole, require_int
from nnx_ppo.contract.env_checks import check_action_tree
from nnx_ppo.envs.state import State, time_limit

__all__ = ["TwoAgentReach"]

AGENTS = ("agent_0", "agent_1")
_SPEED = 0.1


class TwoAgentReach:
    """Two agents share an environment; each moves a point toward its own target.

    Observations, actions and rewards are dicts keyed ``"agent_0"`` and
    ``"agent_1"``. Points and targets start uniformly in ``[-1, 1]^2`` and
    points stay in that square. A policy that heads straight for its target
    reaches it within 20 steps, so an episode's return is dominated by how
    directly each agent heads for its target.

    - Observation: per agent ``float32[4]``: its position, and its target minus
      its position (``observation_size = {"agent_i": (4,)}``, Playground's
      convention for dict observations).
    - Action: per agent ``float32[2]`` (``action_size = {"agent_i": 2}``,
      ``discrete_actions = False``), a velocity clipped to ``[-1, 1]`` and
      scaled to 0.1 per step.
    - Reward: per agent, minus the distance from its point to its target after
      the step; 0.0 at reset.
    - End: ``done`` is one scalar for the whole environment (no per-agent
      ends): truncation (``info["truncated"] = True``) after ``max_steps``
      steps; never terminates.
    """

    discrete_actions: ClassVar[bool] = False

    def __init__(self, max_steps: int = 50) -> None:
        self.max_steps = require_int("TwoAgentReach", "max_steps", as_whole(max_steps), 1)

    @property
    def observation_size(self) -> dict[str, tuple[int, ...]]:
        """``(4,)`` per agent."""
        return {a: (4,) for a in AGENTS}

    @property
    def action_size(self) -> dict[str, int]:
        """2 per agent."""
        return {a: 2 for a in AGENTS}

    def reset(self, rng: PRNGKeyArray) -> State:
        """Draw every point and target uniformly in the square."""
        draws = jax.random.uniform(rng, (2, len(AGENTS), 2), minval=-1.0, maxval=1.0)
        position = {a: draws[0, i] for i, a in enumerate(AGENTS)}
        target = {a: draws[1, i] for i, a in enumerate(AGENTS)}
        return self._state(position, target, {a: jnp.zeros(()) for a in AGENTS}, 0)

    def step(self, state: State, action: dict[str, Float[Array, "2"]]) -> State:
        """Move each agent's point by its velocity."""
        check_action_tree(action, self, where="TwoAgentReach.step")
        target = state.data["target"]
        position = {
            a: jnp.clip(state.data["position"][a] + _SPEED * jnp.clip(action[a], -1, 1), -1, 1)
            for a in AGENTS
        }
        reward = {a: -jnp.linalg.norm(target[a] - position[a]) for a in AGENTS}
        return self._state(position, target, reward, state.data["steps"] + 1)

    def _state(
        self,
        position: dict[str, Float[Array, "2"]],
        target: dict[str, Float[Array, "2"]],
        reward: dict[str, Float[Array, ""]],
        steps: Int[Array, ""] | int,
    ) -> State:
        steps = jnp.asarray(steps, jnp.int32)
        done, truncated = time_limit(jnp.zeros((), bool), steps, self.max_steps)
        return State(
            obs={a: jnp.concatenate([position[a], target[a] - position[a]]) for a in AGENTS},
            reward=reward,
            done=done,
            metrics={},
            info={"truncated": truncated},
            data={"position": position, "target": target, "steps": steps},
        )
