"""A time limit that marks its ends as truncations, with a step counter in ``info``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import PRNGKeyArray

from nnx_ppo.contract.arguments import as_whole, require_bool, require_int
from nnx_ppo.contract.axes import Unbatched
from nnx_ppo.contract.env_checks import check_env_state
from nnx_ppo.envs.state import EnvState, RLEnv, episode_flags
from nnx_ppo.wrappers.base import Wrapper

__all__ = ["EpisodeWrapper"]


class EpisodeWrapper(Wrapper):
    """Ends every episode after ``max_len`` steps, as a truncation.

    Writes two entries in ``state.info``:

    - ``"step_counter"``: an ``int32`` scalar, the steps taken in the episode
      (0 after ``reset``, or the random start of ``random_initial_step``);
    - ``"truncated"``: a ``bool`` shaped like ``done``, ``True`` where the
      episode was cut short: by this time limit, or by the wrapped env's own
      ``info["truncated"]`` (or Playground's ``info["truncation"]``) where its
      ``done`` holds. A step that terminates on the last allowed step
      counts as terminated, not truncated, so a value target bootstraps only
      where the episode really went on.

    ``done`` is set where the episode was truncated and keeps the wrapped env's
    dtype. Every other attribute is the wrapped env's.

    Args:
      env: one unbatched environment.
      max_len: the time limit, in steps.
      random_initial_step: start each episode's counter uniformly in
        ``[0, max(max_len // 2, 1))``, so that envs reset together
        drift apart in time. Off by default: the counter starts at 0 and the
        wrapped env's ``reset`` gets ``rng`` unchanged. When on, ``rng`` is
        split, one half for the counter.
    """

    def __init__(self, env: RLEnv, max_len: int, *, random_initial_step: bool = False) -> None:
        super().__init__(env)
        self.max_len = require_int("EpisodeWrapper", "max_len", as_whole(max_len), 1)
        self.random_initial_step = require_bool(
            "EpisodeWrapper", "random_initial_step", random_initial_step
        )
        inner: object = env
        while isinstance(inner, Wrapper):
            if isinstance(inner, EpisodeWrapper):
                raise ValueError(
                    "EpisodeWrapper: the env already has a time limit (an EpisodeWrapper "
                    f"with max_len={inner.max_len} inside); two would share "
                    "info['step_counter'] and cut each other's episodes. Keep one."
                )
            inner = inner.env

    def reset(self, rng: PRNGKeyArray) -> EnvState:
        """The wrapped env's reset, with the counter and ``truncated`` in ``info``."""
        if self.random_initial_step:
            rng, counter_rng = jax.random.split(rng)
            counter = jax.random.randint(
                counter_rng, (), 0, max(self.max_len // 2, 1), dtype=jnp.int32
            )
        else:
            counter = jnp.zeros((), jnp.int32)
        state = self.env.reset(rng)
        not_truncated = jax.tree.map(lambda d: jnp.zeros(jnp.shape(d), bool), state.done)
        info = {**state.info, "step_counter": counter, "truncated": not_truncated}
        return state.replace(info=info)

    def step(self, state: EnvState, action: Unbatched) -> EnvState:
        """The wrapped env's step, truncated once ``max_len`` steps are taken."""
        next_state = self.env.step(state, action)
        # The wrapped env's own flags are read below: a malformed one is named here, as
        # the wrapped env's, before it is folded into done.
        check_env_state(next_state, where=f"{type(self.env).__name__}.step in EpisodeWrapper")
        counter = state.info["step_counter"] + 1
        time_up = counter >= self.max_len
        # The wrapped env's own truncations, read as training reads them: only where done
        # was first set.
        ended, inner = episode_flags(next_state, before=state)
        truncated = jax.tree.map(
            lambda d, t: jnp.logical_or(t, jnp.logical_and(time_up, jnp.logical_not(d))),
            ended,
            inner,
        )
        done = jax.tree.map(
            lambda d, t: jnp.logical_or(d, t).astype(jnp.asarray(d).dtype),
            next_state.done,
            truncated,
        )
        info = {**next_state.info, "step_counter": counter, "truncated": truncated}
        return next_state.replace(done=done, info=info)
