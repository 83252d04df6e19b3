"""Four cart-pole runs (two seeds x two learning rates) trained in one compiled program."""

import dataclasses
import tempfile
from pathlib import Path

from flax import nnx

from nnx_ppo import envs
from nnx_ppo.algorithms.checkpointing import make_checkpoint_fn
from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.ppo import train_ppo_runs
from nnx_ppo.networks.factories import make_default_network

env = envs.make("cartpole")
config = TrainConfig(
    ppo=PPOConfig(n_envs=8, rollout_length=32, total_steps=2048, n_epochs=2, n_minibatches=2),
    eval=EvalConfig(every_steps=1024, n_envs=8, max_episode_length=200),
)
seeds = [0, 1, 0, 1]
learning_rates = [1e-3, 1e-3, 3e-3, 3e-3]
returns: dict[int, list[float]] = {run: [] for run in range(len(seeds))}


def log_fn(run: int, metrics: dict[str, float], step: int) -> None:
    if "eval/episode_reward/mean" in metrics:
        returns[run].append(metrics["eval/episode_reward/mean"])


def run_config(run: int) -> TrainConfig:
    """Run ``run``'s own config (its seed and rate), for its checkpoints to resume it."""
    ppo = dataclasses.replace(config.ppo, learning_rate=learning_rates[run])
    return dataclasses.replace(config, ppo=ppo, seed=seeds[run])


checkpoints = Path(tempfile.mkdtemp())
save = [make_checkpoint_fn(checkpoints / f"run{run}", run_config(run)) for run in range(4)]


results = train_ppo_runs(
    env,
    lambda seed: make_default_network(env, nnx.Rngs(seed), hidden_sizes=[32]),
    config,
    seeds=seeds,
    learning_rates=learning_rates,
    log_fn=log_fn,
    checkpoint_fn=lambda run, training_state, step: save[run](training_state, step),
    on_divergence="continue",  # a run that diverges is set aside; the others go on
)
for run, result in enumerate(results):
    print(
        f"run {run} (seed {seeds[run]}, lr {learning_rates[run]:g}): "
        f"{result.total_steps} env steps, "
        f"evaluations at {[h['step'] for h in result.eval_history]}, diverged: {result.diverged}"
    )
print("one network per run:", len({id(r.training_state.networks) for r in results}) == 4)
print("run 3's checkpoints:", sorted(path.name for path in (checkpoints / "run3").iterdir()))
