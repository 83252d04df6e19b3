"""Training over every device: the envs are split over a data mesh, parameters replicated.

On one device this runs as it is; with several (GPUs, a TPU slice, or CPU devices
forced with XLA_FLAGS=--xla_force_host_platform_device_count=4) the same code
spreads the envs over all of them.
"""

import jax
from flax import nnx

from nnx_ppo.algorithms import sharding
from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.ppo import new_training_state, ppo_step, train_ppo
from nnx_ppo.envs import make
from nnx_ppo.networks.factories import make_default_network

env = make("cartpole")
config = TrainConfig(
    ppo=PPOConfig(n_envs=16, rollout_length=16, n_minibatches=2, total_steps=512),
    eval=EvalConfig(n_envs=8, max_episode_length=50),
    devices=None,  # every device there is
)
networks = make_default_network(env, nnx.Rngs(0), hidden_sizes=(16, 16))
result = train_ppo(env, networks, config)
placed = jax.tree.leaves(result.training_state.env_states)[0].sharding
print(f"trained {result.total_steps} steps; envs on {len(placed.device_set)} device(s)")

# The step by hand: place a state on a mesh once, and ppo_step keeps it there.
mesh = sharding.data_mesh(jax.device_count())
state = new_training_state(env, networks, 16, seed=0)
state = sharding.shard_training_state(state, mesh)
state, metrics = ppo_step(env, state, config.ppo)
print("the state stays on the mesh:", sharding.mesh_of(state) == mesh)
