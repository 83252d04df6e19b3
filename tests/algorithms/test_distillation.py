"""Distillation: a frozen teacher's deterministic actions taught to a student of another design."""

import copy
import logging
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from nnx_ppo.algorithms import distillation
from nnx_ppo.algorithms.config import EvalConfig, TrainConfig, VideoConfig
from nnx_ppo.algorithms.distillation import (
    DistillationConfig,
    DistillationTrainConfig,
    distillation_step,
    load_distillation_checkpoint,
    make_distillation_checkpoint_fn,
    new_distillation_state,
    train_distillation,
)
from nnx_ppo.algorithms.ppo import train_ppo
from nnx_ppo.algorithms.types import LoggingLevel, Transition
from nnx_ppo.envs import make
from nnx_ppo.networks.adapter import PPOAdapter
from nnx_ppo.networks.containers import Concat, FrozenStatistics, Parallel, Sequential
from nnx_ppo.networks.delay import Delay
from nnx_ppo.networks.factories import make_lstm_actor_critic
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.normalizer import NormalizerStatistics
from nnx_ppo.networks.sampling_layers import (
    ActionSampler,
    CategoricalSampler,
    NormalSampler,
    NormalTanhSampler,
)
from nnx_ppo.networks.types import PPONetworkOutput, StatefulModule, StatefulModuleOutput
from nnx_ppo.networks.utils import Filter, Flattener, Scale
from nnx_ppo.wrappers import Wrapper

ENV = make("memory")
"""One env for every test, so the compiled step is shared (it is cached per env)."""

STEP = (8, 6, 2, 2)
"""``n_envs, rollout_length, n_epochs, n_minibatches`` of every step here."""

LEARNING_RATE = 3e-2
"""Every state here has the same optimizer, so the compiled step is reused."""


def lstm_teacher(env, seed: int = 0):
    return make_lstm_actor_critic(
        env.observation_size,
        env.action_size,
        32,
        nnx.Rngs(seed),
        discrete=True,
        activation=nnx.tanh,
        normalize_obs=False,
    )


def delay_student(env, seed: int = 1, *, named_action: bool = False):
    """An MLP that sees the observation now and ``delay + 1`` steps ago (the cue at the query)."""
    rngs = nnx.Rngs(seed)
    width = env.observation_size
    sample = env.reset(jax.random.key(0)).obs
    action = Sequential([Dense(32, env.action_size, rngs), CategoricalSampler(rngs, 0.0)])
    return Sequential(
        [
            Parallel(now=Scale(1.0), past=Delay(sample, k_steps=env.delay + 1)),
            Concat(now=Scale(1.0), past=Scale(1.0)),
            Dense(2 * width, 32, rngs, activation=nnx.tanh),
            PPOAdapter(
                action=Parallel(cue=action) if named_action else action,
                value=Dense(32, 1, rngs),
            ),
        ]
    )


def leaves(tree):
    return [
        np.asarray(
            jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x
        )
        for x in jax.tree.leaves(tree)
    ]


def test_different_action_trees_fail_before_anything_compiles(caplog):
    teacher, student = lstm_teacher(ENV), delay_student(ENV, named_action=True)
    with (
        jax.log_compiles(),
        caplog.at_level(logging.WARNING),
        pytest.raises(ValueError) as error,
    ):
        new_distillation_state(ENV, teacher, student, 8, seed=0)
    message = str(error.value)
    assert "teacher actions: PyTreeDef(*)" in message
    assert "student actions: PyTreeDef({'cue': *})" in message
    assert not [r for r in caplog.records if "compil" in r.getMessage().lower()]


def _sampling(sampler: ActionSampler, inputs: int, rngs: nnx.Rngs) -> Sequential:
    """A one-layer network over the memory task's observation, acting through ``sampler``."""
    return Sequential(
        [
            Dense(ENV.observation_size, 8, rngs),
            PPOAdapter(
                action=Sequential([Dense(8, inputs, rngs), sampler]), value=Dense(8, 1, rngs)
            ),
        ]
    )


def test_samplers_of_another_kind_are_named_before_anything_compiles():
    rngs = nnx.Rngs(2)
    squashed = _sampling(NormalTanhSampler(rngs, 0.0), 2, rngs)
    with pytest.raises(ValueError, match="teacher's is a CategoricalSampler, the student's a No"):
        new_distillation_state(ENV, lstm_teacher(ENV), squashed, 8, seed=0)
    unsquashed = _sampling(NormalSampler(rngs, 0.0), 2, rngs)
    with pytest.raises(ValueError, match="a NormalTanhSampler squashes what a NormalSampler"):
        new_distillation_state(ENV, squashed, unsquashed, 8, seed=0)
    three_classes = _sampling(CategoricalSampler(rngs, 0.0), 3, rngs)
    with pytest.raises(ValueError, match=r"takes logits \(2,\) per env, the student's \(3,\)"):
        new_distillation_state(ENV, lstm_teacher(ENV), three_classes, 8, seed=0)
    wider = _sampling(NormalTanhSampler(rngs, 0.0), 4, rngs)  # two actions, not one
    with pytest.raises(ValueError, match=r"the samplers of action differ.*\(1,\) float32.*\(2,\)"):
        new_distillation_state(ENV, squashed, wider, 8, seed=0)


class _Logits(StatefulModule):
    """A linear layer sized by its parameter's shape alone: one graph at every width."""

    def __init__(self, n_in: int, n_out: int, rngs: nnx.Rngs) -> None:
        self.w = nnx.Param(0.1 * jax.random.normal(rngs.params(), (n_in, n_out)))

    def __call__(self, state: Any, x: jax.Array, rollout_extras: Any = None) -> Any:
        return StatefulModuleOutput(state, x @ self.w[...], jnp.zeros(()), {}, None)


def test_a_student_of_other_widths_is_refused_after_a_matched_pair_of_its_graph():
    # The matched pairs were cached by graph, which holds no shapes: a 3-class student
    # reused a 2-class pair's match and trained to pick a class the env does not have.
    def network(classes: int, seed: int) -> PPOAdapter:
        rngs = nnx.Rngs(seed)
        sampler = CategoricalSampler(rngs, 0.0)
        logits = _Logits(ENV.observation_size, classes, rngs)
        value = _Logits(ENV.observation_size, 1, rngs)
        return PPOAdapter(action=Sequential([logits, sampler]), value=value)

    teacher = network(2, 0)
    new_distillation_state(ENV, teacher, network(2, 1), 4, seed=0)
    with pytest.raises(ValueError, match=r"takes logits \(2,\) per env, the student's \(3,\)"):
        new_distillation_state(ENV, teacher, network(3, 2), 4, seed=0)


def test_numpy_counts_and_seeds_are_taken_and_bad_ones_named_by_the_function_called():
    state = new_distillation_state(ENV, lstm_teacher(ENV), delay_student(ENV), np.int64(4), 0)
    assert state.env_states.done.shape == (4,) and state.teacher_states is not None
    with pytest.raises(TypeError, match="new_distillation_state: seed must be an int"):
        new_distillation_state(ENV, lstm_teacher(ENV), delay_student(ENV), 4, seed=1.5)
    with pytest.raises(ValueError, match="new_distillation_state: n_envs must be a positive int"):
        new_distillation_state(ENV, lstm_teacher(ENV), delay_student(ENV), 0, seed=0)


def test_bad_callbacks_envs_and_seeds_are_named_before_anything_compiles():
    teacher, student = lstm_teacher(ENV), delay_student(ENV)
    with pytest.raises(TypeError, match=r"log_fn is called as log_fn\(metrics, step\), but"):
        train_distillation(ENV, teacher, student, total_steps=8, log_fn=lambda metrics: None)
    with pytest.raises(TypeError, match=r"checkpoint_fn is called as checkpoint_fn\(state, st"):
        train_distillation(ENV, teacher, student, total_steps=8, checkpoint_fn=lambda s: None)
    with pytest.raises(TypeError, match="train_distillation: eval_env is the name 'memory'"):
        train_distillation(ENV, teacher, student, total_steps=8, eval_env="memory")  # type: ignore
    with pytest.raises(ValueError, match=r"DistillationTrainConfig: seed must lie in"):
        DistillationTrainConfig(seed=2**64)


def test_a_student_holding_the_teachers_variables_is_refused():
    teacher = lstm_teacher(ENV)
    with pytest.raises(ValueError, match="the student is the teacher"):
        new_distillation_state(ENV, teacher, teacher, 8, seed=0)
    rngs = nnx.Rngs(4)
    sharing = Sequential(
        [
            teacher.layers[0],  # training the student would train the teacher's layer
            PPOAdapter(
                action=Sequential([Dense(32, 2, rngs), CategoricalSampler(rngs, 0.0)]),
                value=Dense(32, 1, rngs),
            ),
        ]
    )
    with pytest.raises(ValueError, match=r"student\.layers\[0\]\..* is teacher\.layers\[0\]\."):
        new_distillation_state(ENV, teacher, sharing, 8, seed=0)


def test_a_student_may_reuse_the_teachers_normaliser_held_fixed():
    # FrozenStatistics' own use: training reaches neither its statistics (no
    # update_statistics) nor them through the optimizer (no Params). It was refused.
    teacher = make_lstm_actor_critic(
        ENV.observation_size, ENV.action_size, 8, nnx.Rngs(0), discrete=True
    )
    normalizer = teacher.layers[0]
    rngs, width = nnx.Rngs(5), ENV.observation_size

    def student(first: nnx.Module) -> Sequential:
        head = Sequential([Dense(width, ENV.action_size, rngs), CategoricalSampler(rngs, 0.0)])
        return Sequential([first, PPOAdapter(action=head, value=Dense(width, 1, rngs))])

    with pytest.raises(ValueError, match=r"student\.layers\[0\]\..* is teacher\.layers\[0\]\."):
        new_distillation_state(ENV, teacher, student(normalizer), 8, seed=0)
    before = jax.tree.map(np.asarray, nnx.state(normalizer))
    state = new_distillation_state(ENV, teacher, student(FrozenStatistics(normalizer)), 8, 0)
    distillation_step(ENV, teacher, state, *STEP)
    after = jax.tree.map(np.asarray, nnx.state(normalizer))
    jax.tree.map(np.testing.assert_array_equal, before, after)


def test_a_network_that_fails_to_trace_is_named_by_its_role():
    rngs = nnx.Rngs(3)
    reads_a_dict = Sequential(
        [
            Filter({"obs": "state"}),  # the memory task's observation is an array, not a dict
            Flattener(),
            PPOAdapter(
                action=Sequential(
                    [
                        Dense(ENV.observation_size, ENV.action_size, rngs),
                        CategoricalSampler(rngs, 0.0),
                    ]
                ),
                value=Dense(ENV.observation_size, 1, rngs),
            ),
        ]
    )
    with pytest.raises(TypeError) as error:
        new_distillation_state(ENV, lstm_teacher(ENV), reads_a_dict, 8, seed=0)
    assert "x has no entry 'state' (it is an array of shape (8, 4) float32)" in str(error.value)
    assert "(raised while distillation traced the student network)" in error.value.__notes__


def test_steps_lower_the_students_nll_and_leave_the_teacher_untouched():
    teacher, student = lstm_teacher(ENV), delay_student(ENV)
    teacher_before = leaves(nnx.state(teacher))
    state = new_distillation_state(ENV, teacher, student, STEP[0], 0, LEARNING_RATE)
    nll = []
    for _ in range(8):
        state, metrics = distillation_step(ENV, teacher, state, *STEP)
        nll.append(metrics["losses/distillation_nll/mean"])
    assert state.steps_taken == metrics["total_steps"] == 8 * STEP[0] * STEP[1]
    with pytest.raises(ValueError, match="n_envs is 4 but distillation_state holds 8"):
        distillation_step(ENV, teacher, state, 4, *STEP[1:])
    assert all(np.isfinite(v) for v in metrics.values())
    assert nll[-1] < 0.5 * nll[0]
    for before, after in zip(teacher_before, leaves(nnx.state(teacher)), strict=True):
        np.testing.assert_array_equal(before, after)


def _filled(network, value: float, where=nnx.Param) -> None:
    """Every variable ``where`` selects in ``network``, set to ``value`` in place."""
    nnx.update(network, jax.tree.map(lambda x: jnp.full_like(x, value), nnx.state(network, where)))


def test_a_step_that_diverges_raises_and_leaves_the_student_as_it_was():
    teacher, student = lstm_teacher(ENV), delay_student(ENV)
    state = new_distillation_state(ENV, teacher, student, STEP[0], 0, LEARNING_RATE)

    def student_and_optimizer():
        return leaves((nnx.state(student), nnx.state(state.optimizer)))

    # A categorical teacher with NaN logits still picks actions: its parameters are named.
    nan_teacher = nnx.clone(teacher)
    _filled(nan_teacher, jnp.nan)
    # An infinite weight makes the student's loss NaN.
    kernel = student.layers[2].linear.kernel
    kernel[0, 0] = jnp.inf
    # NaN statistics in a teacher's Normalizer: its parameters are finite, its actions too.
    nan_statistics = make_lstm_actor_critic(
        ENV.observation_size, ENV.action_size, 32, nnx.Rngs(0), discrete=True,
        activation=nnx.tanh, normalize_obs=True,
    )  # fmt: skip
    _filled(nan_statistics, jnp.nan, NormalizerStatistics)
    teacher_is_nan = r"step 48: the teacher's parameters or statistics are NaN or infinite \(\["
    statistics_state = new_distillation_state(ENV, nan_statistics, student, STEP[0], 0, 1e-3)
    with pytest.raises(FloatingPointError, match=teacher_is_nan + r"'layers'\]\[0\]"):
        distillation_step(ENV, nan_statistics, statistics_state, *STEP)
    for diverging_teacher, message in (
        (nan_teacher, teacher_is_nan + r"'layers'\]\[0\]"),
        (teacher, r"step 48: the distillation loss is NaN or infinite \(epoch 0, minibatch 0\)"),
    ):
        before = student_and_optimizer()
        with pytest.raises(FloatingPointError, match=message):
            distillation_step(ENV, diverging_teacher, state, *STEP)
        for was, now in zip(before, student_and_optimizer(), strict=True):
            np.testing.assert_array_equal(was, now)
    assert state.steps_taken == 0


def normalized_lstm_student(seed: int = 3):
    return make_lstm_actor_critic(  # its sampler's entropy bonus is a regularization
        ENV.observation_size, ENV.action_size, 16, nnx.Rngs(seed), discrete=True,
        activation=nnx.tanh, normalize_obs=True,
    )  # fmt: skip


def test_student_statistics_that_overflow_stop_the_step_naming_them():
    # Only the student's parameters were checked: an M2 overflowed to inf went on into
    # the next step and every checkpoint, with that feature normalised to 0 for good.
    student = normalized_lstm_student()
    normalizer = student.layers[0]
    normalizer.mean[...] = jnp.full_like(normalizer.mean[...], 3e19)  # finite; squared, not
    normalizer.counter[...] = jnp.ones_like(normalizer.counter[...])
    state = new_distillation_state(ENV, lstm_teacher(ENV), student, STEP[0], 0, LEARNING_RATE)
    before = leaves((nnx.state(student), nnx.state(state.optimizer)))
    with pytest.raises(
        FloatingPointError,
        match=r"step 48: the student's running statistics became NaN or infinite in "
        r"update_statistics: \['layers'\]\[0\]\['M2'\]\.value \(finite inputs can overflow",
    ):
        distillation_step(ENV, lstm_teacher(ENV), state, *STEP)
    for was, now in zip(
        before, leaves((nnx.state(student), nnx.state(state.optimizer))), strict=True
    ):
        np.testing.assert_array_equal(was, now)


def test_a_step_wrapped_in_nnx_jit_as_0_3_0_did_says_it_compiles_itself():
    # A TracerBoolConversionError from the host's divergence check, naming nothing.
    teacher = lstm_teacher(ENV)
    state = new_distillation_state(ENV, teacher, delay_student(ENV), STEP[0], 0, LEARNING_RATE)
    jitted = nnx.jit(distillation_step, static_argnums=(0, 3, 4, 5, 6))
    with pytest.raises(TypeError, match=r"^distillation_step was called inside jax.jit"):
        jitted(ENV, teacher, state, *STEP)


def test_ppos_checkpoint_function_given_distillation_names_the_distillation_one(
    tmp_path, monkeypatch
):
    # An AttributeError ('DistillationState' object has no attribute 'networks') at the
    # first checkpoint, and "wrap a PPOConfig" advice for a DistillationTrainConfig.
    from nnx_ppo.algorithms.checkpointing import make_checkpoint_fn

    with pytest.raises(TypeError, match=r"by nnx_ppo\.algorithms\.distillation\.make_distil"):
        make_checkpoint_fn(tmp_path / "a", DistillationTrainConfig())
    teacher = lstm_teacher(ENV)
    state = new_distillation_state(ENV, teacher, delay_student(ENV), STEP[0], 0, LEARNING_RATE)
    with pytest.raises(TypeError, match=r"got a DistillationState: checkpoint distillation with"):
        make_checkpoint_fn(tmp_path / "b")(state, 0)
    assert not (tmp_path / "b").exists()
    # Handed to train_distillation: named before anything compiles (it failed at the
    # step-0 checkpoint), and the other way round in train_ppo.
    monkeypatch.setattr(distillation, "new_distillation_state", _never_called)
    config = _train_config()
    with pytest.raises(TypeError, match=r"checkpoint_fn was made by nnx_ppo\.algorithms\.checkp"):
        train_distillation(
            ENV, teacher, delay_student(ENV), config, checkpoint_fn=make_checkpoint_fn(tmp_path)
        )
    from nnx_ppo.algorithms import _train

    monkeypatch.setattr(_train, "_new_training_state", _never_called)
    with pytest.raises(TypeError, match=r"train_ppo checkpoints a TrainingState: make it with"):
        train_ppo(
            ENV,
            delay_student(ENV),
            TrainConfig(),
            checkpoint_fn=make_distillation_checkpoint_fn(tmp_path),
        )


def _never_called(*args, **kwargs):
    raise AssertionError("built before the checkpoint function was checked")


def test_an_unhashable_setting_of_teacher_or_student_is_named():
    # Flax's bare "unhashable type: 'list'" came from hashing the pair's structure.
    teacher, student = lstm_teacher(ENV), delay_student(ENV)
    teacher.settings = [1, 2]
    with pytest.raises(TypeError, match=r"^new_distillation_state \(teacher\): .*\.settings is"):
        new_distillation_state(ENV, teacher, student, STEP[0], 0, LEARNING_RATE)
    del teacher.settings
    student.settings = {"a": 1}
    with pytest.raises(TypeError, match=r"^new_distillation_state \(student\): .*\.settings is"):
        new_distillation_state(ENV, teacher, student, STEP[0], 0, LEARNING_RATE)


def test_a_step_adds_the_regularization_folds_statistics_and_carries_the_teacher_on():
    teacher, student = lstm_teacher(ENV), normalized_lstm_student()
    state = new_distillation_state(ENV, teacher, student, STEP[0], 0, LEARNING_RATE)
    statistics = leaves(nnx.state(student, NormalizerStatistics))
    teacher_carry = leaves(state.teacher_states)
    state, metrics = distillation_step(ENV, teacher, state, *STEP)
    regularization = metrics["losses/regularization/mean"]
    assert regularization != 0.0
    assert metrics["losses/total/mean"] == pytest.approx(
        metrics["losses/distillation_nll/mean"] + regularization, rel=1e-5
    )
    folded = leaves(nnx.state(student, NormalizerStatistics))
    assert any(not np.array_equal(a, b) for a, b in zip(statistics, folded, strict=True))
    carried = leaves(state.teacher_states)
    assert any(not np.array_equal(a, b) for a, b in zip(teacher_carry, carried, strict=True))


def test_the_loss_replays_the_student_from_a_reset_carry_after_an_episode_end():
    import jax.numpy as jnp

    from nnx_ppo.algorithms.distillation import distillation_loss
    from nnx_ppo.algorithms.types import Transition

    student = make_lstm_actor_critic(
        ENV.observation_size, ENV.action_size, 8, nnx.Rngs(2), discrete=True,
        normalize_obs=False,
    )  # fmt: skip
    steps, envs, end = 6, 4, 2
    obs = jax.random.normal(jax.random.key(0), (steps, envs, ENV.observation_size))
    first = carry = student.initialize_state(envs)
    extras, loglikelihoods = [], []
    for t in range(steps):  # the student's own rollout, its carry reset after step `end`
        out = student(carry, obs[t])
        extras.append(out.rollout_extras)
        loglikelihoods.append(out.output.loglikelihoods)
        carry = student.reset_state(out.next_state) if t == end else out.next_state
    done = jnp.zeros((steps, envs), bool).at[end].set(True)
    zeros = jnp.zeros((steps, envs))
    data = Transition(
        obs=obs, network_output=None, rewards=zeros, done=done, truncated=done & False,
        next_obs=obs, metrics={},
    )  # fmt: skip
    targets = jax.tree.map(lambda *leaves: jnp.stack(leaves), *extras)
    # Scoring the student's own actions: the replay must meet the carries of the rollout.
    _, diagnostics = distillation_loss(student, first, data, targets)
    expected = -np.mean(np.stack(loglikelihoods))
    np.testing.assert_allclose(diagnostics["losses/distillation_nll"], expected, rtol=1e-5)


def test_a_feedforward_student_is_replayed_in_one_flat_batch_as_its_scan_would(
    flat_replay_callers, monkeypatch
):
    from nnx_ppo.algorithms import rollout
    from nnx_ppo.networks.factories import make_discrete_mlp_actor_critic

    def mlp(seed: int, width: int):
        return make_discrete_mlp_actor_critic(
            ENV.observation_size, ENV.action_size, [width], [width], nnx.Rngs(seed)
        )

    def one_step(env, replay: str):
        flat_replay_callers.clear()
        with monkeypatch.context() as patch:
            if replay == "scan":
                patch.setattr(rollout, "_carry_follows_parameters", lambda *_: True)
            teacher, student = mlp(0, 16), mlp(1, 8)  # per-env sampler keys: carries kept
            state = new_distillation_state(env, teacher, student, STEP[0], 0, LEARNING_RATE)
            state, metrics = distillation_step(env, teacher, state, *STEP)
        flat = "distillation_loss" in flat_replay_callers
        return flat, metrics, leaves(nnx.state(student, nnx.Param))

    # A fresh env for each, so each traces its own step.
    flat, scanned = one_step(make("memory"), "flat"), one_step(make("memory"), "scan")
    assert flat[0] and not scanned[0]
    assert flat[1]["losses/distillation_nll/mean"] == pytest.approx(
        scanned[1]["losses/distillation_nll/mean"], rel=1e-5
    )
    for a, b in zip(flat[2], scanned[2], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_the_teacher_acts_deterministically_in_either_mode_and_keeps_its_mode():
    results = []
    for mode in ("eval", "train"):
        teacher = lstm_teacher(ENV)
        getattr(teacher, mode)()
        state = new_distillation_state(ENV, teacher, delay_student(ENV), STEP[0], 0, LEARNING_RATE)
        state, metrics = distillation_step(ENV, teacher, state, *STEP)
        results.append(metrics["losses/distillation_nll/mean"])
        samplers = [n for _, n in nnx.iter_graph(teacher) if isinstance(n, ActionSampler)]
        assert samplers and {s.deterministic for s in samplers} == {mode == "eval"}
    assert results[0] == results[1]


def test_configs_name_the_invalid_field():
    with pytest.raises(ValueError, match=r"n_envs \(6\) must be divisible by n_minibatches"):
        DistillationConfig(n_envs=6, n_minibatches=4)
    with pytest.raises(ValueError, match="learning_rate must be >= 0"):
        DistillationConfig(learning_rate=-1.0)
    with pytest.raises(TypeError, match=r"DistillationTrainConfig\.eval must be a EvalConfig"):
        DistillationTrainConfig(eval=DistillationConfig())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="config must be a DistillationTrainConfig"):
        train_distillation(ENV, lstm_teacher(ENV), delay_student(ENV), DistillationConfig())  # type: ignore[arg-type]


def test_checkpoint_resumes_the_student_and_both_carries(tmp_path):
    teacher, student = lstm_teacher(ENV), delay_student(ENV)
    state = new_distillation_state(ENV, teacher, student, STEP[0], 0, LEARNING_RATE)
    state, _ = distillation_step(ENV, teacher, state, *STEP)
    make_distillation_checkpoint_fn(tmp_path)(state, state.steps_taken)

    fresh = new_distillation_state(
        ENV, teacher, delay_student(ENV, seed=5), STEP[0], 3, LEARNING_RATE
    )
    loaded = load_distillation_checkpoint(tmp_path, fresh)
    assert loaded.steps_taken == state.steps_taken
    for tree in ("student_states", "teacher_states", "env_states", "rng_key"):
        for a, b in zip(leaves(getattr(state, tree)), leaves(getattr(loaded, tree)), strict=True):
            np.testing.assert_array_equal(a, b)
    for a, b in zip(
        leaves(nnx.state(state.student, nnx.Param)),
        leaves(nnx.state(loaded.student, nnx.Param)),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)


def _train_config(
    logging_level: LoggingLevel = LoggingLevel.LOSSES, **train: object
) -> DistillationTrainConfig:
    """96 steps of STEP's distillation, evaluated every 48 steps."""
    return DistillationTrainConfig(
        distillation=DistillationConfig(
            n_envs=STEP[0],
            rollout_length=STEP[1],
            total_steps=96,
            learning_rate=LEARNING_RATE,
            n_epochs=STEP[2],
            n_minibatches=STEP[3],
            logging_level=logging_level,
        ),
        eval=EvalConfig(every_steps=48, n_envs=4, max_episode_length=8),
        **train,  # type: ignore[arg-type]
    )


def test_train_distillation_evaluates_logs_and_checkpoints(tmp_path):
    config = _train_config(
        video=VideoConfig(enabled=True, every_steps=96, episode_length=7, render_kwargs={}),
        checkpoint_every_steps=96,
    )
    logged, saved, videos = [], [], []
    result = train_distillation(
        ENV,
        lstm_teacher(ENV),
        delay_student(ENV),
        config,
        log_fn=lambda metrics, step: logged.append(step),
        video_fn=videos.append,
        checkpoint_fn=lambda state, step: saved.append(step),
        eval_env=DrawnMemory(ENV),
    )
    assert result.total_steps == 96 and result.total_iterations == 2
    assert [entry["step"] for entry in result.eval_history] == [0, 48, 96]
    for entry in result.eval_history:  # the entries of train_ppo's history
        assert entry["episode_reward_mean"] == entry["eval/episode_reward/mean"]
    assert logged == [0, 48, 96]
    assert saved == [0, 96]
    assert [(video.step, video.frames.shape) for video in videos] == [
        (0, (8, 1, 1, 3)),
        (96, (8, 1, 1, 3)),
    ]


def test_a_video_of_an_eval_env_without_render_fails_before_the_first_evaluation():
    config = _train_config(video=VideoConfig(enabled=True, render_kwargs={}))
    evaluated = []
    with pytest.raises(TypeError, match=r"train_distillation: video needs an eval env with render"):
        train_distillation(
            ENV,
            lstm_teacher(ENV),
            delay_student(ENV),
            config,
            log_fn=lambda metrics, step: evaluated.append(step),
            video_fn=print,
        )
    assert evaluated == []


def test_train_distillation_resumes_without_repeating_its_start_and_saves_its_end():
    config = _train_config(
        LoggingLevel.LOSSES
        | LoggingLevel.WEIGHTS
        | LoggingLevel.THROUGHPUT
        | LoggingLevel.NETWORK_METRICS,
        checkpoint_every_steps=64,
    )
    events = []

    def checkpoint_fn(state, step):
        events.append(("checkpoint", step))

    teacher = lstm_teacher(ENV)
    first = train_distillation(
        ENV,
        teacher,
        delay_student(ENV),
        config,
        log_fn=lambda metrics, step: events.append(("log", step, sorted(metrics))),
        checkpoint_fn=checkpoint_fn,
    )
    # Each step is logged, then checkpointed; the last step (96) is saved too.
    assert [e[:2] for e in events] == [
        ("log", 0),
        ("checkpoint", 0),
        ("log", 48),
        ("log", 96),
        ("checkpoint", 96),
    ]
    step_keys = events[3][2]
    assert "total_steps" in events[0][2] and "eval/episode_reward/mean" in events[0][2]
    assert {"throughput/train_sps", "throughput/eval_sps", "weights/mean"} <= set(step_keys)
    # The student's network metrics under 0.3.0's name for them.
    assert any(key.startswith("student/") for key in step_keys), step_keys
    assert not any(key.startswith("net/") for key in step_keys)

    resumed = first.training_state
    with pytest.raises(ValueError, match=r"student is not initial_state\.student"):
        train_distillation(ENV, teacher, delay_student(ENV), config, initial_state=resumed)
    other_count = copy.deepcopy(config)
    other_count.distillation.n_envs *= 2
    held = config.distillation.n_envs
    with pytest.raises(ValueError, match=f"initial_state holds {held} envs, but config.distil"):
        train_distillation(
            ENV,
            teacher,
            resumed.student,
            other_count,
            log_fn=lambda metrics, step: events.append(("log", step)),
            initial_state=resumed,
        )
    assert len(events) == 5  # refused before its first evaluation, log or checkpoint
    events.clear()
    config.distillation.total_steps = 144
    result = train_distillation(
        ENV,
        teacher,
        resumed.student,
        config,
        log_fn=lambda metrics, step: events.append(("log", step)),
        checkpoint_fn=checkpoint_fn,
        initial_state=resumed,
    )
    assert events == [("log", 144), ("checkpoint", 144)]
    assert [entry["step"] for entry in result.eval_history] == [144]


def test_evaluation_runs_the_student_deterministically_in_either_mode():
    config = _train_config()
    config.distillation.total_steps = 48
    config.eval.n_envs = 16
    histories = []
    for mode in ("eval", "train"):
        student = delay_student(ENV)
        getattr(student, mode)()
        result = train_distillation(ENV, lstm_teacher(ENV), student, config)
        histories.append(result.eval_history)
        samplers = [n for _, n in nnx.iter_graph(student) if isinstance(n, ActionSampler)]
        assert {s.deterministic for s in samplers} == {mode == "eval"}  # its mode is kept
    assert histories[0] == histories[1]


def test_the_seed_and_total_steps_arguments_override_the_config():
    def final_key(config, **overrides):
        config.eval.enabled = False
        teacher, student = lstm_teacher(ENV), delay_student(ENV)
        result = train_distillation(ENV, teacher, student, config, **overrides)
        assert result.total_steps == 48
        return leaves(result.training_state.rng_key)[0]

    by_config = _train_config(seed=5)
    by_config.distillation.total_steps = 48
    by_arguments = final_key(_train_config(seed=0), seed=5, total_steps=48)
    np.testing.assert_array_equal(by_arguments, final_key(by_config))
    assert not np.array_equal(by_arguments, final_key(_train_config(seed=0), total_steps=48))


class DrawnMemory(Wrapper):
    """The memory task with a one-pixel renderer: lit on the query step."""

    def render(self, trajectory):
        return [np.full((1, 1, 3), 255 * int(state.obs[-2]), np.uint8) for state in trajectory]


def test_grad_norm_is_the_norm_of_each_updates_gradient(monkeypatch):
    # A loss linear in the student's parameters: every update's gradient is (3, 4), norm 5.
    def linear_loss(student, carry, batch, targets):
        del carry, batch, targets
        loss = 3.0 * jnp.sum(student.kernel[...]) + 4.0 * jnp.sum(student.bias[...])
        return loss, {"losses/total": loss}

    monkeypatch.setattr(distillation, "distillation_loss", linear_loss)
    n_envs, steps = 4, 2
    student = nnx.Linear(1, 1, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(student, optax.sgd(0.1), wrt=nnx.Param)
    zeros = jnp.zeros((steps, n_envs))
    transitions = Transition(
        obs=zeros,
        network_output=PPONetworkOutput(zeros, zeros, zeros),
        rewards=zeros,
        done=zeros.astype(bool),
        truncated=zeros.astype(bool),
        next_obs=zeros,
        metrics={},
    )
    config = DistillationConfig(n_envs=n_envs, rollout_length=steps, n_epochs=3, n_minibatches=2)
    data = (jnp.zeros(n_envs), transitions, zeros)
    diagnostics = distillation._learn(student, optimizer, data, jax.random.key(0), config)
    np.testing.assert_allclose(diagnostics["grad_norm"], np.full((3, 2), 5.0))
