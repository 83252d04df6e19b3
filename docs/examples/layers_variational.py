"""Variational bottlenecks: noise from per-env keys in the carry, a KL penalty as regularization."""

import jax.numpy as jnp
from flax import nnx

from nnx_ppo.networks.variational import AR1VariationalBottleneck, VariationalBottleneck

latent = VariationalBottleneck(latent_size=2, rng=nnx.Rngs(0), kl_weight=0.1)
keys = latent.initialize_state(3)  # one key per env, (B,)
params = jnp.zeros((3, 4))  # mean and pre-softplus std of a 2-d latent
out = latent(keys, params)
print("z:", out.output.shape, "regularization:", out.regularization_loss.shape)
print("metrics:", sorted(out.metrics))
# Same carry, same noise: this is what lets the loss replay the rollout's latents.
print("replay reproduces z:", bool(jnp.all(latent(keys, params).output == out.output)))

smooth = AR1VariationalBottleneck(latent_size=2, rng=nnx.Rngs(1), ar1_weight=1.0)
state = smooth.initialize_state(3)
first = smooth(state, params)
second = smooth(first.next_state, params)
print("l2_diff on the first step:", first.metrics["l2_diff"])
print("l2_diff on the second step > 0:", bool(jnp.all(second.metrics["l2_diff"] > 0)))
