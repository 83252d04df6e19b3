"""Normalizer: the forward pass reads the statistics; update_statistics folds a rollout in."""

import jax
import jax.numpy as jnp
from flax import nnx

from nnx_ppo.networks.normalizer import Normalizer

normalizer = Normalizer({"joints": 2, "camera": (2, 2)}, clip=5.0)
obs = {"joints": jnp.array([[1.0, 2.0], [3.0, 6.0]]), "camera": jnp.ones((2, 2, 2))}

out = normalizer((), obs)
print("before any data, x / 10:", out.output["joints"][0])
print("emitted as rollout_extras:", jax.tree.map(jnp.shape, out.rollout_extras))

# The rollout stacks T=3 steps of these emissions into (T, B, *feat) leaves.
history = jax.tree.map(lambda leaf: jnp.stack([leaf] * 3), out.rollout_extras)
normalizer.update_statistics(history)
print("mean:", normalizer.mean.get_value()["joints"], "samples:", normalizer.counter[...])
print("after:", normalizer((), obs).output["joints"])
# The statistics are not parameters: an optimizer over nnx.Param never touches them.
print("trainable leaves:", len(jax.tree.leaves(nnx.state(normalizer, nnx.Param))))
