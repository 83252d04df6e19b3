"""What the training loop promises when things go wrong, and the numbers it reports.

Divergence leaves the caller's network as it was and names the step that failed;
the run seed seeds the policy's noise; a resumed state continues its cadence
without logging a step twice; metrics mean what their names say.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from nnx_ppo.algorithms import _step, _train
from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.ppo import new_training_state, ppo_step, ppo_steps, train_ppo
from nnx_ppo.algorithms.rollout import _initial_carry, eval_rollout
from nnx_ppo.algorithms.types import LoggingLevel
from nnx_ppo.envs import make
from nnx_ppo.networks.factories import make_default_network
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput
from nnx_ppo.networks.utils import new_env_keys, split_env_keys

N_ENVS, LENGTH = 4, 5
STEP = N_ENVS * LENGTH
UPDATES_PER_STEP = 2 * 2  # epochs * minibatches


def ppo_config(**changes) -> PPOConfig:
    base = {"n_envs": N_ENVS, "rollout_length": LENGTH, "n_minibatches": 2, "n_epochs": 2}
    return PPOConfig(**(base | changes))


def train_config(total_steps: int, eval_every: int | None = None, **ppo_changes) -> TrainConfig:
    evaluation = EvalConfig(
        enabled=eval_every is not None, every_steps=eval_every or 1, n_envs=3, max_episode_length=6
    )
    return TrainConfig(ppo=ppo_config(total_steps=total_steps, **ppo_changes), eval=evaluation)


def parameters(network: nnx.Module) -> list[np.ndarray]:
    return [np.asarray(leaf) for leaf in jax.tree.leaves(nnx.state(network, nnx.Param))]


def assert_same_parameters(network: nnx.Module, reference: nnx.Module) -> None:
    for now, then in zip(parameters(network), parameters(reference), strict=True):
        np.testing.assert_array_equal(now, then)


def train_fresh(env, scripted_network, total_steps: int, **hooks):
    """``train_ppo`` from a fresh seed-0 state; the state's network is trained in place."""
    state = new_training_state(env, scripted_network(), N_ENVS, seed=0)
    config = train_config(total_steps)
    return state, train_ppo(env, state.networks, config, initial_state=state, **hooks)


# ---------------------------------------------------------------------------- divergence


def test_divergence_leaves_the_callers_network_and_optimizer_as_they_were(
    counting_env, scripted_network
):
    network = scripted_network()
    state = new_training_state(
        counting_env, network, N_ENVS, seed=0, optimizer=optax.sgd(float("inf"))
    )
    before = parameters(network)
    optimizer_step = int(state.optimizer.step[...])
    with pytest.raises(FloatingPointError, match="left as they were before the call"):
        ppo_step(counting_env, state, ppo_config(n_epochs=1, n_minibatches=1))
    for now, then in zip(parameters(network), before, strict=True):
        np.testing.assert_array_equal(now, then)
    assert int(state.optimizer.step[...]) == optimizer_step


def _diverging_at_the_second_step(env, scripted_network):
    """A fresh state whose step size becomes infinite at the second PPO step's first update."""

    def schedule(count):
        return jnp.where(count < UPDATES_PER_STEP, 1e-3, jnp.inf)

    return new_training_state(
        env, scripted_network(), N_ENVS, seed=0, optimizer=optax.sgd(schedule)
    )


def test_divergence_in_a_fused_call_names_the_step_that_failed(counting_env, scripted_network):
    state = _diverging_at_the_second_step(counting_env, scripted_network)
    network = state.networks
    before = parameters(network)
    with pytest.raises(FloatingPointError, match=rf"env step {2 * STEP}: "):
        ppo_steps(counting_env, state, ppo_config(), 3)
    for now, then in zip(parameters(network), before, strict=True):
        np.testing.assert_array_equal(now, then)


def test_train_ppo_keeps_the_last_good_step_when_a_later_one_diverges(
    counting_env, scripted_network
):
    # train_ppo dispatches a call's steps before it fetches the last call's: step 3 is
    # already running when step 2's divergence is seen. Neither reaches the network.
    state = _diverging_at_the_second_step(counting_env, scripted_network)
    reference, _ = ppo_step(
        counting_env, _diverging_at_the_second_step(counting_env, scripted_network), ppo_config()
    )
    with pytest.raises(FloatingPointError, match=rf"env step {2 * STEP}: "):
        train_ppo(counting_env, state.networks, train_config(4 * STEP), initial_state=state)
    assert_same_parameters(state.networks, reference.networks)


def test_train_ppo_runs_the_steps_ppo_step_runs(counting_env, scripted_network):
    logged = []
    state, result = train_fresh(
        counting_env,
        scripted_network,
        3 * STEP,
        log_fn=lambda metrics, step: logged.append(metrics),
    )
    reference = new_training_state(counting_env, scripted_network(), N_ENVS, seed=0)
    expected = []
    for _ in range(3):
        reference, metrics = ppo_step(counting_env, reference, ppo_config())
        expected.append(metrics)
    assert logged == expected
    assert result.total_steps == reference.steps_taken == 3 * STEP
    assert_same_parameters(state.networks, reference.networks)


def test_stopping_drops_the_steps_already_dispatched(counting_env, scripted_network):
    state, result = train_fresh(counting_env, scripted_network, 4 * STEP, should_stop=lambda: True)
    reference, _ = ppo_step(
        counting_env,
        new_training_state(counting_env, scripted_network(), N_ENVS, seed=0),
        ppo_config(),
    )
    assert result.total_steps == result.training_state.steps_taken == STEP
    assert result.total_iterations == 1
    assert_same_parameters(state.networks, reference.networks)
    np.testing.assert_array_equal(
        jax.random.key_data(result.training_state.rng_key), jax.random.key_data(reference.rng_key)
    )


# ---------------------------------------------------------------------------------- seed


def _carry_keys(seed: int) -> np.ndarray:
    env = make("cartpole")
    network = make_default_network(env, nnx.Rngs(0), hidden_sizes=[8])
    state = new_training_state(env, network, N_ENVS, seed=seed)
    keys = [
        leaf
        for leaf in jax.tree.leaves(state.network_states)
        if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key)
    ]
    assert keys, "the default network's sampler keeps per-env keys in its carry"
    return np.concatenate([np.asarray(jax.random.key_data(k)).ravel() for k in keys])


def test_the_run_seed_seeds_the_policys_noise():
    # One network construction (nnx.Rngs(0)), two run seeds: different action noise.
    assert not np.array_equal(_carry_keys(1), _carry_keys(2))
    np.testing.assert_array_equal(_carry_keys(1), _carry_keys(1))


class _EpisodeNoise(StatefulModule):
    """Noise drawn once per episode from the carry's per-env keys, not at every step."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        self.rngs = rngs

    def initialize_state(self, batch_size: int) -> dict:
        return self._drawn(new_env_keys(self.rngs, batch_size))

    def reset_state(self, prev_state: dict) -> dict:
        return self._drawn(split_env_keys(prev_state["key"])[0])

    @staticmethod
    def _drawn(keys: jax.Array) -> dict:
        return {"key": keys, "noise": jax.vmap(lambda key: jax.random.normal(key, ()))(keys)}

    def __call__(self, state, x, rollout_extras=None) -> StatefulModuleOutput:
        return StatefulModuleOutput(state, x + state["noise"][:, None], jnp.zeros(()), {}, None)


def test_the_run_seed_and_the_evaluation_key_reach_what_initialize_state_draws():
    def noise(carry: dict) -> np.ndarray:
        return np.asarray(carry["noise"])

    env, network = make("cartpole"), _EpisodeNoise(nnx.Rngs(0))
    first, second, again = (
        new_training_state(env, network, N_ENVS, seed=seed).network_states for seed in (1, 2, 1)
    )
    assert not np.array_equal(noise(first), noise(second))  # the first episode's too
    np.testing.assert_array_equal(noise(first), noise(again))
    # Each evaluation's episodes draw theirs from the evaluation's key.
    one, other = (_initial_carry(network, 3, jax.random.key(k)) for k in (1, 2))
    assert not np.array_equal(noise(one), noise(other))
    np.testing.assert_array_equal(noise(one), noise(_initial_carry(network, 3, jax.random.key(1))))


def test_one_seed_gives_identical_runs():
    def run() -> list[np.ndarray]:
        env = make("cartpole")
        network = make_default_network(env, nnx.Rngs(0), hidden_sizes=[8])
        train_ppo(env, network, train_config(2 * STEP), seed=5)
        return parameters(network)

    # Same program, same machine: bit for bit is what resuming and reruns promise.
    for a, b in zip(run(), run(), strict=True):
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------------------- resume


def test_a_resumed_state_must_train_its_own_network(counting_env, scripted_network):
    first = train_ppo(counting_env, scripted_network(), train_config(STEP))
    with pytest.raises(ValueError, match=r"networks is not initial_state\.networks"):
        train_ppo(
            counting_env,
            scripted_network(),
            train_config(2 * STEP),
            initial_state=first.training_state,
        )


def test_resuming_neither_evaluates_nor_logs_its_first_step_again(counting_env, scripted_network):
    first = train_ppo(counting_env, scripted_network(), train_config(2 * STEP, eval_every=2 * STEP))
    events: list[tuple[str, int]] = []
    config = train_config(4 * STEP, eval_every=2 * STEP)
    config.checkpoint_every_steps = 2 * STEP
    second = train_ppo(
        counting_env,
        first.training_state.networks,
        config,
        initial_state=first.training_state,
        log_fn=lambda metrics, step: events.append(("log", step)),
        checkpoint_fn=lambda state, step: events.append(("checkpoint", step)),
    )
    assert [entry["step"] for entry in second.eval_history] == [4 * STEP]
    # Every checkpointed step has been logged before its checkpoint was written.
    assert events == [("log", 3 * STEP), ("log", 4 * STEP), ("checkpoint", 4 * STEP)]


# ------------------------------------------------------------------------------ metrics


class FlaggingEnv:
    """The counting env with a boolean metric that is true at every step."""

    def __init__(self, env) -> None:
        self.env = env
        self.discrete_actions, self.observation_size = False, env.observation_size
        self.action_size = env.action_size

    def reset(self, key):
        state = self.env.reset(key)
        return state.replace(metrics=state.metrics | {"flag": jnp.asarray(True)})

    def step(self, state, action):
        stepped = self.env.step(state.replace(metrics={"t": state.metrics["t"]}), action)
        return stepped.replace(metrics=stepped.metrics | {"flag": jnp.asarray(True)})


def test_boolean_env_metrics_are_averaged_over_the_episode(counting_env, scripted_network):
    metrics = eval_rollout(
        FlaggingEnv(counting_env),
        scripted_network(),
        8,
        6,
        jax.random.key(0),
        logging_level=LoggingLevel.ENV_METRICS,
    )
    # True at every step of every episode: its per-episode average is 1, not 1 / length.
    assert float(metrics["eval/env/flag/mean"]) == 1.0
    assert float(metrics["eval/lifespan/mean"]) > 1.0


def test_optax_default_decay_and_a_decay_of_one_are_different_optimizers():
    default, one = (_train._default_optimizer(1e-3, None, decay) for decay in (True, 1))
    assert default is not one
    assert one is _train._default_optimizer(1e-3, None, 1)  # one setting, one compiled step
    params = {"w": jnp.ones(())}
    grads = {"w": jnp.zeros(())}
    step_default = default.update(grads, default.init(params), params)[0]["w"]
    step_one = one.update(grads, one.init(params), params)[0]["w"]
    np.testing.assert_allclose(step_default, -1e-3 * 1e-4, rtol=1e-5)  # optax's default decay
    np.testing.assert_allclose(step_one, -1e-3, rtol=1e-5)


def test_unused_checkpoint_and_video_cadences_do_not_stop_fusion(
    counting_env, scripted_network, monkeypatch
):
    calls: list[int] = []

    def counted(dispatch):
        def dispatch_counted(*arguments):
            calls.append(arguments[-1])
            return dispatch(*arguments)

        return dispatch_counted

    monkeypatch.setattr(_train, "dispatch_steps", counted(_train.dispatch_steps))
    monkeypatch.setattr(_train, "dispatch_next", counted(_train.dispatch_next))
    config = train_config(8 * STEP, iterations_per_call=4)
    config.checkpoint_every_steps = STEP
    config.video.enabled, config.video.every_steps = True, STEP
    with pytest.warns(UserWarning, match="no video_fn is given"):
        train_ppo(counting_env, scripted_network(), config)  # no checkpoint_fn, no video_fn
    assert calls == [4, 4]


def _stacked_reports(
    loss_finite,
    parameters_finite,
    rewards_finite=(True,) * 3,
    observations_finite=(True,) * 3,
    statistics_finite=(True,) * 3,
):
    """Three steps' host reports: two metrics, each step's observation, reward, loss,
    parameter and statistics health."""
    return _step.StepReport(
        metrics={
            "losses/total": np.array([0.5, 0.25, 0.125], np.float32),
            "losses/epochs_completed": np.array([2, 2, 1], np.int32),
        },
        episodes={},
        health={
            "loss_finite": np.array(loss_finite).reshape(3, 2, 2),
            "parameters_finite": {"['w']": np.array(parameters_finite)},
            "statistics_finite": {"['M2']": np.array(statistics_finite)},
            "rewards_finite": {"['agent_1']": np.array(rewards_finite)},
            "observations_finite": {"next_obs['pos']": np.array(observations_finite)},
        },
    )


def test_host_metrics_give_each_step_its_own_values():
    healthy = _stacked_reports([True] * 12, [True] * 3)
    per_step = _step._host_metrics(healthy, 100, ppo_config(), 3)
    assert per_step == [
        {"losses/epochs_completed": 2.0, "losses/total": 0.5, "total_steps": 100.0 + STEP},
        {"losses/epochs_completed": 2.0, "losses/total": 0.25, "total_steps": 100.0 + 2 * STEP},
        {"losses/epochs_completed": 1.0, "losses/total": 0.125, "total_steps": 100.0 + 3 * STEP},
    ]
    assert all(type(value) is float for metrics in per_step for value in metrics.values())


def test_host_metrics_name_the_first_step_that_diverged_in_any_way():
    # Step 2's parameters and step 3's loss are not finite: step 2 is named.
    loss_finite = [True] * 8 + [True, False, True, True]
    reports = _stacked_reports(loss_finite, [True, False, False])
    with pytest.raises(FloatingPointError, match=rf"env step {2 * STEP}: parameters .*'w'"):
        _step._host_metrics(reports, 0, ppo_config(), 3)
    reports = _stacked_reports(loss_finite, [True, True, True])
    with pytest.raises(FloatingPointError, match=rf"env step {3 * STEP}: the loss .*minibatch 1"):
        _step._host_metrics(reports, 0, ppo_config(), 3)
    # Non-finite rewards are named as the cause of the step's non-finite loss.
    reports = _stacked_reports(loss_finite, [True, True, True], [True, True, False])
    with pytest.raises(
        FloatingPointError,
        match=rf"env step {3 * STEP}: the env returned NaN .* rewards \(reward\['agent_1'\]\)",
    ):
        _step._host_metrics(reports, 0, ppo_config(), 3)
    # So are non-finite observations, where the step diverged.
    reports = _stacked_reports(loss_finite, [True] * 3, observations_finite=[True, True, False])
    with pytest.raises(
        FloatingPointError,
        match=rf"env step {3 * STEP}: the env returned NaN .* observations \(next_obs\['pos'\];",
    ):
        _step._host_metrics(reports, 0, ppo_config(), 3)
    # Statistics alone (the loss and parameters finite) are a divergence of their own.
    reports = _stacked_reports([True] * 12, [True] * 3, statistics_finite=[True, False, False])
    with pytest.raises(
        FloatingPointError,
        match=rf"env step {2 * STEP}: running statistics became NaN .*: \['M2'\]",
    ):
        _step._host_metrics(reports, 0, ppo_config(), 3)


def test_a_call_that_fails_at_its_dispatch_is_a_runtime_error_not_bad_input() -> None:
    # A host callback that raised surfaced, when JAX raised it at a program's dispatch
    # (the next step's, an evaluation's), as a ValueError("INTERNAL: ..."): the CLI took
    # it for bad input (exit 2). Every training program converts it.
    from nnx_ppo._compile import TrainingProgram

    def failing(x: jax.Array) -> jax.Array:
        raise ValueError("INTERNAL: CpuCallback error calling callback: RuntimeError: no")

    def bad_input(x: jax.Array) -> jax.Array:
        raise ValueError("bad")

    with pytest.raises(jax.errors.JaxRuntimeError, match=r"^INTERNAL: CpuCallback error"):
        TrainingProgram(failing, ())(jnp.zeros(2))
    with pytest.raises(ValueError, match=r"^bad(\n|$)"):  # any other ValueError is left as it is
        TrainingProgram(bad_input, ())(jnp.zeros(2))
