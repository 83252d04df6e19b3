"""Train nnx-ppo 0.3.0 on a Playground env with this repo's run configuration, for learning curves.

Run by ``playground_learning.py`` in the ``nnx-ppo-0.3.0`` venv. It takes a run
configuration as ``nnx-ppo train`` resolves it (``--config-json``) and gives
0.3.0 the same env, network and PPO settings through 0.3.0's own API: reward
scaling becomes 0.3.0's ``RewardScalingWrapper`` on the training env only (its
evaluations use the unscaled env, as this repo's do), and a linear learning-rate
schedule becomes the same ``optax.linear_schedule``. A setting 0.3.0 does not
have is refused, never dropped. Each evaluation is appended to
``RUN_DIR/metrics.jsonl`` as ``{"step", "time", "eval/episode_reward/mean"}``.

    python learn_nnx_ppo_030.py --config-json CONFIG.json --run-dir DIR
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

# PPOConfig fields both versions have, under the same names.
SHARED_PPO_FIELDS = (
    "n_envs",
    "rollout_length",
    "total_steps",
    "gae_lambda",
    "discounting_factor",
    "clip_range",
    "learning_rate",
    "normalize_advantages",
    "n_epochs",
    "n_minibatches",
    "critic_loss_weight",
    "gradient_clipping",
    "weight_decay",
)
# New fields, and the value that means what 0.3.0 always did.
NEW_PPO_DEFAULTS = {
    "combine_advantages": False,
    "value_clip_range": None,
    "advantage_normalization": "per_leaf",
    "target_kl": None,
    "iterations_per_call": 1,
    "reward_scaling": 1.0,  # translated to a wrapper
    "learning_rate_schedule": "constant",  # translated to an optax schedule
}


def _refuse_unported(ppo: dict[str, Any]) -> None:
    translated = {"reward_scaling", "learning_rate_schedule", "iterations_per_call"}
    unported = [
        f"{key}={ppo[key]!r}"
        for key, default in NEW_PPO_DEFAULTS.items()
        if key not in translated and ppo.get(key, default) != default
    ]
    if unported:
        raise SystemExit(f"nnx-ppo 0.3.0 has no equivalent of {', '.join(unported)}")


def main() -> None:
    parser = argparse.ArgumentParser(description="train nnx-ppo 0.3.0 with a run configuration")
    parser.add_argument("--config-json", type=Path, required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    args = parser.parse_args()
    run_config = json.loads(args.config_json.read_text())
    ppo = run_config["train"]["ppo"]
    _refuse_unported(ppo)
    if run_config["network"].get("kind") not in ("auto", "mlp"):
        raise SystemExit("this comparison covers MLP networks only")

    import optax
    from flax import nnx
    from mujoco_playground import registry

    from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
    from nnx_ppo.algorithms.ppo import train_ppo
    from nnx_ppo.networks.factories import make_mlp_actor_critic
    from nnx_ppo.wrappers.episode_wrapper import EpisodeWrapper
    from nnx_ppo.wrappers.reward_scaling_wrapper import RewardScalingWrapper

    overrides = {"impl": "jax", **run_config.get("env_kwargs", {})}
    eval_env: Any = registry.load(run_config["env"], config_overrides=overrides)
    if run_config.get("episode_length"):
        eval_env = EpisodeWrapper(eval_env, run_config["episode_length"])
    env = eval_env
    if ppo["reward_scaling"] != 1.0:
        env = RewardScalingWrapper(eval_env, ppo["reward_scaling"])

    settings = {key: ppo[key] for key in SHARED_PPO_FIELDS}
    if ppo["learning_rate_schedule"] == "linear":
        iterations = -(-ppo["total_steps"] // (ppo["n_envs"] * ppo["rollout_length"]))
        updates = iterations * ppo["n_epochs"] * ppo["n_minibatches"]
        settings["learning_rate"] = optax.linear_schedule(ppo["learning_rate"], 0.0, updates)
    evaluation = run_config["train"]["eval"]
    config = TrainConfig(
        ppo=PPOConfig(**settings),
        eval=EvalConfig(
            every_steps=evaluation["every_steps"],
            n_envs=evaluation["n_envs"],
            max_episode_length=evaluation["max_episode_length"],
        ),
        seed=run_config["train"]["seed"],
        checkpoint_every_steps=10**12,
    )
    network_config = run_config["network"]
    sampler = {}
    if network_config.get("entropy_weight") is not None:
        sampler["entropy_weight"] = network_config["entropy_weight"]
    network = make_mlp_actor_critic(
        env.observation_size,
        env.action_size,
        list(network_config["hidden_sizes"]),
        list(network_config["hidden_sizes"]),
        nnx.Rngs(run_config["train"]["seed"]),
        activation=network_config["activation"],
        **sampler,
    )
    args.run_dir.mkdir(parents=True, exist_ok=True)
    metrics_path = args.run_dir / "metrics.jsonl"

    def log_fn(metrics: dict[str, Any], step: int) -> None:
        if "eval/episode_reward/mean" not in metrics:
            return
        record = {"step": int(step), "time": time.time()}
        record["eval/episode_reward/mean"] = float(metrics["eval/episode_reward/mean"])
        with metrics_path.open("a") as stream:
            stream.write(json.dumps(record) + "\n")

    train_ppo(env, network, config, log_fn=log_fn, eval_env=eval_env)


if __name__ == "__main__":
    main()
