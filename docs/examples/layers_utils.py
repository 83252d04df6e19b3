"""Routing utilities on a dict observation: Filter, Map, Scale, Flattener and Merge."""

import jax
import jax.numpy as jnp
from flax import nnx

from nnx_ppo.networks.containers import Sequential
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.utils import Filter, Flattener, Map, Merge, Scale


def shapes(module, x):
    return jax.tree.map(jnp.shape, module(module.initialize_state(2), x).output)


obs = {
    "proprio": {"joints": jnp.ones((2, 4)), "velocity": jnp.ones((2, 4))},
    "camera": jnp.ones((2, 3, 3)),
    "task_id": jnp.ones((2, 1)),
}

print("Flattener():", shapes(Flattener(), obs))
print("Flattener(preserve_levels=1):", shapes(Flattener(preserve_levels=1), obs))

pick = Filter({"speed": ("proprio", "velocity"), "image": "camera", "n": lambda x: x["task_id"]})
print("Filter:", shapes(pick, obs))

rngs = nnx.Rngs(0)
encoders = Map(speed=Dense(4, 8, rngs), image=Sequential([Flattener(), Dense(9, 8, rngs)]))
print("Map:", shapes(Sequential([pick, encoders]), obs))

print("Scale(0.5):", Scale(0.5)((), jnp.ones((2, 1))).output[:, 0])

# Merge runs every child on the same input and merges their dict outputs.
heads = Merge(left=Filter({"policy": "speed"}), right=Filter({"extra": "n"}))
print("Merge:", shapes(Sequential([pick, heads]), obs))
