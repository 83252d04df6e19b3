"""Reward scaling and learning-rate schedules, as configured."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from nnx_ppo.algorithms import _step
from nnx_ppo.algorithms.checkpointing import config_from_dict
from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.ppo import new_training_state, train_ppo


def train_step_eagerly(env, network, config: PPOConfig) -> None:
    """One PPO step of a fresh state, run eagerly so that patched functions see arrays."""
    state = new_training_state(env, network, config.n_envs, seed=0)
    carry = _step.StepCarry(
        state.network_states,
        state.env_states,
        _step._no_running_episodes(state.env_states),
        state.rng_key,
    )
    _step._train_step(env, config, network, state.optimizer, carry)


def test_reward_scaling_scales_what_the_critic_learns_and_not_what_is_logged(
    counting_env, scripted_network, monkeypatch
):
    config = PPOConfig(n_envs=4, rollout_length=6, n_minibatches=1, n_epochs=1, reward_scaling=2.5)
    seen: dict[str, list] = {"scored": [], "logged": []}
    score, track = _step.compute_advantages, _step.track_episodes

    def scoring(rollout_data, *args):
        seen["scored"].append(np.asarray(rollout_data.rewards))
        return score(rollout_data, *args)

    def tracking(running, rewards, ended):
        seen["logged"].append(np.asarray(rewards))
        return track(running, rewards, ended)

    monkeypatch.setattr(_step, "compute_advantages", scoring)
    monkeypatch.setattr(_step, "track_episodes", tracking)
    train_step_eagerly(counting_env, scripted_network(), config)
    (scored,), (logged,) = seen["scored"], seen["logged"]
    assert logged.max() > 0
    np.testing.assert_allclose(scored, 2.5 * logged)


def test_the_step_scores_its_rollout_with_the_configs_lambda_and_gamma(
    counting_env, scripted_network, monkeypatch
):
    from test_gae import reference_gae

    config = PPOConfig(
        n_envs=4, rollout_length=6, n_minibatches=1, n_epochs=1, gae_lambda=0.8,
        discounting_factor=0.9,
    )  # fmt: skip
    seen: list = []
    score = _step.compute_advantages

    def scoring(rollout_data, *args):
        result = score(rollout_data, *args)
        seen.append(jax.tree.map(np.asarray, (rollout_data, result)))
        return result

    monkeypatch.setattr(_step, "compute_advantages", scoring)
    train_step_eagerly(counting_env, scripted_network(), config)
    ((rollout, (advantages, targets)),) = seen
    values = rollout.network_output.value_estimates
    expected = reference_gae(
        rollout.rewards, values, rollout.next_value_estimates, rollout.done, rollout.truncated,
        lam=0.8, gamma=0.9,
    )  # fmt: skip
    assert np.abs(expected).max() > 0
    np.testing.assert_allclose(advantages, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(targets, expected + values, rtol=1e-5, atol=1e-6)  # A + V(s)


def test_reward_scaling_must_be_positive():
    with pytest.raises(ValueError, match="reward_scaling"):
        PPOConfig(reward_scaling=0.0)


def small_config(schedule: str, **sizes: int) -> PPOConfig:
    """4 envs x 8 steps per PPO step, a learning rate of 1e-3 on ``schedule``."""
    return PPOConfig(
        n_envs=4, rollout_length=8, learning_rate=1e-3, learning_rate_schedule=schedule, **sizes
    )


def test_a_linear_schedule_decays_to_zero_over_the_runs_updates():
    config = small_config("linear", n_epochs=2, n_minibatches=2, total_steps=3 * 32)
    rate = config.optimizer_learning_rate()
    assert callable(rate)
    updates = 3 * 2 * 2
    np.testing.assert_allclose([rate(0), rate(updates // 2), rate(updates)], [1e-3, 5e-4, 0.0])
    assert config.optimizer_learning_rate() is rate  # one schedule: one compiled step
    # A run whose length is not whole PPO steps rounds up: 2.5 steps train 3.
    assert small_config("linear", n_epochs=2, total_steps=80).total_updates == 3 * 2 * 4
    assert PPOConfig(learning_rate=1e-3).optimizer_learning_rate() == 1e-3


def test_schedule_settings_are_checked_and_read_from_a_config_file():
    with pytest.raises(ValueError, match="'constant' or 'linear'"):
        PPOConfig(learning_rate_schedule="cosine")
    with pytest.raises(ValueError, match="already a schedule"):
        PPOConfig(learning_rate=optax.constant_schedule(1e-3), learning_rate_schedule="linear")
    parsed = config_from_dict({"ppo": {"learning_rate_schedule": "linear", "reward_scaling": 10}})
    assert (parsed.ppo.learning_rate_schedule, parsed.ppo.reward_scaling) == ("linear", 10)


def test_train_ppo_gives_the_optimizer_the_schedule(counting_env, scripted_network):
    def counters(schedule: str) -> list[int]:
        ppo = small_config(schedule, n_epochs=1, n_minibatches=1, total_steps=2 * 32)
        config = TrainConfig(ppo=ppo, eval=EvalConfig(enabled=False))
        result = train_ppo(counting_env, scripted_network(), config)
        leaves = jax.tree.leaves(nnx.state(result.training_state.optimizer))
        return [int(leaf) for leaf in leaves if np.asarray(leaf).dtype == np.int32]

    # Adam counts its updates; a scheduled rate adds the schedule's own count of them.
    assert counters("constant") == [2]  # Adam's count
    assert counters("linear") == [2, 2]


def test_the_seed_and_total_steps_arguments_override_the_config(counting_env, scripted_network):
    def final_key(config, **overrides):
        config.eval.enabled = False
        result = train_ppo(counting_env, scripted_network(), config, **overrides)
        assert result.total_steps == 64
        return jax.random.key_data(result.training_state.rng_key)

    def config(seed):
        return TrainConfig(ppo=small_config("constant", n_minibatches=1), seed=seed)

    by_arguments = final_key(config(0), seed=5, total_steps=64)
    by_config = config(5)
    by_config.ppo.total_steps = 64
    np.testing.assert_array_equal(by_arguments, final_key(by_config))
    assert not np.array_equal(by_arguments, final_key(config(0), total_steps=64))
