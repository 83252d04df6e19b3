"""The contract where the PPO engine consumes a network: its output, its statistics, its cost."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import nnx_ppo
from nnx_ppo import ContractError
from nnx_ppo.algorithms import _step, ppo
from nnx_ppo.algorithms.config import PPOConfig
from nnx_ppo.algorithms.rollout import reset_envs, unroll_env
from nnx_ppo.envs import make
from nnx_ppo.networks.containers import FrozenStatistics, Sequential
from nnx_ppo.networks.factories import make_discrete_mlp_actor_critic
from nnx_ppo.networks.normalizer import Normalizer
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput

CONFIG = PPOConfig(n_envs=4, rollout_length=6, n_minibatches=1, n_epochs=1)


class UnsummedLogLikelihood(StatefulModule):
    """Wraps a network and forgets to sum its log-likelihood: ``(B, 1)`` instead of ``(B,)``."""

    def __init__(self, inner: StatefulModule) -> None:
        self.inner = inner

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        out = self.inner(state, x, rollout_extras)
        output = out.output.replace(loglikelihoods=out.output.loglikelihoods[:, None])
        return out.replace(output=output)

    def initialize_state(self, batch_size: int) -> Any:
        return self.inner.initialize_state(batch_size)

    def reset_state(self, prev_state: Any) -> Any:
        return self.inner.reset_state(prev_state)


def test_an_unsummed_log_likelihood_is_caught_in_the_rollout(counting_env, scripted_network):
    network = UnsummedLogLikelihood(scripted_network())
    env_state = reset_envs(counting_env, jax.random.split(jax.random.key(0), 2))
    with pytest.raises(ContractError) as caught:
        unroll_env(counting_env, env_state, network, jnp.zeros(2), 3, jax.random.key(1))
    error = caught.value
    assert error.where == "unroll_env"
    assert error.leaf == "network_output.loglikelihoods"
    assert error.expected == "(B,) floats with B=2"
    assert error.found == "shape (2, 1) float32"


class RoundedValues(UnsummedLogLikelihood):
    """Hands back its value estimates rounded to integers."""

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        out = self.inner(state, x, rollout_extras)
        rounded = out.output.value_estimates.astype(jnp.int32)
        return out.replace(output=out.output.replace(value_estimates=rounded))


def test_integer_value_estimates_are_caught_in_the_rollout(counting_env, scripted_network):
    network = RoundedValues(scripted_network())
    env_state = reset_envs(counting_env, jax.random.split(jax.random.key(0), 2))
    with pytest.raises(ContractError) as caught:
        unroll_env(counting_env, env_state, network, jnp.zeros(2), 3, jax.random.key(1))
    assert caught.value.leaf == "network_output.value_estimates"
    assert caught.value.found == "shape (2,) int32"


def test_an_unsummed_log_likelihood_is_caught_in_loss_replay(counting_env, scripted_network):
    # One env per minibatch: unchecked, (T, 1) - (T,) broadcasts to a (T, T) outer product.
    good = scripted_network()
    env_state = reset_envs(counting_env, jax.random.split(jax.random.key(0), 1))
    _, _, transitions = unroll_env(
        counting_env, env_state, good, jnp.zeros(1), 5, jax.random.key(1)
    )
    advantages, targets = ppo.compute_advantages(transitions, 0.95, 0.99)
    with pytest.raises(ContractError) as caught:
        ppo.ppo_loss(
            UnsummedLogLikelihood(good), jnp.zeros(1), transitions, advantages, targets, CONFIG
        )
    assert caught.value.where == "ppo_loss"
    assert caught.value.leaf == "network_output.loglikelihoods"


class WritesStatisticsInCall(StatefulModule):
    """A normaliser that (wrongly) updates its running mean in the forward pass."""

    def __init__(self, size: int) -> None:
        self.mean = nnx.BatchStat(jnp.zeros(size))

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        self.mean[...] = 0.9 * self.mean[...] + 0.1 * x.mean(0)
        return StatefulModuleOutput(state, x - self.mean[...], jnp.zeros(()), {}, None)


def _policy(env: Any) -> StatefulModule:
    return make_discrete_mlp_actor_critic(
        env.observation_size, env.action_size, [8], [8], nnx.Rngs(0), normalize_obs=False
    )


def _training_state(network: StatefulModule) -> ppo.TrainingState:
    return ppo.new_training_state(make("cartpole"), network, CONFIG.n_envs, seed=0)


def test_a_statistic_written_in_call_during_training_names_module_and_variable():
    env = make("cartpole")
    policy = _policy(env)
    network = Sequential([WritesStatisticsInCall(env.observation_size), policy])
    with pytest.raises(ContractError) as caught:
        ppo.ppo_step(env, _training_state(network), CONFIG)
    error = caught.value
    assert error.where == "Sequential.layers[0] (WritesStatisticsInCall).__call__"
    assert error.leaf == "Sequential.layers[0].mean (BatchStat)"
    assert "statistics only in update_statistics" in str(error.rule)


def test_a_frozen_normalizer_trains_unchanged_beside_a_live_one():
    env = make("cartpole")
    frozen = Normalizer(env.observation_size)
    live = Normalizer(env.observation_size)
    policy = _policy(env)
    network = Sequential([FrozenStatistics(frozen), live, policy])
    state, _ = ppo.ppo_step(env, _training_state(network), CONFIG)
    assert float(frozen.counter[...]) == 0.0
    assert float(live.counter[...]) == CONFIG.n_envs * CONFIG.rollout_length
    del state


def _lowered_training_step(checks_on: bool) -> str:
    """The StableHLO text of one PPO training step, traced afresh with the checks on or off."""
    env = make("cartpole")
    network = Sequential(
        [
            Normalizer(env.observation_size),
            _policy(env),
        ]
    )
    training_state = _training_state(network)
    graphdef, state = nnx.split((training_state.networks, training_state.optimizer))
    running = _step._no_running_episodes(training_state.env_states)
    carry = _step.StepCarry(
        training_state.network_states, training_state.env_states, running, jax.random.key(0)
    )

    def step(state: nnx.State, carry: Any) -> Any:  # a new function object: a fresh trace
        networks, optimizer = nnx.merge(graphdef, state)
        return _step._train_step(env, CONFIG, networks, optimizer, carry)

    with nnx_ppo.checks(checks_on):
        return jax.jit(step).lower(state, carry).as_text()


def test_checks_leave_no_trace_in_the_compiled_training_step():
    with_checks = _lowered_training_step(True)
    without_checks = _lowered_training_step(False)
    assert "stablehlo" in with_checks
    assert with_checks == without_checks
