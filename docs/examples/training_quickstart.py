"""train_ppo on the built-in cart-pole with a tiny budget, logging through log_fn."""

from flax import nnx

from nnx_ppo import envs
from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.ppo import train_ppo
from nnx_ppo.algorithms.types import LoggingLevel
from nnx_ppo.networks.factories import make_discrete_mlp_actor_critic

env = envs.make("cartpole")
network = make_discrete_mlp_actor_critic(
    env.observation_size, env.action_size, [32], [32], nnx.Rngs(0), activation="tanh"
)
config = TrainConfig(
    ppo=PPOConfig(
        n_envs=8,
        rollout_length=32,  # 256 env steps per PPO step
        total_steps=2048,
        n_epochs=2,
        n_minibatches=2,  # 2 minibatches of 4 whole envs
        learning_rate=1e-3,
        logging_level=LoggingLevel.LOSSES | LoggingLevel.ROLLOUT_STATS,
    ),
    eval=EvalConfig(every_steps=1024, n_envs=8, max_episode_length=200),
    seed=0,
)


def log_fn(metrics: dict[str, float], step: int) -> None:
    if "eval/episode_reward/mean" in metrics:
        print(f"step {step:5d}: eval return {metrics['eval/episode_reward/mean']:.1f}")


result = train_ppo(env, network, config, log_fn=log_fn)
print("PPO steps:", result.total_iterations, "env steps:", result.total_steps)
print("evaluations at:", [entry["step"] for entry in result.eval_history])
print("some metrics:", [name for name in sorted(result.final_metrics) if "losses/" in name][:4])
