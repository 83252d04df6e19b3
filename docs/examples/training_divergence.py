"""A NaN reward poisons the loss: training stops with FloatingPointError naming the step."""

import jax.numpy as jnp
from flax import nnx

from nnx_ppo import envs
from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.ppo import train_ppo
from nnx_ppo.networks.factories import make_default_network
from nnx_ppo.wrappers import Wrapper


class NaNAfterThreeSteps(Wrapper):
    """Cart-pole whose reward turns NaN after three steps (say, a division by a zero mass)."""

    def step(self, state, action):
        stepped = self.env.step(state, action)
        return stepped.replace(reward=jnp.where(stepped.data["steps"] > 3, jnp.nan, 1.0))


env = NaNAfterThreeSteps(envs.make("cartpole"))
network = make_default_network(env, nnx.Rngs(0), hidden_sizes=(8,))
config = TrainConfig(
    ppo=PPOConfig(n_envs=4, rollout_length=16, total_steps=640, n_minibatches=2),
    eval=EvalConfig(enabled=False),
)
try:
    train_ppo(env, network, config)
except FloatingPointError as error:
    print(error)
