"""Ready-made networks: the preset for an env, and the factories behind it."""

import jax
import jax.numpy as jnp
from flax import nnx

from nnx_ppo import envs
from nnx_ppo.networks.factories import (
    make_default_network,
    make_lstm_actor_critic,
    make_mlp_actor_critic,
)
from nnx_ppo.networks.recurrent import LSTM

rngs = nnx.Rngs(0)
for name in ("cartpole", "pendulum", "memory", "two_agent"):
    env = envs.make(name)
    network = make_default_network(env, rngs, hidden_sizes=(16,))
    keys = jax.random.split(jax.random.key(0), 3)
    # eval_shape traces the reset and the forward pass without computing them.
    obs = jax.eval_shape(jax.vmap(env.reset), keys).obs
    out = jax.eval_shape(network, network.initialize_state(3), obs)
    print(f"{name:9s} actions", jax.tree.map(jnp.shape, out.output.actions))

mlp = make_mlp_actor_critic(
    obs_size=3,
    action_size=1,
    actor_hidden_sizes=[32, 32],
    critic_hidden_sizes=[64],
    rngs=rngs,
    activation="tanh",
)
recurrent = make_lstm_actor_critic(
    obs_size=4, action_size=2, hidden_size=16, rngs=rngs, discrete=True
)
print("MLP values:", mlp(mlp.initialize_state(3), jnp.zeros((3, 3))).output.value_estimates.shape)
has_lstm = any(isinstance(layer, LSTM) for layer in recurrent.layers)
print("make_lstm_actor_critic holds an LSTM:", has_lstm)
