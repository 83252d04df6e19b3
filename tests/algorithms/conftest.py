"""Small deterministic environments and networks whose every number a test can predict."""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jaxtyping import Array, Float, PRNGKeyArray

from nnx_ppo.envs import State
from nnx_ppo.networks.types import PPONetworkOutput, StatefulModule, StatefulModuleOutput


class CountingEnv:
    """Counts steps; an episode lasts a horizon drawn at reset from {2, 3, 4}.

    Observation ``(t, horizon)``; the reward of step ``t -> t + 1`` is ``t + 1``; an
    episode with an even horizon ends as a truncation, an odd one terminates.
    With ``poison_probability``, that fraction of episodes has NaN rewards.
    """

    discrete_actions: ClassVar[bool] = False
    observation_size: ClassVar[int] = 2
    action_size: ClassVar[int] = 1

    def __init__(self, poison_probability: float = 0.0) -> None:
        self.poison_probability = poison_probability

    def reset(self, key: PRNGKeyArray) -> State:
        horizon_key, poison_key = jax.random.split(key)
        horizon = jax.random.randint(horizon_key, (), 2, 5)
        poisoned = jax.random.uniform(poison_key) < self.poison_probability
        zero = jnp.zeros((), jnp.int32)
        state = self._state(zero, horizon, jnp.zeros(()), jnp.zeros((), bool), poisoned)
        return state

    def step(self, state: State, action: Float[Array, "1"]) -> State:
        del action
        t = state.data["t"] + 1
        horizon, poisoned = state.data["horizon"], state.data["poisoned"]
        reward = jnp.where(poisoned, jnp.nan, t.astype(jnp.float32))
        done = t >= horizon
        state = self._state(t, horizon, reward, done & (horizon % 2 == 0), poisoned)
        return state.replace(done=done.astype(jnp.float32))

    def _state(self, t, horizon, reward, truncated, poisoned) -> State:
        return State(
            obs=jnp.stack([t, horizon]).astype(jnp.float32),
            reward=reward,
            done=jnp.zeros(()),
            metrics={"t": t.astype(jnp.float32)},
            info={"truncated": truncated},
            data={"t": t, "horizon": horizon, "poisoned": poisoned},
        )


class ScriptedNetwork(StatefulModule):
    """A PPO network with two scalar parameters and a step counter as carry.

    Carry ``c`` ``(B,)`` counts calls since the last reset. Output:
    ``log-likelihood = w * (c + obs[:, 0])``, ``value = v * obs[:, 0] + c``, action
    zeros ``(B, 1)``; regularization ``0.5 * w**2`` per sample. With ``agents``,
    actions, log-likelihoods and values are dicts, agent ``i`` scaling ``w`` and
    ``v`` by ``i + 1``.
    """

    def __init__(self, w: float = 0.3, v: float = 0.5, agents: tuple[str, ...] = ()) -> None:
        self.w = nnx.Param(jnp.asarray(w, jnp.float32))
        self.v = nnx.Param(jnp.asarray(v, jnp.float32))
        self.agents = nnx.static(agents)

    def __call__(self, state, x, rollout_extras=None) -> StatefulModuleOutput:
        base = x[:, 0]
        loglikelihood = self.w[...] * (state + base)
        value = self.v[...] * base + state
        action = jnp.zeros((x.shape[0], 1))
        if self.agents:
            scale = {agent: i + 1.0 for i, agent in enumerate(self.agents)}
            output = PPONetworkOutput(
                actions={a: action for a in self.agents},
                loglikelihoods={a: s * loglikelihood for a, s in scale.items()},
                value_estimates={a: s * value for a, s in scale.items()},
            )
        else:
            output = PPONetworkOutput(action, loglikelihood, value)
        regularization = jnp.full(x.shape[:1], 0.5 * self.w[...] ** 2)
        return StatefulModuleOutput(state + 1.0, output, regularization, {})

    def initialize_state(self, batch_size: int):
        return jnp.zeros(batch_size)

    def reset_state(self, prev_state):
        return jnp.zeros_like(prev_state)


@pytest.fixture(scope="session")
def counting_env() -> CountingEnv:
    return CountingEnv()


@pytest.fixture(scope="session")
def poisoned_env() -> CountingEnv:
    return CountingEnv(poison_probability=0.05)


@pytest.fixture(scope="session")
def scripted_network() -> type[ScriptedNetwork]:
    return ScriptedNetwork


@pytest.fixture
def flat_replay_callers(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ``where`` of every flat replay (``rollout._replay_flat``) traced in the test."""
    from nnx_ppo.algorithms import rollout

    callers: list[str] = []
    replay = rollout._replay_flat

    def spy(networks: Any, rollout_data: Any, where: str) -> Any:
        callers.append(where)
        return replay(networks, rollout_data, where)

    monkeypatch.setattr(rollout, "_replay_flat", spy)
    return callers
