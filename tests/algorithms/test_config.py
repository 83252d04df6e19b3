"""Configs keep 0.3.0's fields and defaults, and reject bad values with a named error."""

import dataclasses

import optax
import pytest

from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig, VideoConfig
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
        ({"n_envs": 0}, ValueError, "n_envs must be positive"),
        ({"rollout_length": -1}, ValueError, "rollout_length must be positive"),
        ({"total_steps": 0}, ValueError, "total_steps must be positive"),
        ({"n_epochs": 0}, ValueError, "n_epochs must be positive"),
        ({"n_envs": 2.5}, TypeError, "n_envs must be an int"),
        ({"clip_range": 0.0}, ValueError, "clip_range must be positive"),
        ({"clip_range": -0.1}, ValueError, "clip_range must be positive"),
        ({"gae_lambda": 1.5}, ValueError, r"gae_lambda must lie in \[0.0, 1.0\]"),
        ({"discounting_factor": -0.1}, ValueError, "discounting_factor must lie in"),
        ({"learning_rate": 0.0}, ValueError, "learning_rate must be positive"),
        ({"learning_rate": "fast"}, TypeError, "learning_rate must be a number"),
        ({"critic_loss_weight": -1.0}, ValueError, "critic_loss_weight must be non-negative"),
        ({"gradient_clipping": 0.0}, ValueError, "gradient_clipping must be positive"),
        ({"weight_decay": -1e-3}, ValueError, "weight_decay must be non-negative"),
        ({"value_clip_range": 0.0}, ValueError, "value_clip_range must be positive"),
        ({"target_kl": -0.01}, ValueError, "target_kl must be positive"),
        ({"advantage_normalization": "batch"}, ValueError, "'per_leaf' or 'global'"),
        ({"logging_level": 3}, TypeError, "logging_level must be a LoggingLevel"),
        ({"logging_percentiles": (50, 101)}, ValueError, "each must be an int in"),
        ({"logging_percentiles": [50]}, TypeError, "logging_percentiles must be"),
    ],
)
def test_ppo_config_rejects(changes, error, message):
    with pytest.raises(error, match=message):
        PPOConfig(**changes)


def test_ppo_config_accepts_schedules_and_weight_decay_flags():
    PPOConfig(learning_rate=optax.linear_schedule(1e-3, 1e-4, 100), weight_decay=True)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"n_envs": 0}, "EvalConfig.n_envs must be positive"),
        ({"every_steps": -5}, "EvalConfig.every_steps must be positive"),
        ({"max_episode_length": 0}, "EvalConfig.max_episode_length must be positive"),
    ],
)
def test_eval_config_rejects(changes, message):
    with pytest.raises(ValueError, match=message):
        EvalConfig(**changes)


def test_train_config_checks_its_parts_and_a_field_changed_later():
    with pytest.raises(TypeError, match=r"TrainConfig\.ppo must be a PPOConfig"):
        TrainConfig(ppo={"n_envs": 4})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="checkpoint_every_steps must be positive"):
        TrainConfig(checkpoint_every_steps=0)
    config = TrainConfig()
    config.ppo.n_minibatches = 3
    with pytest.raises(ValueError, match="divisible by n_minibatches"):
        config.validate()
