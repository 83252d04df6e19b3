"""A stochastic module of your own: per-env keys in the carry, a draw per episode."""

import jax
import jax.numpy as jnp
from flax import nnx

from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput
from nnx_ppo.networks.utils import new_env_keys, split_env_keys
from nnx_ppo.testing import check_module


def _offsets(keys: jax.Array, features: int) -> jax.Array:
    """One normal draw of ``features`` per key, for keys of any shape (a batch, or one env's)."""
    draws = jax.vmap(lambda key: jax.random.normal(key, (features,)))(keys.reshape(-1))
    return draws.reshape(*keys.shape, features)


class EpisodeOffset(StatefulModule):
    """Adds an offset to its input that is drawn at each episode's start and held through it."""

    def __init__(self, features: int, scale: float, rngs: nnx.Rngs):
        self.features, self.scale = features, scale
        self.rngs = rngs  # read only in initialize_state, never in __call__
        self.deterministic = False  # network.eval() sets it to True, network.train() back

    def initialize_state(self, batch_size):
        keys, draw = split_env_keys(new_env_keys(self.rngs, batch_size))
        return {"keys": keys, "offset": _offsets(draw, self.features)}

    def reset_state(self, prev_state):
        # New draws from the keys it is given: the same on the batched carry and, under
        # vmap, on one env's slice; the next episode's draw differs from this one's.
        keys, draw = split_env_keys(prev_state["keys"])
        return {"keys": keys, "offset": _offsets(draw, self.features)}

    def __call__(self, state, x, rollout_extras=None):
        offset = 0.0 if self.deterministic else self.scale * state["offset"]
        return StatefulModuleOutput(state, x + offset, jnp.zeros(()), {})


module = EpisodeOffset(3, 0.1, nnx.Rngs(0))
check_module(module, jnp.zeros(3))
print("EpisodeOffset passes every property.")

x = jnp.ones((2, 3))
noisy = module(module.initialize_state(2), x).output
module.eval()
exact = module(module.initialize_state(2), x).output
print("eval() output equals the input:", bool(jnp.all(exact == x)))
print("train() output differs:", bool(jnp.any(noisy != x)))
