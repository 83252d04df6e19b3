"""A custom recurrent module with a batching bug, caught while JAX traces."""

import jax.numpy as jnp
from flax import nnx

import nnx_ppo
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput


class LeakyMemory(StatefulModule):
    def initialize_state(self, batch_size):
        return {"h": jnp.zeros((batch_size, 3))}

    def __call__(self, state, x, rollout_extras=None):
        h = 0.9 * state["h"] + x
        # Bug: averaging over the batch drops the batch axis from the carry.
        return StatefulModuleOutput({"h": h.mean(axis=0)}, h, jnp.zeros(()), {})


module = LeakyMemory()
step = nnx.jit(lambda m, s, x: m(s, x))
try:
    step(module, module.initialize_state(8), jnp.ones((8, 3)))
except nnx_ppo.ContractError as error:
    print(error)
