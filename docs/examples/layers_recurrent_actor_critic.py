"""A recurrent actor-critic built by hand, run through a rollout of the memory task."""

import jax
import jax.numpy as jnp
from flax import nnx

from nnx_ppo import envs
from nnx_ppo.algorithms.rollout import reset_envs, unroll_env
from nnx_ppo.networks.adapter import PPOAdapter
from nnx_ppo.networks.containers import Sequential
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.normalizer import Normalizer
from nnx_ppo.networks.recurrent import LSTM
from nnx_ppo.networks.sampling_layers import CategoricalSampler

env = envs.make("memory", n_cues=2, delay=2)  # episodes of delay + 2 = 4 steps
obs_size, n_actions, hidden = env.observation_size, env.action_size, 16
rngs = nnx.Rngs(0)

network = Sequential(
    [
        Normalizer(obs_size),
        Dense(obs_size, hidden, rngs, activation=nnx.tanh),
        LSTM(hidden, hidden, rngs),  # shared by both heads: the memory
        PPOAdapter(
            action=Sequential([Dense(hidden, n_actions, rngs), CategoricalSampler(rngs, 1e-2)]),
            value=Dense(hidden, 1, rngs),
        ),
    ]
)

n_envs = 3
carry = network.initialize_state(n_envs)  # [(), (), LSTMCarry, {"action": [...], "value": ()}]
env_state = reset_envs(env, jax.random.split(jax.random.key(0), n_envs))
carry, env_state, rollout = unroll_env(env, env_state, network, carry, 4, jax.random.key(1))

print("obs:", rollout.obs.shape, "actions:", rollout.network_output.actions.shape)
print("done at step:", jnp.argmax(rollout.done, axis=0))
# The episode ended on the last step, so the carry was reset to zeros for the next one.
print("LSTM carry after the reset is zero:", bool(jnp.all(carry[2].hidden == 0)))
print("stored for replay:", [jax.tree.map(jnp.shape, e) for e in rollout.rollout_extras][::3])
