"""One encoder shared by an env's K entities: the entities folded into its batch."""

import jax
import jax.numpy as jnp
from flax import nnx

from nnx_ppo.networks.containers import Sequential
from nnx_ppo.networks.normalizer import Normalizer
from nnx_ppo.networks.recurrent import LSTM
from nnx_ppo.networks.types import StatefulModule
from nnx_ppo.testing import check_module

K, FEATURES, WIDTH = 3, 2, 4


def fold(leaf: jax.Array) -> jax.Array:
    """(B, K, ...) -> (B * K, ...): every entity a row of its own."""
    return leaf.reshape(-1, *leaf.shape[2:])


def unfold(leaf: jax.Array) -> jax.Array:
    """(B * K, ...) -> (B, K, ...)."""
    return leaf.reshape(-1, K, *leaf.shape[1:])


class PerEntity(StatefulModule):
    """Runs ``encoder`` on each of an env's K entities, then averages them.

    Input ``(B, K, FEATURES)``; the encoder is called on ``(B * K, FEATURES)``, so its
    carry, extras and history are folded and unfolded the same way.
    """

    def __init__(self, encoder: StatefulModule) -> None:
        self.encoder = encoder

    def __call__(self, state, x, rollout_extras=None):
        out = self.encoder(jax.tree.map(fold, state), fold(x), jax.tree.map(fold, rollout_extras))
        return out.replace(
            next_state=jax.tree.map(unfold, out.next_state),
            output=unfold(out.output).mean(axis=1),
            rollout_extras=jax.tree.map(unfold, out.rollout_extras),
        )

    def initialize_state(self, batch_size):
        return jax.tree.map(unfold, self.encoder.initialize_state(batch_size * K))

    def reset_state(self, prev_state):
        return self.encoder.reset_state(prev_state)  # element-wise: any leading axes

    def update_statistics(self, rollout_extras):
        # (T, B, K, ...) -> (T, B * K, ...): the encoder's history, as it emitted it.
        self.encoder.update_statistics(
            jax.tree.map(lambda h: h.reshape(h.shape[0], -1, *h.shape[3:]), rollout_extras)
        )


encoder = Sequential([Normalizer(FEATURES), LSTM(FEATURES, WIDTH, nnx.Rngs(0))])
network = PerEntity(encoder)
check_module(network, jnp.zeros((K, FEATURES)), max_examples=5)
print("PerEntity passes every property.")
