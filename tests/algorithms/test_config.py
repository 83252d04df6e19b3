"""Configs keep 0.3.0's fields and defaults, and reject bad values with a named error."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from nnx_ppo.algorithms._train import _default_optimizer
from nnx_ppo.algorithms.checkpointing import config_from_dict, config_to_dict
from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig, VideoConfig
from nnx_ppo.algorithms.distillation import DistillationConfig, DistillationTrainConfig
from nnx_ppo.algorithms.ppo import new_training_state
from nnx_ppo.algorithms.types import LoggingLevel

PPO_DEFAULTS_0_3_0 = {
    "n_envs": 256,
    "rollout_length": 20,
    "total_steps": 512_000,
    "gae_lambda": 0.95,
    "discounting_factor": 0.99,
    "clip_range": 0.2,
    "learning_rate": 1e-4,
    "normalize_advantages": True,
    "combine_advantages": False,
    "n_epochs": 4,
    "n_minibatches": 4,
    "critic_loss_weight": 1.0,
    "gradient_clipping": None,
    "weight_decay": None,
    "logging_level": LoggingLevel.LOSSES,
    "logging_percentiles": None,
}
EVAL_DEFAULTS_0_3_0 = {
    "enabled": True,
    "every_steps": 50_000,
    "n_envs": 64,
    "max_episode_length": 1000,
    "logging_level": LoggingLevel.NONE,
    "logging_percentiles": (0, 25, 50, 75, 100),
}


def test_defaults_are_those_of_0_3_0():
    ppo = dataclasses.asdict(PPOConfig())
    assert {k: ppo[k] for k in PPO_DEFAULTS_0_3_0} == PPO_DEFAULTS_0_3_0
    assert dataclasses.asdict(EvalConfig()) == EVAL_DEFAULTS_0_3_0
    train = TrainConfig()
    assert (train.seed, train.checkpoint_every_steps) == (17, 500_000)
    assert train.video == VideoConfig()


def test_new_options_default_to_0_3_0_behaviour():
    config = PPOConfig()
    assert config.value_clip_range is None
    assert config.target_kl is None
    assert config.advantage_normalization == "per_leaf"


def test_logging_level_members_are_those_of_0_3_0():
    names = {
        "LOSSES", "CRITIC_EXTRA", "ACTOR_EXTRA", "ROLLOUT_STATS", "ROLLOUT_OBS", "ENV_METRICS",
        "NETWORK_METRICS", "GRAD_NORM", "WEIGHTS", "THROUGHPUT", "BASIC", "ALL", "NONE",
    }  # fmt: skip
    assert names <= set(LoggingLevel.__members__)
    assert LoggingLevel.BASIC == LoggingLevel.LOSSES
    assert LoggingLevel.THROUGHPUT in LoggingLevel.ALL
    assert LoggingLevel.ROLLOUT_OBS not in LoggingLevel.ALL


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"n_envs": 10, "n_minibatches": 4}, ValueError, r"n_envs \(10\).*divisible"),
        ({"n_envs": 0}, ValueError, "n_envs must be a positive int"),
        ({"rollout_length": -1}, ValueError, "rollout_length must be a positive int"),
        ({"total_steps": 0}, ValueError, "total_steps must be a positive int"),
        ({"n_epochs": 0}, ValueError, "n_epochs must be a positive int"),
        ({"n_envs": 2.5}, TypeError, "n_envs must be an int"),
        ({"clip_range": 0.0}, ValueError, "clip_range must be > 0"),
        ({"clip_range": -0.1}, ValueError, "clip_range must be > 0"),
        ({"gae_lambda": 1.5}, ValueError, r"gae_lambda must lie in \[0.0, 1.0\]"),
        ({"discounting_factor": -0.1}, ValueError, "discounting_factor must lie in"),
        ({"learning_rate": -1e-4}, ValueError, "learning_rate must be >= 0"),
        ({"learning_rate": "fast"}, TypeError, "learning_rate must be a finite number"),
        ({"critic_loss_weight": -1.0}, ValueError, "critic_loss_weight must be >= 0"),
        ({"gradient_clipping": 0.0}, ValueError, "gradient_clipping must be > 0"),
        ({"weight_decay": -1e-3}, ValueError, "weight_decay must be >= 0"),
        ({"value_clip_range": 0.0}, ValueError, "value_clip_range must be > 0"),
        ({"target_kl": -0.01}, ValueError, "target_kl must be > 0"),
        ({"advantage_normalization": "batch"}, ValueError, "'per_leaf' or 'global'"),
        ({"normalize_advantages": "false"}, TypeError, "normalize_advantages must be a bool"),
        ({"combine_advantages": None}, TypeError, "combine_advantages must be a bool"),
        ({"logging_level": 3}, TypeError, "logging_level must be a LoggingLevel"),
        ({"logging_percentiles": (50, 101)}, ValueError, r"entry must lie in \[0, 100\]"),
        ({"logging_percentiles": [50]}, TypeError, "logging_percentiles must be"),
    ],
)
def test_ppo_config_rejects(changes, error, message):
    with pytest.raises(error, match=message):
        PPOConfig(**changes)


FLOAT_FIELDS = (
    "gae_lambda", "discounting_factor", "clip_range", "learning_rate", "critic_loss_weight",
    "gradient_clipping", "weight_decay", "value_clip_range", "target_kl",
)  # fmt: skip


@pytest.mark.parametrize("field", FLOAT_FIELDS)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_ppo_config_rejects_non_finite_numbers(field, value):
    with pytest.raises(TypeError, match=f"PPOConfig: {field} must be a finite number"):
        PPOConfig(**{field: value})


def test_configs_accept_numpy_scalars(counting_env, scripted_network):
    config = PPOConfig(n_envs=np.int64(8), n_minibatches=np.int32(2), clip_range=np.float32(0.1))
    assert config.steps_per_iteration == 8 * 20
    assert TrainConfig(seed=np.int64(-3)).seed == -3
    # The state a config's n_envs sizes takes the NumPy integer too.
    state = new_training_state(counting_env, scripted_network(), config.n_envs, 0)
    assert state.env_states.done.shape == (8,)
    # Stored as Python ints: a checkpoint's JSON config refused NumPy's.
    train = TrainConfig(
        ppo=config,
        eval=EvalConfig(n_envs=np.int64(4), logging_percentiles=(np.int64(50),)),
        seed=np.int64(3),
        devices=np.int64(1),
    )
    stored = config_to_dict(train)
    assert stored["seed"] == 3 and stored["devices"] == 1 and stored["ppo"]["n_envs"] == 8
    assert type(train.ppo.n_minibatches) is int and train.eval.logging_percentiles == (50,)
    # The optimizer's numbers too: a float32 learning rate failed the checkpoint's config.
    rates = {"learning_rate": np.float32(3e-4), "gradient_clipping": np.float32(0.5)}
    decayed = PPOConfig(**rates, weight_decay=np.float64(1e-4))
    stored = config_to_dict(TrainConfig(ppo=decayed))["ppo"]
    assert [type(stored[name]) for name in (*rates, "weight_decay")] == [float] * 3
    distill = DistillationConfig(**rates, weight_decay=np.float32(0.0))
    assert {type(distill.learning_rate), type(distill.weight_decay)} == {float}


def test_a_learning_rate_schedule_must_take_the_update_count():
    with pytest.raises(TypeError, match=r"learning_rate .*count"):
        PPOConfig(learning_rate=lambda: 1e-3)
    PPOConfig(learning_rate=optax.linear_schedule(1e-3, 0.0, 100))


def test_one_sample_minibatches_with_normalized_advantages_are_refused():
    # A lone advantage standardises to 0: the policy would never learn.
    with pytest.raises(ValueError, match="each minibatch holds one sample"):
        PPOConfig(n_envs=4, rollout_length=1, n_minibatches=4)
    PPOConfig(n_envs=4, rollout_length=1, n_minibatches=4, normalize_advantages=False)
    PPOConfig(n_envs=4, rollout_length=2, n_minibatches=4)


@pytest.mark.parametrize(("weight_decay", "decay"), [(True, 1e-4), (0.5, 0.5), (False, 0.0)])
def test_ppo_config_accepts_schedules_and_weight_decay_flags(
    weight_decay, decay, counting_env, scripted_network
):
    # Zero gradients leave Adam's step at 0, so only the decay moves a parameter:
    # p <- p * (1 - learning_rate(step) * decay), with the schedule's rate at each step.
    schedule = optax.linear_schedule(1.0, 0.5, 1)
    config = PPOConfig(learning_rate=schedule, weight_decay=weight_decay)
    network = scripted_network(w=0.3)
    state = new_training_state(
        counting_env,
        network,
        2,
        0,
        config.learning_rate,
        config.gradient_clipping,
        config.weight_decay,
    )
    zeros = jax.tree.map(jnp.zeros_like, nnx.state(network, nnx.Param))
    expected = 0.3
    for rate in (1.0, 0.5):
        state.optimizer.update(network, zeros)
        expected *= 1.0 - rate * decay
        np.testing.assert_allclose(network.w[...], expected, rtol=1e-6)


@pytest.mark.parametrize(
    ("clipping", "weight_decay", "reference"),
    [
        (None, None, optax.chain(optax.adam(1e-3))),
        (0.5, False, optax.chain(optax.clip_by_global_norm(0.5), optax.adam(1e-3))),
        (None, True, optax.chain(optax.adamw(1e-3))),
        (None, 0.5, optax.chain(optax.adamw(1e-3, weight_decay=0.5))),
    ],
)
def test_default_optimizer_steps_and_stores_state_as_optax_adam(clipping, weight_decay, reference):
    # optax's Adam(W) in a chain, as the default optimizer has always been laid out, so
    # saved optimizer states stay loadable; and the same updates.
    params = {"w": jnp.array([0.3, -1.2]), "b": jnp.array(0.7)}
    optimizer = _default_optimizer(1e-3, clipping, weight_decay)
    state, expected_state = optimizer.init(params), reference.init(params)
    assert jax.tree.structure(state) == jax.tree.structure(expected_state)
    for grads in ({"w": jnp.array([2.0, -0.5]), "b": jnp.array(3.0)},) * 3:
        updates, state = optimizer.update(grads, state, params)
        expected, expected_state = reference.update(grads, expected_state, params)
        jax.tree.map(np.testing.assert_array_equal, updates, expected)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"n_envs": 0}, "EvalConfig: n_envs must be a positive int"),
        ({"every_steps": -5}, "EvalConfig: every_steps must be >= 0"),
        ({"max_episode_length": 0}, "EvalConfig: max_episode_length must be a positive int"),
    ],
)
def test_eval_config_rejects(changes, message):
    with pytest.raises(ValueError, match=message):
        EvalConfig(**changes)


def test_train_config_checks_its_parts_and_a_field_changed_later():
    with pytest.raises(TypeError, match=r"TrainConfig\.ppo must be a PPOConfig"):
        TrainConfig(ppo={"n_envs": 4})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="checkpoint_every_steps must be >= 0"):
        TrainConfig(checkpoint_every_steps=-1)
    config = TrainConfig()
    config.ppo.n_minibatches = 3
    with pytest.raises(ValueError, match="divisible by n_minibatches"):
        config.validate()


@pytest.mark.parametrize(
    "config",
    [
        PPOConfig(),
        EvalConfig(),
        VideoConfig(),
        TrainConfig(),
        DistillationConfig(),
        DistillationTrainConfig(),
    ],
)
def test_a_misspelt_field_is_refused_rather_than_ignored(config):
    with pytest.raises(AttributeError, match="learnin_rate"):
        config.learnin_rate = 1.0  # type: ignore[attr-defined]


def test_what_030_took_is_taken_in_the_same_sense():
    assert PPOConfig(total_steps=1e6).total_steps == 1_000_000  # type: ignore[arg-type]
    assert type(PPOConfig(total_steps=np.float64(2e3)).total_steps) is int  # type: ignore
    assert EvalConfig(every_steps=0).every_steps == 0
    assert EvalConfig(every_steps=1e5).every_steps == 100_000  # type: ignore[arg-type]
    assert VideoConfig(every_steps=0.0).every_steps == 0  # type: ignore[arg-type]
    assert TrainConfig(checkpoint_every_steps=0).checkpoint_every_steps == 0
    assert DistillationConfig(total_steps=5e4).total_steps == 50_000  # type: ignore[arg-type]
    assert DistillationTrainConfig(checkpoint_every_steps=0).checkpoint_every_steps == 0
    assert PPOConfig(learning_rate=0.0).learning_rate == 0.0
    assert PPOConfig(logging_percentiles=()).logging_percentiles is None
    config = TrainConfig()
    config.ppo.total_steps = 3e5  # type: ignore[assignment]
    config.validate()  # as train_ppo does
    assert config.ppo.total_steps == 300_000 and isinstance(config.ppo.total_steps, int)
    # A config file or --set (JSON reads 1e6 as a float) takes the step counts alike.
    read = config_from_dict({"ppo": {"total_steps": 1e6}, "checkpoint_every_steps": 5e5})
    assert (read.ppo.total_steps, read.checkpoint_every_steps) == (1_000_000, 500_000)
    with pytest.raises(ValueError, match=r"config field ppo\.n_envs must be an integer"):
        config_from_dict({"ppo": {"n_envs": 64.0}})


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: PPOConfig(total_steps=1000.5), "total_steps must be an int, got float 1000.5"),
        (lambda: EvalConfig(every_steps=-1), "every_steps must be >= 0, got -1"),
        (lambda: TrainConfig(checkpoint_every_steps=-5), "checkpoint_every_steps must be >= 0"),
        (lambda: PPOConfig(n_envs=64.0), "n_envs must be an int, got float"),  # not a step count
    ],
)
def test_what_030_took_and_means_nothing_here_is_refused(build, message):
    with pytest.raises((TypeError, ValueError), match=message):
        build()


def test_a_config_keeps_its_dict_and_a_misspelt_field_gets_a_hint():
    config = TrainConfig()
    assert vars(config.ppo)["n_envs"] == 256  # e.g. wandb.init(config=vars(config.ppo))
    assert dataclasses.asdict(config)["eval"]["every_steps"] == 50_000
    with pytest.raises(AttributeError, match="PPOConfig has no field 'learnin_rate'; did you"):
        config.ppo.learnin_rate = 1.0  # type: ignore[attr-defined]
