"""Action samplers: sample in rollout, score the stored action in replay, the mode in eval."""

import jax.numpy as jnp
from flax import nnx

from nnx_ppo.networks.sampling_layers import (
    CategoricalSampler,
    NormalSampler,
    NormalTanhSampler,
)

sampler = NormalTanhSampler(nnx.Rngs(0), entropy_weight=0.01)
keys = sampler.initialize_state(4)  # per-env keys, (B,)
params = jnp.concatenate([jnp.full((4, 2), 0.5), jnp.zeros((4, 2))], axis=-1)  # mean | raw std

rollout = sampler(keys, params)
sampled = rollout.output
print(f"action {sampled['action'].shape}, log-likelihood {sampled['log_likelihood'].shape}")
print("emitted raw action (before tanh):", rollout.rollout_extras.shape)
print("entropy bonus as regularization:", rollout.regularization_loss.shape)

# Loss replay: the stored raw action is scored under (possibly changed) parameters.
replay = sampler(keys, params, rollout.rollout_extras)
same = jnp.allclose(replay.output["log_likelihood"], sampled["log_likelihood"])
print("replay scores the same action:", bool(same))

sampler.eval()  # deterministic: the mean, squashed
action = sampler(keys, params).output["action"]
print("eval action is tanh(mean):", bool(jnp.allclose(action, jnp.tanh(0.5))))
sampler.train()

categorical = CategoricalSampler(nnx.Rngs(1), entropy_weight=0.01)
logits = jnp.array([[0.0, 3.0, 0.0]] * 4)
categorical.eval()
print("most likely class:", categorical(categorical.initialize_state(4), logits).output["action"])

# A state-independent std: the sampler learns log_std and takes the mean alone.
normal = NormalSampler(nnx.Rngs(2), entropy_weight=0.0, action_size=2)
out = normal(normal.initialize_state(4), jnp.zeros((4, 2)))
print("learned std:", out.metrics["sigma"][0])
