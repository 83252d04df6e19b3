"""train_ppo writing the files of an nnx-ppo train run: metrics.jsonl, TensorBoard, the curve."""

import tempfile
from pathlib import Path

from flax import nnx

from nnx_ppo import envs
from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.ppo import train_ppo
from nnx_ppo.cli.run_dir import RunLogger, plot_learning_curve, read_metrics
from nnx_ppo.networks.factories import make_discrete_mlp_actor_critic

env = envs.make("cartpole")
network = make_discrete_mlp_actor_critic(
    env.observation_size, env.action_size, [32], [32], nnx.Rngs(0), activation="tanh"
)
config = TrainConfig(
    ppo=PPOConfig(n_envs=8, rollout_length=32, total_steps=1024, n_epochs=2, n_minibatches=2),
    eval=EvalConfig(every_steps=512, n_envs=8, max_episode_length=200),
    seed=0,
)
run_dir = Path(tempfile.mkdtemp())
logger = RunLogger(run_dir)  # a log_fn: one JSON line and TensorBoard scalars per PPO step
try:
    train_ppo(env, network, config, log_fn=logger)
finally:
    logger.close()
plot_learning_curve(run_dir / "metrics.jsonl", run_dir / "learning_curve.png")
records = read_metrics(run_dir / "metrics.jsonl")
print("steps logged:", [record["step"] for record in records])
print("files:", sorted(path.name.split(".")[0] for path in run_dir.iterdir()))
