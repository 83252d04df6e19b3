"""nnx_ppo.summary: the cart-pole preset's modules, and a batching bug found without running it."""

import jax
import jax.numpy as jnp
from flax import nnx

import nnx_ppo
from nnx_ppo import envs
from nnx_ppo.networks.containers import Sequential
from nnx_ppo.networks.factories import make_default_network
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput

env = envs.make("cartpole")
network = make_default_network(env, nnx.Rngs(0), hidden_sizes=(16,))
# ONE observation, unbatched: the summary adds the batch axis B itself.
print(nnx_ppo.summary(network, env.reset(jax.random.key(0)).obs))


class LeakyMemory(StatefulModule):
    def initialize_state(self, batch_size):
        return {"h": jnp.zeros((batch_size, 3))}

    def __call__(self, state, x, rollout_extras=None):
        h = 0.9 * state["h"] + x
        # Bug: averaging over the batch drops the batch axis from the carry.
        return StatefulModuleOutput({"h": h.mean(axis=0)}, h, jnp.zeros(()), {})


rngs = nnx.Rngs(0)
broken = Sequential([Dense(4, 3, rngs), LeakyMemory(), Dense(3, 2, rngs)])
result = nnx_ppo.summary(broken, jnp.zeros(4))  # returns; the error is kept on it
print(result)
print("the failing row:", result.rows[-1].path, result.rows[-1].error is result.error)
