"""The run configuration of the ``nnx-ppo`` command: env, network preset and TrainConfig.

A run configuration is a JSON-ready dict::

    {
      "env": "cartpole",
      "episode_length": null,          # wrap the env in an EpisodeWrapper of this length
      "network": {"kind": "auto", "hidden_sizes": [64, 64], "activation": "tanh"},
      "train": {...}                   # a TrainConfig, as checkpointing.config_to_dict writes it
    }

Each built-in env has a preset tuned to converge within a few minutes on two CPU
cores; ``--config FILE`` and ``--set key=value`` override any part of it.
"""

import copy
import json
from pathlib import Path
from typing import Any

from nnx_ppo.algorithms.checkpointing import config_to_dict
from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.types import LoggingLevel

__all__ = ["apply_override", "merge", "preset", "read_config_file"]

_COMMON_PPO = {
    "learning_rate": 1e-3,
    "critic_loss_weight": 0.5,
    "gradient_clipping": 0.5,
    "logging_level": LoggingLevel.LOSSES
    | LoggingLevel.ACTOR_EXTRA
    | LoggingLevel.CRITIC_EXTRA
    | LoggingLevel.ROLLOUT_STATS
    | LoggingLevel.GRAD_NORM
    | LoggingLevel.THROUGHPUT,
}

_PRESETS: dict[str, dict[str, Any]] = {
    "cartpole": {
        "network": {"kind": "mlp", "hidden_sizes": [64, 64], "activation": "tanh"},
        "ppo": {"n_envs": 32, "rollout_length": 64, "total_steps": 500_000},
        "eval": {"every_steps": 50_000, "n_envs": 32, "max_episode_length": 500},
    },
    "pendulum": {
        "network": {"kind": "mlp", "hidden_sizes": [64, 64], "activation": "tanh"},
        # A short horizon and more epochs per rollout: the swing-up's value is mostly near-term.
        "ppo": {
            "n_envs": 32,
            "rollout_length": 100,
            "total_steps": 500_000,
            "discounting_factor": 0.9,
            "n_epochs": 10,
        },
        "eval": {"every_steps": 50_000, "n_envs": 32, "max_episode_length": 200},
    },
    "memory": {
        "network": {"kind": "lstm", "hidden_sizes": [32], "activation": "tanh"},
        "ppo": {"n_envs": 32, "rollout_length": 24, "total_steps": 100_000, "learning_rate": 3e-3},
        "eval": {"every_steps": 25_000, "n_envs": 256, "max_episode_length": 10},
    },
    "two_agent": {
        "network": {"kind": "mlp", "hidden_sizes": [32], "activation": "tanh"},
        "ppo": {"n_envs": 32, "rollout_length": 25, "total_steps": 200_000, "learning_rate": 3e-3},
        "eval": {"every_steps": 50_000, "n_envs": 64, "max_episode_length": 50},
    },
}

_PLAYGROUND = {
    "network": {"kind": "mlp", "hidden_sizes": [64, 64], "activation": "tanh"},
    "ppo": {"n_envs": 256, "rollout_length": 30, "total_steps": 5_000_000},
    "eval": {"every_steps": 500_000, "n_envs": 64, "max_episode_length": 1000},
    "episode_length": 1000,
}


def preset(env_name: str) -> dict[str, Any]:
    """The run configuration preset for ``env_name`` (Playground envs share one)."""
    chosen = _PRESETS.get(env_name, _PLAYGROUND)
    train = TrainConfig(
        ppo=PPOConfig(**(_COMMON_PPO | chosen["ppo"])),
        eval=EvalConfig(**chosen["eval"]),
        seed=0,
        checkpoint_every_steps=max(chosen["ppo"]["total_steps"] // 5, 1),
    )
    return {
        "env": env_name,
        "episode_length": chosen.get("episode_length"),
        "network": copy.deepcopy(chosen["network"]),
        "train": config_to_dict(train),
    }


def merge(base: dict[str, Any], update: dict[str, Any], where: str = "") -> dict[str, Any]:
    """``base`` with ``update`` merged in, recursively; unknown keys are an error."""
    merged = copy.deepcopy(base)
    for key, value in update.items():
        name = f"{where}{key}"
        if key not in merged:
            raise ValueError(f"unknown config key {name!r}; known here: {sorted(merged)}")
        if isinstance(merged[key], dict) and isinstance(value, dict):
            merged[key] = merge(merged[key], value, f"{name}.")
        else:
            merged[key] = value
    return merged


def read_config_file(path: Path) -> dict[str, Any]:
    """A run configuration (or part of one) from a JSON or TOML file."""
    text = path.read_text()
    if path.suffix == ".toml":
        import tomllib

        return tomllib.loads(text)
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from error


def apply_override(config: dict[str, Any], assignment: str) -> dict[str, Any]:
    """Apply one ``--set key=value``: a dotted key, and a JSON value (or a bare string).

    ``ppo.*``, ``eval.*``, ``seed`` and ``checkpoint_every_steps`` may omit the
    leading ``train.``: ``--set ppo.n_envs=64`` is ``--set train.ppo.n_envs=64``.
    """
    if "=" not in assignment:
        raise ValueError(f"--set expects key=value, got {assignment!r}")
    key, raw = assignment.split("=", 1)
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    parts = key.strip().split(".")
    if parts[0] in config["train"] and parts[0] not in config:
        parts = ["train", *parts]
    update: Any = value
    for part in reversed(parts):
        update = {part: update}
    return merge(config, update)
