"""The testing-kit tutorial: a recurrent module with a running statistic, and three ways
to break it, each caught by check_module."""

import jax.numpy as jnp
from flax import nnx

from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput
from nnx_ppo.testing import ContractPropertyError, check_module


class DecayingTrace(StatefulModule):
    """A per-env trace of the centred input: ``h <- decay * h + (x - mean)``.

    Carry ``{"h": (B, features)}``. The running mean of the input is a statistic:
    the module emits its input as rollout_extras, and update_statistics folds the
    (T, B, features) history in.
    """

    def __init__(self, features, decay=0.9):
        self.decay = decay
        self.mean = nnx.BatchStat(jnp.zeros(features))
        self.count = nnx.BatchStat(jnp.zeros(()))

    def initialize_state(self, batch_size):
        return {"h": jnp.zeros((batch_size, self.mean.shape[0]))}

    def reset_state(self, prev_state):
        return {"h": jnp.zeros_like(prev_state["h"])}

    def __call__(self, state, x, rollout_extras=None):
        h = self.decay * state["h"] + (x - self.mean[...])
        return StatefulModuleOutput({"h": h}, h, jnp.zeros(()), {}, x)

    def update_statistics(self, rollout_extras):
        samples = rollout_extras.reshape(-1, rollout_extras.shape[-1])  # fold T into B
        total = self.count[...] + samples.shape[0]
        self.mean[...] += (samples.mean(axis=0) - self.mean[...]) * samples.shape[0] / total
        self.count[...] = total


class BatchCentredTrace(DecayingTrace):
    def __call__(self, state, x, rollout_extras=None):
        # Bug 1: centring on the batch mean mixes the envs of a batch.
        h = self.decay * state["h"] + (x - x.mean(axis=0))
        return StatefulModuleOutput({"h": h}, h, jnp.zeros(()), {}, x)


class EagerTrace(DecayingTrace):
    def __call__(self, state, x, rollout_extras=None):
        # Bug 2: updating the statistic in the forward pass, where replay repeats it.
        self.mean[...] = 0.99 * self.mean[...] + 0.01 * x.mean(axis=0)
        return super().__call__(state, x, rollout_extras)


class Residual(StatefulModule):
    """y = x + inner(x): routes state and extras, but (bug 3) not update_statistics."""

    def __init__(self, inner):
        self.inner = inner

    def initialize_state(self, batch_size):
        return self.inner.initialize_state(batch_size)

    def reset_state(self, prev_state):
        return self.inner.reset_state(prev_state)

    def __call__(self, state, x, rollout_extras=None):
        out = self.inner(state, x, rollout_extras)
        return out.replace(output=x + out.output)


check_module(DecayingTrace(3), jnp.zeros(3))
print("DecayingTrace passes every property.")

for broken in (BatchCentredTrace(3), EagerTrace(3), Residual(DecayingTrace(3))):
    try:
        check_module(broken, jnp.zeros(3))
    except ContractPropertyError as error:
        print(error)
        print()
