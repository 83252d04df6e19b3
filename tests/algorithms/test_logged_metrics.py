"""Logged metrics against hand-computed and NumPy references: episode returns and
lifespans, explained variance."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nnx_ppo.algorithms import _step
from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.metrics import episode_metrics, track_episodes
from nnx_ppo.algorithms.ppo import compute_advantages, new_training_state, ppo_step, train_ppo
from nnx_ppo.algorithms.types import LoggingLevel, RunningEpisodes, Transition
from nnx_ppo.networks.types import PPONetworkOutput

# Two envs, six steps. Env 0 enters with an episode 2 steps and 10.0 old, which ends
# at step 1 (length 4, return 10 + 1 + 2 = 13); the next ends at step 4 (length 3,
# return 3 + 4 + 5 = 12); one step (reward 6) is left running. Env 1's only episode
# ends at the last step (length 6, return 210). The last reward of each episode
# differs from the others, so a total that leaves it out is off.
REWARDS = np.array([[1, 10], [2, 20], [3, 30], [4, 40], [5, 50], [6, 60]], np.float32)
ENDED = np.zeros((6, 2), bool)
ENDED[[1, 4], 0] = True
ENDED[5, 1] = True
RUNNING_IN = RunningEpisodes(
    returns=jnp.array([10.0, 0.0], jnp.float32), lengths=jnp.array([2, 0], jnp.int32)
)


def test_track_episodes_totals_each_ended_episode_including_its_last_step():
    running, totals = track_episodes(RUNNING_IN, jnp.asarray(REWARDS), jnp.asarray(ENDED))
    assert int(totals["count"]) == 3
    assert int(totals["lengths"]) == 4 + 3 + 6
    np.testing.assert_allclose(totals["returns"], 13 + 12 + 210)
    np.testing.assert_array_equal(running.lengths, [1, 0])
    np.testing.assert_allclose(running.returns, [6, 0])
    assert episode_metrics(totals) == {
        "rollout_batch/episodes_completed": 3.0,
        "rollout_batch/episode_reward/mean": pytest.approx(235 / 3),
        "rollout_batch/lifespan/mean": pytest.approx(13 / 3),
    }


def test_track_episodes_totals_each_reward_leaf():
    rewards = {"a": jnp.asarray(REWARDS), "b": -2 * jnp.asarray(REWARDS)}
    running_in = RunningEpisodes(
        returns={"a": RUNNING_IN.returns, "b": jnp.array([1.0, 0.0])}, lengths=RUNNING_IN.lengths
    )
    running, totals = track_episodes(running_in, rewards, jnp.asarray(ENDED))
    # Leaf b: env 0's episodes return 1 - 2 * (1 + 2) = -5 and -24; env 1's -420.
    np.testing.assert_allclose(totals["returns"]["a"], 235)
    np.testing.assert_allclose(totals["returns"]["b"], -5 - 24 - 420)
    np.testing.assert_allclose(running.returns["b"], [-12, 0])
    metrics = episode_metrics(totals)
    assert metrics["rollout_batch/episode_reward/a/mean"] == pytest.approx(235 / 3)
    assert metrics["rollout_batch/episode_reward/b/mean"] == pytest.approx(-449 / 3)
    assert metrics["rollout_batch/episode_reward/mean"] == pytest.approx((235 - 449) / 3)
    assert metrics["rollout_batch/lifespan/mean"] == pytest.approx(13 / 3)


def test_a_tuple_reward_is_logged_per_leaf_as_evaluation_logs_it():
    rewards = (jnp.asarray(REWARDS), -2 * jnp.asarray(REWARDS))
    running_in = RunningEpisodes(
        returns=(RUNNING_IN.returns, jnp.array([1.0, 0.0])), lengths=RUNNING_IN.lengths
    )
    _, totals = track_episodes(running_in, rewards, jnp.asarray(ENDED))
    metrics = episode_metrics(totals)
    assert metrics["rollout_batch/episode_reward/0/mean"] == pytest.approx(235 / 3)
    assert metrics["rollout_batch/episode_reward/1/mean"] == pytest.approx(-449 / 3)


@pytest.fixture
def three_step_env(counting_env):
    """The counting env with every episode 3 steps long: rewards 1, 2, 3, return 6."""

    class ThreeSteps(type(counting_env)):
        def reset(self, key):
            state = super().reset(key)
            horizon = jnp.full((), 3, jnp.int32)
            return state.replace(
                obs=state.obs.at[1].set(3.0), data=state.data | {"horizon": horizon}
            )

    return ThreeSteps()


def test_train_ppo_logs_the_lifespan_and_return_of_episodes_ending_in_each_rollout(
    three_step_env, scripted_network
):
    # Rollouts of 5 steps on 2 envs: episodes end at env steps 3, 6, 9, 12, 15, so
    # each rollout after the first ends episodes begun in the rollout before.
    ppo = PPOConfig(
        n_envs=2,
        rollout_length=5,
        n_minibatches=1,
        n_epochs=1,
        total_steps=3 * 2 * 5,
        logging_level=LoggingLevel.ROLLOUT_STATS,
    )
    logged = []
    train_ppo(
        three_step_env,
        scripted_network(),
        TrainConfig(ppo=ppo, eval=EvalConfig(enabled=False)),
        log_fn=lambda metrics, step: logged.append((step, metrics)),
    )
    steps = [(step, metrics) for step, metrics in logged if step > 0]
    assert [step for step, _ in steps] == [10, 20, 30]
    for (step, metrics), completed in zip(steps, [2, 4, 4], strict=True):
        assert metrics["rollout_batch/episodes_completed"] == completed, step
        assert metrics["rollout_batch/lifespan/mean"] == 3.0, step
        assert metrics["rollout_batch/episode_reward/mean"] == 6.0, step


def step_metrics_of(values, targets):
    """``_step_metrics`` of a rollout with these value estimates and targets, ``(T, B)``."""
    shape = jax.tree.leaves(values)[0].shape
    zeros = jnp.zeros(shape)
    transitions = Transition(
        obs=jnp.zeros((*shape, 2)),
        network_output=PPONetworkOutput(jnp.zeros((*shape, 1)), zeros, values),
        rewards=jax.tree.map(jnp.zeros_like, targets),
        done=jnp.zeros(shape, bool),
        truncated=jnp.zeros(shape, bool),
        next_obs=jnp.zeros((*shape, 2)),
        metrics={"env": {}, "net": {}},
    )
    advantages = jax.tree.map(jnp.subtract, targets, values)
    config = PPOConfig(n_envs=shape[1], n_minibatches=1, logging_level=LoggingLevel.CRITIC_EXTRA)
    return _step._step_metrics(
        None, transitions, advantages, targets, {}, jnp.ones(1, bool), config
    )


def explained_variance(v, t):
    return 1 - np.var(t - v) / np.var(t)


def test_step_metrics_explained_variance_matches_numpy():
    # The targets vary about 4 times as much as the values, and the error is not
    # centred, so explained variance differs from both the R^2 of the loss and a
    # ratio to the values' variance.
    rng = np.random.default_rng(0)
    v = rng.normal(1.0, 0.5, (4, 3)).astype(np.float32)
    t = (v + rng.normal(2.0, 1.0, (4, 3))).astype(np.float32)
    assert abs(np.var(t) - np.var(v)) > 0.5 * np.var(t)
    metrics = step_metrics_of(jnp.asarray(v), jnp.asarray(t))
    np.testing.assert_allclose(
        metrics["losses/explained_variance"], explained_variance(v, t), rtol=1e-5
    )
    trees = step_metrics_of(
        {"a": jnp.asarray(v), "b": jnp.asarray(2 * t)}, {"a": jnp.asarray(t), "b": jnp.asarray(v)}
    )
    np.testing.assert_allclose(
        trees["losses/explained_variance/a"], explained_variance(v, t), rtol=1e-5
    )
    np.testing.assert_allclose(
        trees["losses/explained_variance/b"], explained_variance(2 * t, v), rtol=1e-5
    )


def test_ppo_step_logs_the_explained_variance_of_its_own_rollout(counting_env, scripted_network):
    # The step's rollout, collected again from the same carry, scored by
    # compute_advantages and reduced in NumPy.
    config = PPOConfig(
        n_envs=3,
        rollout_length=6,
        n_minibatches=1,
        n_epochs=1,
        logging_level=LoggingLevel.CRITIC_EXTRA,
    )
    state = _step._prepared(
        "test", new_training_state(counting_env, scripted_network(), 3, seed=0), config
    )
    collected = _step._collect(counting_env, config, state.networks, _step._carry_of(state), None)
    _, targets = compute_advantages(
        collected.transitions, config.gae_lambda, config.discounting_factor
    )
    values = np.asarray(collected.transitions.network_output.value_estimates)
    targets = np.asarray(targets)
    assert abs(np.var(targets) - np.var(values)) > 0.1 * np.var(targets)
    _, metrics = ppo_step(counting_env, state, config)
    np.testing.assert_allclose(
        metrics["losses/explained_variance"], explained_variance(values, targets), rtol=1e-4
    )


def test_the_policy_entropy_is_minus_the_mean_log_likelihood_of_the_actions_taken():
    from nnx_ppo.algorithms.metrics import compute_metrics

    loglikelihoods = -jnp.arange(1.0, 7.0).reshape(3, 2)  # every action less likely than 1
    transitions = Transition(
        obs=jnp.zeros((3, 2, 1)),
        network_output=PPONetworkOutput(jnp.zeros((3, 2, 1)), loglikelihoods, jnp.zeros((3, 2))),
        rewards=jnp.zeros((3, 2)),
        done=jnp.zeros((3, 2), bool),
        truncated=jnp.zeros((3, 2), bool),
        next_obs=jnp.zeros((3, 2, 1)),
        metrics={"env": {}, "net": {}},
    )
    metrics = compute_metrics({}, transitions, LoggingLevel.ACTOR_EXTRA)
    assert metrics["policy/entropy"] == pytest.approx(3.5)


def test_weight_statistics_follow_the_logging_percentiles():
    from flax import nnx

    from nnx_ppo.algorithms.metrics import log_weight_stats

    layer = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    pooled = np.concatenate([np.ravel(layer.kernel[...]), np.ravel(layer.bias[...])])
    metrics: dict = {}
    log_weight_stats(metrics, layer, (0, 50, 100))
    assert metrics.keys() == {"weights/p0", "weights/p50", "weights/p100"}
    np.testing.assert_allclose(
        [metrics["weights/p0"], metrics["weights/p50"], metrics["weights/p100"]],
        np.percentile(pooled, [0, 50, 100]),
        rtol=1e-6,
    )


def test_no_percentiles_given_as_an_empty_tuple_are_mean_and_std_as_none_is():
    # The configs read () as None; summarize (eval_rollout's, compute_metrics') gave nothing.
    from nnx_ppo.algorithms.metrics import summarize

    values = jnp.arange(4.0)
    for none in (None, ()):
        summary = summarize("x", {"a": values}, none)
        assert summary.keys() == {"x/a/mean", "x/a/std"}
        np.testing.assert_allclose(  # float32 reductions: a few ulps of 1.1
            [summary["x/a/mean"], summary["x/a/std"]], [1.5, np.std([0, 1, 2, 3])], rtol=1e-6
        )


def test_without_evaluation_the_first_record_is_the_first_ppo_steps(counting_env, scripted_network):
    ppo = PPOConfig(n_envs=2, rollout_length=5, n_minibatches=1, n_epochs=1, total_steps=20)
    logged = []
    train_ppo(
        counting_env,
        scripted_network(),
        TrainConfig(ppo=ppo, eval=EvalConfig(enabled=False)),
        log_fn=lambda metrics, step: logged.append(step),
    )
    assert logged == [10, 20]  # no empty record at step 0
