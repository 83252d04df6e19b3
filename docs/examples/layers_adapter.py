"""PPOAdapter with a dict action: a continuous arm and a discrete gripper, one value."""

import jax
import jax.numpy as jnp
from flax import nnx

from nnx_ppo.networks.adapter import PPOAdapter
from nnx_ppo.networks.containers import Sequential, Splitter
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.sampling_layers import CategoricalSampler, NormalTanhSampler
from nnx_ppo.networks.types import PPONetworkOutput
from nnx_ppo.networks.utils import Map

rngs = nnx.Rngs(0)
network = PPOAdapter(
    action=Sequential(
        [
            Dense(6, 2 * 3 + 2, rngs),  # arm: mean and raw std of 3 joints; gripper: 2 logits
            Splitter(arm=2 * 3, gripper=2),
            Map(
                arm=NormalTanhSampler(rngs, entropy_weight=1e-3),
                gripper=CategoricalSampler(rngs, entropy_weight=1e-2),
            ),
        ]
    ),
    value=Dense(6, 1, rngs),
)
out = network(network.initialize_state(5), jnp.zeros((5, 6)))
assert isinstance(out.output, PPONetworkOutput)
print("actions:", jax.tree.map(jnp.shape, out.output.actions))
print("log-likelihoods:", jax.tree.map(jnp.shape, out.output.loglikelihoods))
print("values:", out.output.value_estimates.shape)
print("carry keys:", sorted(out.next_state))
