"""The training loop: compiles once, counts exactly, stops on NaN, calls its hooks on time."""

import functools
import logging
import time
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from nnx_ppo import ContractError
from nnx_ppo.algorithms import _step, _train
from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig, VideoConfig
from nnx_ppo.algorithms.ppo import new_training_state, ppo_step, ppo_steps, train_ppo
from nnx_ppo.algorithms.types import LoggingLevel
from nnx_ppo.envs import CartPole, make
from nnx_ppo.networks.adapter import PPOAdapter
from nnx_ppo.networks.containers import Sequential
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.normalizer import Normalizer
from nnx_ppo.networks.recurrent import LSTM
from nnx_ppo.networks.sampling_layers import CategoricalSampler
from nnx_ppo.networks.types import StatefulModuleOutput

N_ENVS, LENGTH = 4, 5
STEP = N_ENVS * LENGTH


def ppo_config(**changes) -> PPOConfig:
    base = {"n_envs": N_ENVS, "rollout_length": LENGTH, "n_minibatches": 2, "n_epochs": 2}
    return PPOConfig(**(base | changes))


def train_config(total_steps: int, eval_every: int | None = None, **ppo_changes) -> TrainConfig:
    evaluation = EvalConfig(
        enabled=eval_every is not None,
        every_steps=eval_every or 1,
        n_envs=3,
        max_episode_length=6,
    )
    return TrainConfig(ppo=ppo_config(total_steps=total_steps, **ppo_changes), eval=evaluation)


@pytest.fixture
def traced_env(counting_env):
    """The counting env, counting how often JAX traces its step."""

    class Traced(type(counting_env)):
        # A list on the class, not a count: training refuses an env whose plain values
        # change while JAX traces it (a counter there counts traces: here, the point).
        traced: ClassVar[list[None]] = []

        @property
        def traces(self) -> int:
            return len(self.traced)

        def step(self, state, action):
            self.traced.append(None)
            return super().step(state, action)

    return Traced()


def test_a_step_draws_fresh_env_states_deal_and_next_key_from_three_distinct_keys(
    counting_env, scripted_network
):
    state = new_training_state(counting_env, scripted_network(), N_ENVS, seed=4)
    keys = _step._step_keys(state.rng_key)
    data = [np.asarray(jax.random.key_data(k)) for k in keys]
    for i, a in enumerate(data):  # fresh env states uncorrelated with the deal
        assert all(not np.array_equal(a, b) for b in data[i + 1 :])
    reset = jax.random.key_data(_step._reset_key(state.rng_key))
    np.testing.assert_array_equal(reset, data[0])
    after, _ = ppo_step(counting_env, state, ppo_config())
    np.testing.assert_array_equal(jax.random.key_data(after.rng_key), data[2])


def test_training_step_compiles_once(traced_env, scripted_network):
    config = ppo_config()
    state = new_training_state(traced_env, scripted_network(), N_ENVS, seed=0)
    state, _ = ppo_step(traced_env, state, config)
    traces = traced_env.traces
    assert traces > 0
    for _ in range(3):
        state, _ = ppo_step(traced_env, state, config)
    assert traced_env.traces == traces
    # A fresh run of the same configuration reuses the compiled step as well.
    train_ppo(traced_env, scripted_network(), train_config(3 * STEP))
    assert traced_env.traces == traces


@pytest.mark.parametrize("iterations_per_call", [1, 3])
def test_a_python_number_parameter_stays_weakly_typed_and_compiles_once(
    traced_env, scripted_network, caplog, iterations_per_call
):
    # The optimizer returned it strongly typed: the second call compiled the learning
    # again, and its bfloat16 product became float32 from then on.
    class PythonNumberScale(scripted_network):
        seen: ClassVar[list[tuple[bool, jnp.dtype]]] = []

        def __init__(self):
            super().__init__()
            self.w = nnx.Param(0.3)

        def __call__(self, state, x, rollout_extras=None) -> StatefulModuleOutput:
            product = self.w[...] * x.astype(jnp.bfloat16)
            self.seen.append((jax.typeof(self.w[...]).weak_type, product.dtype))
            return super().__call__(state, x)

    network = PythonNumberScale()
    total = 2 * iterations_per_call * STEP  # two calls
    config = train_config(total, iterations_per_call=iterations_per_call)
    with caplog.at_level(logging.DEBUG, logger="jax._src.dispatch"):
        result = train_ppo(traced_env, network, config)
    assert result.total_steps == total
    assert float(network.w[...]) != 0.3  # trained
    assert jax.typeof(network.w[...]).weak_type
    assert set(PythonNumberScale.seen) == {(True, jnp.dtype(jnp.bfloat16))}
    compiled = [m for m in (r.getMessage() for r in caplog.records) if "XLA compilation of" in m]
    programs = (
        ["_compiled_learn", "_compiled_collect"] if iterations_per_call == 1 else ["_scan_steps"]
    )
    for program in programs:
        assert sum(f"jit({program})" in m for m in compiled) == 1, (program, compiled)


def test_train_ppo_compiles_its_first_step_once_while_the_reset_compiles(
    traced_env, scripted_network, caplog, monkeypatch
):
    # train_ppo compiles the first PPO step while XLA compiles the reset (abstract
    # env states); the calls must find every program in JAX's caches, and the
    # reset serves the initial state and every step's fresh env states.
    ahead, original = [], _train._compile_ahead

    def compile_ahead(env, state, config, iterations):
        ahead.append(jax.tree.leaves(state.env_states))
        original(env, state, config, iterations)

    monkeypatch.setattr(_train, "_compile_ahead", compile_ahead)
    with caplog.at_level(logging.DEBUG, logger="jax._src.dispatch"):
        result = train_ppo(traced_env, scripted_network(), train_config(2 * STEP))
    [abstract] = ahead
    real = jax.tree.leaves(result.training_state.env_states)
    assert all(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in abstract)
    assert [(a.shape, a.dtype) for a in abstract] == [(r.shape, r.dtype) for r in real]
    messages = [record.getMessage() for record in caplog.records]
    # One step per call runs three programs: the reset, the rollout and the learning.
    for program, count in [
        ("jit(_compiled_reset)", 1),
        ("jit(_compiled_collect)", 1),
        ("jit(_compiled_learn)", 1),
        ("jit(_scan_steps)", 0),
    ]:
        assert sum(f"MLIR module conversion {program}" in m for m in messages) == count, program
        assert sum(f"XLA compilation of {program}" in m for m in messages) == count, program
    assert result.total_steps == 2 * STEP


def test_step_counter_is_exact_beyond_float_precision(counting_env, scripted_network):
    state = new_training_state(counting_env, scripted_network(), N_ENVS, seed=0)
    start = 10**12 + 3
    state, metrics = ppo_step(counting_env, state.replace(steps_taken=start), ppo_config())
    assert state.steps_taken == start + STEP
    assert isinstance(state.steps_taken, int)
    assert metrics["total_steps"] == float(start + STEP)


def test_nan_rewards_stop_training_naming_the_step_and_the_reward(poisoned_env, scripted_network):
    with pytest.raises(FloatingPointError, match=r"env step \d+: the env returned NaN or inf"):
        train_ppo(poisoned_env, scripted_network(), train_config(50 * STEP))


def test_nan_rewards_of_the_eval_env_are_warned_of_with_the_step(counting_env, scripted_network):
    # Training never reads the eval env's rewards: its NaN reached the history silently.
    always_poisoned = type(counting_env)(poison_probability=1.0)
    with pytest.warns(RuntimeWarning) as caught:
        result = train_ppo(
            counting_env, scripted_network(), train_config(STEP, STEP), eval_env=always_poisoned
        )
    said = [str(warning.message).split(": the eval env")[0] for warning in caught]
    assert said == [
        f"the evaluation at step {step} has a mean episode reward of nan" for step in (0, STEP)
    ]
    assert np.isnan(result.eval_history[0]["episode_reward_mean"])


def test_nan_observations_that_diverge_a_step_are_named(counting_env, scripted_network):
    # Reported as a NaN loss before, naming no input.
    class NaNObservationEnv(type(counting_env)):
        """Its observations turn NaN at step 2 of every episode; rewards stay finite."""

        def step(self, state, action):
            stepped = super().step(state, action)
            return stepped.replace(obs=jnp.where(stepped.data["t"] == 2, jnp.nan, stepped.obs))

    env = NaNObservationEnv()
    state = new_training_state(env, scripted_network(), N_ENVS, seed=0)
    # What the network saw is named before what a step reached (a NaN from reset is
    # in obs alone).
    with pytest.raises(FloatingPointError, match=r"NaN or infinite observations \(obs;"):
        ppo_step(env, state, ppo_config(n_epochs=1, n_minibatches=1))


def test_statistics_a_huge_finite_observation_overflows_stop_training_naming_them(
    counting_env, scripted_network
):
    # 3e19 is finite, but its square overflows float32: the Normalizer's M2 became inf,
    # the run went on with that feature normalised to 0, and every checkpoint held it.
    class HugeObservationEnv(type(counting_env)):
        def step(self, state, action):
            stepped = super().step(state, action)
            return stepped.replace(obs=stepped.obs.at[1].set(3e19))

    env = HugeObservationEnv()
    network = Sequential([Normalizer(2), scripted_network()])
    state = new_training_state(env, network, N_ENVS, seed=0)
    with pytest.raises(
        FloatingPointError,
        match=rf"env step {STEP}: running statistics became NaN or infinite in "
        r"update_statistics: \['layers'\]\[0\]\['M2'\]",
    ):
        ppo_step(env, state, ppo_config(n_epochs=1, n_minibatches=1))
    statistics = network.layers[0]
    np.testing.assert_array_equal(statistics.M2[...], np.zeros(2))
    assert float(statistics.counter[...]) == 0.0


def test_a_statistic_infinite_from_the_start_is_not_a_divergence(counting_env, scripted_network):
    # A running maximum starts at -inf on purpose: only a statistic that the step's
    # update_statistics turned non-finite diverged.
    class RunningMax(nnx.Variable):
        pass

    class WithRunningMax(scripted_network):
        def __init__(self):
            super().__init__()
            self.largest = RunningMax(jnp.full((), -jnp.inf))
            self.never_seen = RunningMax(jnp.full((), -jnp.inf))

        def __call__(self, state, x, rollout_extras=None) -> StatefulModuleOutput:
            return super().__call__(state, x).replace(rollout_extras=x[:, 0])

        def update_statistics(self, rollout_extras):
            self.largest[...] = jnp.maximum(self.largest[...], rollout_extras.max())

    network = WithRunningMax()
    state = new_training_state(counting_env, network, N_ENVS, seed=0)
    ppo_step(counting_env, state, ppo_config(n_epochs=1, n_minibatches=1))
    assert np.isfinite(float(network.largest[...]))
    assert float(network.never_seen[...]) == -np.inf


def test_nan_parameters_stop_training_naming_them(counting_env, scripted_network):
    network = scripted_network()
    state = new_training_state(
        counting_env, network, N_ENVS, seed=0, optimizer=optax.sgd(float("inf"))
    )
    config = ppo_config(n_epochs=1, n_minibatches=1)
    with pytest.raises(FloatingPointError, match=rf"env step {STEP}: parameters .*'w'"):
        ppo_step(counting_env, state, config)


def test_replay_at_unchanged_parameters_reproduces_the_rollout(counting_env, scripted_network):
    # With a zero step size every minibatch (a set of whole envs, replayed from the
    # rollout's first carry with resets) must reproduce the rollout's log-likelihoods.
    state = new_training_state(counting_env, scripted_network(), N_ENVS, 0, optimizer=optax.sgd(0))
    config = ppo_config(logging_level=LoggingLevel.ALL)
    for _ in range(3):
        state, metrics = ppo_step(counting_env, state, config)
        assert metrics["losses/approx_kl/mean"] == 0.0
        assert metrics["losses/clipping_fraction/mean"] == 0.0


def test_the_step_returns_from_its_rollout_only_the_metrics_it_logs(counting_env, scripted_network):
    # A rollout compiled as a program of its own (one step per call) computes and stores
    # every metric it returns: a NormalTanhSampler's entropy quadrature took 14% of a
    # Playground rollout while nothing logged it. What a level asks for is still logged.
    class Measured(scripted_network):
        def __call__(self, state, x, rollout_extras=None):
            out = super().__call__(state, x, rollout_extras)
            return out.replace(metrics={"scaled_obs": self.w[...] * x[:, 0]})

    levels = {
        LoggingLevel.LOSSES: set(),
        LoggingLevel.ENV_METRICS: {"env"},
        LoggingLevel.NETWORK_METRICS: {"net"},
        LoggingLevel.ENV_METRICS | LoggingLevel.NETWORK_METRICS: {"env", "net"},
    }
    for level, groups in levels.items():
        config = ppo_config(logging_level=level)
        state = _step._prepared(
            "test", new_training_state(counting_env, Measured(), N_ENVS, 0), config
        )
        collect = functools.partial(
            _step._collect, counting_env, config, state.networks, _step._carry_of(state), None
        )
        collected = jax.eval_shape(collect)
        returned = {
            group for group, tree in collected.transitions.metrics.items() if jax.tree.leaves(tree)
        }
        assert returned == groups, level
    _, metrics = ppo_step(counting_env, state, config)
    assert {"env/t/mean", "net/scaled_obs/mean"} <= set(metrics)
    _, metrics = ppo_step(counting_env, state, ppo_config())
    assert not [name for name in metrics if name.startswith(("env/", "net/"))]


def test_hooks_and_history(counting_env, scripted_network):
    logged, checkpoints = [], []
    config = train_config(6 * STEP, eval_every=2 * STEP)
    config.checkpoint_every_steps = 3 * STEP
    result = train_ppo(
        counting_env,
        scripted_network(),
        config,
        log_fn=lambda metrics, step: logged.append((step, metrics)),
        checkpoint_fn=lambda state, step: checkpoints.append((step, state.steps_taken)),
    )
    assert result.total_steps == 6 * STEP
    assert result.total_iterations == 6
    assert [entry["step"] for entry in result.eval_history] == [0, 2 * STEP, 4 * STEP, 6 * STEP]
    for entry in result.eval_history:
        assert entry["episode_reward_mean"] == entry["eval/episode_reward/mean"]
        assert {"eval/episode_reward/std", "eval/lifespan/mean", "eval/lifespan/p50"} <= set(entry)
    assert checkpoints == [(0, 0), (3 * STEP, 3 * STEP), (6 * STEP, 6 * STEP)]
    assert [step for step, _ in logged] == [0] + [k * STEP for k in range(1, 7)]
    assert [metrics["total_steps"] for _, metrics in logged] == [0] + [
        k * STEP for k in range(1, 7)
    ]
    assert all(isinstance(v, float) for _, metrics in logged for v in metrics.values())
    assert logged[-1][1] == result.final_metrics
    assert "losses/actor/mean" in result.final_metrics


def test_resume_continues_counting(counting_env, scripted_network):
    first = train_ppo(counting_env, scripted_network(), train_config(2 * STEP))
    second = train_ppo(
        counting_env,
        first.training_state.networks,
        train_config(5 * STEP),
        initial_state=first.training_state,
    )
    assert second.total_steps == 5 * STEP
    assert second.total_iterations == 3


def test_a_seed_keys_the_run_as_jax_random_key_does_and_seeds_share_one_start_program(
    counting_env, scripted_network
):
    network = scripted_network()
    programs = _train._compiled_start._jitted._cache_size
    for seed in (5, -3, 2**40 + 7, np.int64(-9), jnp.int32(11)):
        state = new_training_state(counting_env, network, N_ENVS, seed=seed)
        expected = jax.random.split(jax.random.key(seed), 3)[1]
        np.testing.assert_array_equal(
            jax.random.key_data(state.rng_key), jax.random.key_data(expected)
        )
    before = programs()
    for seed in (0, 1, -(2**33), 2**62):  # Python ints of any size and sign
        new_training_state(counting_env, network, N_ENVS, seed=seed)
    assert programs() == before


def test_kl_early_stop_ends_the_epoch_loop(counting_env, scripted_network):
    config = ppo_config(n_epochs=4, learning_rate=1e-2, logging_level=LoggingLevel.ACTOR_EXTRA)
    state = new_training_state(counting_env, scripted_network(), N_ENVS, seed=0)
    _, metrics = ppo_step(counting_env, state, config)
    assert metrics["losses/epochs_completed"] == 4.0
    state = new_training_state(counting_env, scripted_network(), N_ENVS, seed=0)
    stopped = ppo_config(
        n_epochs=4, learning_rate=1e-2, target_kl=1e-9, logging_level=config.logging_level
    )
    _, metrics = ppo_step(counting_env, state, stopped)
    assert metrics["losses/epochs_completed"] == 1.0
    assert np.isfinite(metrics["losses/approx_kl/mean"])


def parameters(network) -> list[np.ndarray]:
    return [np.asarray(p) for p in jax.tree.leaves(nnx.state(network, nnx.Param))]


def test_learning_rate_schedule_and_throughput(counting_env, scripted_network):
    # The step size drops to 0 after the first minibatch update: only that update moves
    # the parameters, so two PPO steps end where one did.
    schedule = optax.piecewise_constant_schedule(1e-2, {1: 0.0})
    config = train_config(2 * STEP, learning_rate=schedule, logging_level=LoggingLevel.THROUGHPUT)
    network = scripted_network()
    initial = parameters(network)
    result = train_ppo(counting_env, network, config)
    assert result.final_metrics["throughput/train_sps"] > 0
    assert int(result.training_state.optimizer.step[...]) == 2 * 2 * 2  # steps * epochs * mbs
    one_step = train_ppo(
        counting_env, scripted_network(), train_config(STEP, learning_rate=schedule)
    )
    after_one = parameters(one_step.training_state.networks)
    assert all(not np.array_equal(a, b) for a, b in zip(after_one, initial, strict=True))
    for after_two, expected in zip(parameters(network), after_one, strict=True):
        np.testing.assert_array_equal(after_two, expected)


def test_statistics_are_folded_once_per_step_with_the_whole_rollout(counting_env, scripted_network):
    class Counter(nnx.Variable):
        pass

    class WithStatistics(scripted_network):
        def __init__(self):
            super().__init__()
            self.calls = Counter(jnp.zeros((), jnp.int32))
            self.seen = Counter(jnp.zeros((), jnp.int32))

        def __call__(self, state, x, rollout_extras=None) -> StatefulModuleOutput:
            return super().__call__(state, x).replace(rollout_extras=x[:, 0])

        def update_statistics(self, rollout_extras):
            self.calls[...] += 1
            self.seen[...] += rollout_extras.size

    network = WithStatistics()
    train_ppo(counting_env, network, train_config(3 * STEP))
    assert int(network.calls[...]) == 3
    assert int(network.seen[...]) == 3 * STEP


def test_config_and_state_must_agree_on_the_number_of_envs(counting_env, scripted_network):
    state = new_training_state(counting_env, scripted_network(), 2, seed=0)
    with pytest.raises(ValueError, match=r"holds 2 envs, but config\.n_envs is 4"):
        ppo_step(counting_env, state, ppo_config())


def test_a_config_field_changed_after_construction_is_checked_by_ppo_step(
    counting_env, scripted_network
):
    config = ppo_config()
    state = new_training_state(counting_env, scripted_network(), config.n_envs, seed=0)
    config.clip_range = -1.0
    with pytest.raises(ValueError, match="clip_range must be > 0"):
        ppo_step(counting_env, state, config)


def test_recurrent_sampling_policy_replays_its_rollout_exactly():
    # An LSTM policy whose sampler draws from per-env keys in carry, on episodes that
    # end mid-rollout: replaying minibatches of envs at unchanged parameters scores
    # the stored actions with the rollout's own log-likelihoods.
    env = make("memory")
    rngs = nnx.Rngs(0)
    network = Sequential(
        [
            Normalizer(env.observation_size),
            LSTM(env.observation_size, 8, rngs),
            PPOAdapter(
                action=Sequential([Dense(8, 2, rngs), CategoricalSampler(rngs, 0.01)]),
                value=Dense(8, 1, rngs),
            ),
        ]
    )
    state = new_training_state(env, network, 4, seed=0, optimizer=optax.sgd(0.0))
    config = ppo_config(rollout_length=9, logging_level=LoggingLevel.ALL)
    for _ in range(2):
        state, metrics = ppo_step(env, state, config)
        assert metrics["rollout_batch/done_rate"] > 0
        assert metrics["losses/approx_kl/mean"] < 1e-6
        assert metrics["losses/clipping_fraction/mean"] == 0.0


def test_a_sampler_left_in_eval_mode_is_refused_before_training():
    env = make("cartpole")
    rngs = nnx.Rngs(0)
    network = PPOAdapter(
        action=Sequential([Dense(4, 2, rngs), CategoricalSampler(rngs, 0.01)]),
        value=Dense(4, 1, rngs),
    )
    network.eval()
    with pytest.raises(ValueError, match=r"components\['action'\].layers\[1\] is a Categorical"):
        new_training_state(env, network, 2, seed=0)
    network.train()
    new_training_state(env, network, 2, seed=0)


def test_video_records_a_deterministic_episode(counting_env, scripted_network):
    class Rendered(type(counting_env)):
        def render(self, trajectory, height, width):
            return [np.full((height, width, 3), s.data["t"], np.uint8) for s in trajectory]

    videos = []
    config = train_config(2 * STEP)
    config.video = VideoConfig(enabled=True, every_steps=STEP, episode_length=6)
    config.video.render_kwargs = {"height": 2, "width": 3}
    train_ppo(Rendered(), scripted_network(), config, video_fn=videos.append)
    assert [video.step for video in videos] == [0, STEP, 2 * STEP]
    video = videos[0]
    assert video.frames.shape == (7, 2, 3, 3) and video.frames.dtype == np.uint8
    # Frame k shows the step counter: 0, 1, ... up to the episode's horizon, then 0 again.
    counters = video.frames[:, 0, 0, 0].tolist()
    horizon = counters.index(0, 1)
    assert counters[:horizon] == list(range(horizon))
    assert video.episode_reward == sum(range(1, horizon + 1))
    assert video.episode_length == 6


def test_a_cadence_of_0_acts_at_step_0_only_and_turns_checkpoints_off(
    counting_env, scripted_network
):
    """0.3.0's meaning of 0: evaluations and videos at the start only, no checkpoint."""

    class Rendered(type(counting_env)):
        def render(self, trajectory, height, width):
            return [np.zeros((height, width, 3), np.uint8) for _ in trajectory]

    config = train_config(3 * STEP, eval_every=STEP, logging_level=LoggingLevel.THROUGHPUT)
    config.eval.every_steps = 0
    config.video = VideoConfig(enabled=True, every_steps=0, episode_length=2)
    config.video.render_kwargs = {"height": 1, "width": 1}
    config.checkpoint_every_steps = 0
    logged, videos, checkpoints = [], [], []
    result = train_ppo(
        Rendered(),
        scripted_network(),
        config,
        log_fn=lambda metrics, step: logged.append((step, metrics)),
        video_fn=videos.append,
        checkpoint_fn=lambda state, step: checkpoints.append(step),
    )
    assert result.total_steps == 3 * STEP
    assert [entry["step"] for entry in result.eval_history] == [0]
    assert [video.step for video in videos] == [0]
    assert checkpoints == []
    # 0.3.0's video throughput, logged with the step that recorded
    assert [step for step, metrics in logged if "throughput/video_sps" in metrics] == [0]
    assert all(metrics["throughput/video_sps"] > 0 for _, metrics in logged[:1])


def test_a_video_without_render_is_refused_before_anything_compiles(
    counting_env, scripted_network, monkeypatch
):
    from nnx_ppo.algorithms import _train

    def compiles(*args, **kwargs):
        raise AssertionError("the start program was built before the render check")

    monkeypatch.setattr(_train, "_new_training_state", compiles)
    config = train_config(STEP)
    config.video = VideoConfig(enabled=True, episode_length=2)
    with pytest.raises(TypeError, match="train_ppo: video needs an eval env with render"):
        train_ppo(counting_env, scripted_network(), config, video_fn=print)


@pytest.mark.parametrize(
    ("frames", "error", "message"),
    [
        (lambda n: [np.zeros((1, 1, 3), np.uint8)], ValueError, "returned 1 frames for the 3"),
        (lambda n: [np.zeros((1, 1, 3), np.float32)] * n, TypeError, "must return uint8 frames"),
        (lambda n: [np.zeros((1, 1), np.uint8)] * n, ValueError, "one .height, width, chann"),
        (lambda n: None, TypeError, "must return a sequence of frames .*, got NoneType"),
        (lambda n: [], ValueError, "returned 0 frames for the 3"),
        (lambda n: jnp.zeros((4, 4, 3), jnp.uint8), ValueError, r"one array of shape \(4, 4, 3\)"),
    ],
)
def test_frames_render_gets_wrong_are_named(counting_env, scripted_network, frames, error, message):
    class Rendered(type(counting_env)):
        def render(self, trajectory, **size):
            return frames(len(trajectory))

    config = train_config(STEP)
    config.video = VideoConfig(enabled=True, episode_length=2)
    with pytest.raises(error, match=message):
        train_ppo(Rendered(), scripted_network(), config, video_fn=print)


def test_frames_may_come_as_one_jax_or_numpy_array(counting_env, scripted_network):
    class Rendered(type(counting_env)):
        def render(self, trajectory, **size):
            return jnp.full((len(trajectory), 2, 2, 3), 7, jnp.uint8)

    videos = []
    config = train_config(STEP)
    config.video = VideoConfig(enabled=True, episode_length=2)
    train_ppo(Rendered(), scripted_network(), config, video_fn=videos.append)
    assert videos[0].frames.shape == (3, 2, 2, 3) and (videos[0].frames == 7).all()


def test_should_stop_must_answer_a_bool(counting_env, scripted_network):
    with pytest.raises(TypeError, match="should_stop must return a bool, got str 'no'"):
        train_ppo(counting_env, scripted_network(), train_config(STEP), should_stop=lambda: "no")


def test_a_video_asked_for_by_only_the_config_or_only_a_video_fn_is_warned_of(
    counting_env, scripted_network
):
    config = train_config(STEP)
    with pytest.warns(UserWarning, match="video_fn is given but config.video.enabled is False"):
        train_ppo(counting_env, scripted_network(), config, video_fn=print)
    config.video = VideoConfig(enabled=True)
    with pytest.warns(UserWarning, match="config.video.enabled is True but no video_fn"):
        train_ppo(counting_env, scripted_network(), config)


def test_config_types_are_checked(counting_env, scripted_network):
    with pytest.raises(TypeError, match=r"wrap a PPOConfig as TrainConfig\(ppo=\.\.\.\)"):
        train_ppo(counting_env, scripted_network(), ppo_config())  # type: ignore[arg-type]


def test_arguments_of_the_wrong_type_are_named(counting_env, scripted_network):
    network = scripted_network()
    with pytest.raises(TypeError, match="ppo_step: training_state must be a TrainingState"):
        ppo_step(counting_env, network, ppo_config())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="train_ppo: initial_state must be a TrainingState"):
        train_ppo(counting_env, network, train_config(STEP), initial_state={})  # type: ignore
    with pytest.raises(TypeError, match="new_training_state: networks must be a StatefulModule"):
        new_training_state(counting_env, "x", N_ENVS, seed=0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="new_training_state: seed must be an int"):
        new_training_state(counting_env, network, N_ENVS, seed="a")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="new_training_state: seed must be an int"):
        new_training_state(counting_env, network, N_ENVS, seed=jnp.ones(2, jnp.int32))
    with pytest.raises(TypeError, match="new_training_state: seed must be an int"):
        new_training_state(counting_env, network, N_ENVS, seed=1.5)  # type: ignore[arg-type]
    # Refused before anything compiles: a bad callback failed only after step 0 had run.
    with pytest.raises(TypeError, match="train_ppo: log_fn must be a function or None, got int"):
        train_ppo(counting_env, network, train_config(STEP), log_fn=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"log_fn is called as log_fn\(metrics, step\), but "):
        train_ppo(counting_env, network, train_config(STEP), log_fn=lambda metrics: None)
    with pytest.raises(TypeError, match=r"should_stop is called as should_stop\(\), but"):
        train_ppo(counting_env, network, train_config(STEP), should_stop=lambda step: False)
    # What is called is the wrapper: one that supplies an argument (functools.wraps keeps
    # the inner function's signature) is a log_fn(metrics, step).
    from nnx_ppo.contract.arguments import require_callable

    def log_to(prefix: str, metrics: dict, step: int) -> None: ...

    @functools.wraps(log_to)
    def log_fn(metrics: dict, step: int) -> None:
        log_to("train", metrics, step)

    require_callable("train_ppo", "log_fn", log_fn, ("metrics", "step"))
    with pytest.raises(TypeError, match="checkpoint_fn must be a function or None, got str"):
        train_ppo(counting_env, network, train_config(STEP), checkpoint_fn="runs/x")  # type: ignore
    with pytest.raises(TypeError, match=r"env is the name 'cartpole', .* nnx_ppo.envs.make"):
        train_ppo("cartpole", network, train_config(STEP))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"train_ppo: eval_env is the class CartPole"):
        train_ppo(counting_env, network, train_config(STEP), eval_env=CartPole)  # type: ignore
    with pytest.raises(TypeError, match="a dict has no reset and no step method"):
        new_training_state({}, network, N_ENVS, seed=0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"env is the class CartPole, .* e.g. CartPole\(\)"):
        train_ppo(CartPole, network, train_config(STEP))  # type: ignore[arg-type]
    # A class of static methods is an env: it is not refused as a class.
    from nnx_ppo.contract.env_checks import require_env

    class StaticEnv:
        reset = staticmethod(counting_env.reset)
        step = staticmethod(counting_env.step)

    require_env("train_ppo", StaticEnv)


@pytest.mark.parametrize(
    ("settings", "error", "message"),
    [
        ({"learning_rate": -0.01}, ValueError, r"learning_rate must be >= 0.0, got -0.01"),
        ({"gradient_clipping": -1.0}, ValueError, r"gradient_clipping must be > 0.0"),
        ({"weight_decay": "0.01"}, TypeError, r"weight_decay must be a finite number, got str"),
    ],
)
def test_optimizer_settings_are_checked_as_the_config_checks_them(
    counting_env, scripted_network, settings, error, message
):
    # A negative rate would be gradient ascent, a negative clipping norm a flipped gradient.
    with pytest.raises(error, match=f"new_training_state: {message}"):
        new_training_state(counting_env, scripted_network(), N_ENVS, seed=0, **settings)


def test_seed_may_be_an_integer_array(counting_env, scripted_network):
    from_int = new_training_state(counting_env, scripted_network(), N_ENVS, seed=7)
    from_array = new_training_state(counting_env, scripted_network(), N_ENVS, seed=jnp.asarray(7))
    np.testing.assert_array_equal(
        jax.random.key_data(from_array.rng_key), jax.random.key_data(from_int.rng_key)
    )
    np.testing.assert_array_equal(
        from_array.env_states.data["horizon"], from_int.env_states.data["horizon"]
    )


def test_unbatched_env_states_are_named(counting_env, scripted_network):
    state = new_training_state(counting_env, scripted_network(), N_ENVS, seed=0)
    state = state.replace(env_states=counting_env.reset(jax.random.key(0)))
    with pytest.raises(ContractError, match="ppo_step: env_state must be batched"):
        ppo_step(counting_env, state, ppo_config())


@pytest.mark.parametrize("deterministic", [False, True])
def test_evaluation_restores_the_mode_the_network_was_in(
    counting_env, scripted_network, deterministic
):
    seen = []

    class WithMode(scripted_network):
        """Records in ``seen`` the mode ``eval()``/``train()`` set, each time JAX traces a call."""

        def __init__(self) -> None:
            super().__init__()
            self.deterministic = False

        def __call__(self, state, x, rollout_extras=None) -> StatefulModuleOutput:
            seen.append(self.deterministic)
            return super().__call__(state, x, rollout_extras)

    network = WithMode()
    if deterministic:
        network.eval()
    train_ppo(counting_env, network, train_config(STEP, eval_every=STEP))
    assert True in seen  # the evaluation ran in eval mode
    assert network.deterministic is deterministic


def test_several_steps_per_call_give_the_steps_one_by_one(traced_env, scripted_network):
    def run(iterations_per_call: int) -> tuple[list[float], list[tuple[int, float]], list[int]]:
        logged: list[tuple[int, float]] = []
        config = train_config(
            12 * STEP,
            eval_every=5 * STEP,
            iterations_per_call=iterations_per_call,
            logging_level=LoggingLevel.LOSSES | LoggingLevel.ROLLOUT_STATS,
        )
        network = scripted_network()
        result = train_ppo(
            traced_env,
            network,
            config,
            log_fn=lambda metrics, step: logged.append(
                (step, metrics.get("losses/total/mean", 0.0))
            ),
        )
        params = [float(leaf) for leaf in jax.tree.leaves(nnx.state(network, nnx.Param))]
        return params, logged, [entry["step"] for entry in result.eval_history]

    one_by_one, fused = run(1), run(4)
    np.testing.assert_allclose(fused[0], one_by_one[0], rtol=1e-6)
    assert [step for step, _ in fused[1]] == [step for step, _ in one_by_one[1]]
    np.testing.assert_allclose([v for _, v in fused[1]], [v for _, v in one_by_one[1]], rtol=1e-6)
    assert fused[2] == one_by_one[2] == [0, 5 * STEP, 10 * STEP]


def test_throughput_is_a_calls_steps_over_the_seconds_it_ran_whatever_the_host_did_meanwhile(
    counting_env, scripted_network
):
    # Each env step waits SLEEP seconds on the host, so a call of 2 PPO steps runs at
    # least 2 * LENGTH * SLEEP seconds, and little more: the counting env and the
    # scripted network cost next to nothing. The host's logging takes longer than a
    # call, so a call dispatched ahead runs while the host logs; and a program that
    # calls back to the host runs inside its dispatch. Neither moves a call's seconds.
    sleep = 0.01
    call_seconds = 2 * LENGTH * sleep

    class Sleeping(type(counting_env)):
        def step(self, state, action):
            stepped = super().step(state, action)

            def wait(t):
                time.sleep(sleep)
                return np.asarray(t)

            shape = jax.ShapeDtypeStruct(stepped.obs.shape, stepped.obs.dtype)
            obs = jax.pure_callback(wait, shape, stepped.obs, vmap_method="expand_dims")
            return stepped.replace(obs=obs)

    logged: list[tuple[int, float]] = []

    def log_fn(metrics, step):
        logged.append((step, metrics["throughput/train_sps"]))
        time.sleep(3 * call_seconds)

    config = train_config(8 * STEP, iterations_per_call=2, logging_level=LoggingLevel.THROUGHPUT)
    train_ppo(Sleeping(), scripted_network(), config, log_fn=log_fn)
    assert [step for step, _ in logged] == [STEP * (i + 1) for i in range(8)]
    seconds = [2 * STEP / rate for _, rate in logged]
    assert seconds[0::2] == seconds[1::2]  # both steps of a call log the call's rate
    assert all(s >= call_seconds for s in seconds), seconds
    # The first call may compile; none of the others takes the next call's time too.
    assert all(s < 1.8 * call_seconds for s in seconds[2:]), seconds


def test_one_step_calls_restart_episodes_where_a_step_resetting_inside_would(
    counting_env, scripted_network
):
    # One step per call takes the states ended episodes restart from out of a reset
    # program of their own; several steps per call reset inside their program. The
    # counting env draws each episode's horizon (2 to 4 steps) at reset, so over 15
    # steps every env restarts at least 3 times, and any other key shows.
    config = ppo_config()
    one_by_one = new_training_state(counting_env, scripted_network(), N_ENVS, seed=3)
    fused = new_training_state(counting_env, scripted_network(), N_ENVS, seed=3)
    for _ in range(3):
        one_by_one, _ = ppo_step(counting_env, one_by_one, config)
    fused, _ = ppo_steps(counting_env, fused, config, 3)
    for ours, theirs in zip(
        jax.tree.leaves((one_by_one.env_states, one_by_one.running_episodes)),
        jax.tree.leaves((fused.env_states, fused.running_episodes)),
        strict=True,
    ):
        np.testing.assert_array_equal(ours, theirs)


def test_ppo_steps_names_a_bad_iteration_count(counting_env, scripted_network):
    from nnx_ppo.algorithms.ppo import ppo_steps

    state = new_training_state(counting_env, scripted_network(), N_ENVS, seed=0)
    with pytest.raises(ValueError, match="ppo_steps: iterations must be a positive int"):
        ppo_steps(counting_env, state, ppo_config(), 0)
