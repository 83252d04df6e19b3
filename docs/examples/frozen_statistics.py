"""A normaliser reused from a trained network, declared as held fixed."""

import jax
import jax.numpy as jnp
from flax import nnx

from nnx_ppo.networks.containers import FrozenStatistics, Sequential
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.normalizer import Normalizer

trained = Normalizer(3)  # in practice: taken from a trained network
network = Sequential([FrozenStatistics(trained), Normalizer(3), Dense(3, 2, nnx.Rngs(0))])

out = network(network.initialize_state(4), jnp.ones((4, 3)))
history = jax.tree.map(lambda e: jnp.stack([e] * 5), out.rollout_extras)  # (T=5, B=4, 3)
network.update_statistics(history)
print("frozen samples:", float(trained.counter[...]))
print("live samples:", float(network.layers[1].counter[...]))
