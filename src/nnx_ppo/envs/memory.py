"""A cue-recall task that only a policy with carry state can solve."""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from nnx_ppo.contract.arguments import as_whole, require_int
from nnx_ppo.contract.env_checks import check_action_tree
from nnx_ppo.envs.state import State

__all__ = ["MemoryTask"]


class MemoryTask:
    """Remember a cue shown once, through ``delay`` blank steps, then name it.

    An episode shows one of ``n_cues`` cues on its first observation only,
    then ``delay`` observations without it, then a query observation; the
    action taken on the query observation is scored and ends the episode
    (``delay + 2`` steps in all). The observation never reveals the cue after
    the first one, so a memoryless policy can do no better than a random
    answer: expected return ``(2 - n_cues) / n_cues`` (0 with 2 cues), against
    1.0 for a policy that remembers.

    - Observation: ``float32[n_cues + 2]``: the one-hot cue (zeros after the
      first step), a query flag (1.0 on the step to answer), and the time
      since the start as a fraction of ``delay + 1``.
    - Action: an integer scalar (``discrete_actions = True``, ``action_size =
      n_cues``), the cue the agent names; ignored before the query.
    - Reward: +1 for naming the cue on the query step, -1 for another cue, 0 on
      every other step and at reset.
    - End: termination right after the query step; no truncation.
    """

    discrete_actions: ClassVar[bool] = True
    requires_memory: ClassVar[bool] = True
    """Only a policy with carry state can solve it; presets pick a recurrent network."""

    def __init__(self, n_cues: int = 2, delay: int = 4) -> None:
        self.n_cues = require_int("MemoryTask", "n_cues", as_whole(n_cues), 2)
        self.delay = require_int("MemoryTask", "delay", as_whole(delay), 0)

    @property
    def observation_size(self) -> int:
        """``n_cues + 2``: the cue, the query flag and the time."""
        return self.n_cues + 2

    @property
    def action_size(self) -> int:
        """``n_cues``: one choice per cue."""
        return self.n_cues

    def reset(self, rng: PRNGKeyArray) -> State:
        """Draw the cue uniformly and show it."""
        cue = jax.random.randint(rng, (), 0, self.n_cues)
        time = jnp.zeros((), jnp.int32)
        return State(
            obs=self._observe(cue, time),
            reward=jnp.zeros(()),
            done=jnp.zeros((), jnp.float32),
            metrics={},
            info={"truncated": jnp.zeros((), bool)},
            data={"cue": cue, "time": time},
        )

    def step(self, state: State, action: Int[Array, ""]) -> State:
        """Advance one step; score ``action`` if the current observation is the query."""
        check_action_tree(action, self, where="MemoryTask.step")
        cue, time = state.data["cue"], state.data["time"]
        is_query = time == self.delay + 1
        reward = jnp.where(is_query, jnp.where(action == cue, 1.0, -1.0), 0.0)
        next_time = time + 1
        return State(
            obs=self._observe(cue, next_time),
            reward=reward,
            done=is_query.astype(jnp.float32),
            metrics={},
            info={"truncated": jnp.zeros((), bool)},
            data={"cue": cue, "time": next_time},
        )

    def _observe(self, cue: Int[Array, ""], time: Int[Array, ""]) -> Float[Array, " obs"]:
        shown = jax.nn.one_hot(cue, self.n_cues) * (time == 0)
        query = (time == self.delay + 1).astype(jnp.float32)
        elapsed = time.astype(jnp.float32) / (self.delay + 1)
        return jnp.concatenate([shown, query[None], elapsed[None]])
