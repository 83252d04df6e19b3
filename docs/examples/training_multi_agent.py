"""Two agents with dict observations, actions and rewards: one advantage and value per agent."""

import jax
import jax.numpy as jnp
from flax import nnx

from nnx_ppo import envs
from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.ppo import train_ppo
from nnx_ppo.algorithms.types import LoggingLevel
from nnx_ppo.networks.factories import make_default_network

env = envs.make("two_agent", max_steps=20)
network = make_default_network(env, nnx.Rngs(0), hidden_sizes=(16,))
obs = jax.vmap(env.reset)(jax.random.split(jax.random.key(0), 2)).obs
values = network(network.initialize_state(2), obs).output.value_estimates
print("values per agent:", jax.tree.map(jnp.shape, values))

config = TrainConfig(
    ppo=PPOConfig(
        n_envs=8,
        rollout_length=20,
        total_steps=480,
        n_minibatches=2,
        learning_rate=3e-3,
        logging_level=LoggingLevel.LOSSES | LoggingLevel.ROLLOUT_STATS,
    ),
    eval=EvalConfig(enabled=False),
)
result = train_ppo(env, network, config)
for name in sorted(result.final_metrics):
    if name.startswith(("losses/actor", "rollout_batch/episode_reward")) and "std" not in name:
        print(name)
