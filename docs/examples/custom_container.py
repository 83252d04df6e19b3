"""A residual container: y = x + inner(x), routing state, extras and statistics."""

import jax
import jax.numpy as jnp
from flax import nnx

import nnx_ppo
from nnx_ppo.networks.containers import Sequential
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.normalizer import Normalizer
from nnx_ppo.networks.types import StatefulModule


class Residual(StatefulModule):
    """Adds the wrapped module's output to its input. Carry and extras: the inner's."""

    def __init__(self, inner: StatefulModule):
        self.inner = inner  # rule 1: a plain attribute is tracked by NNX

    def __call__(self, state, x, rollout_extras=None):
        out = self.inner(state, x, rollout_extras)  # rule 2: same slice for state and extras
        return out.replace(output=x + out.output, metrics={"inner": out.metrics})  # rule 3

    def initialize_state(self, batch_size):  # rule 4
        return self.inner.initialize_state(batch_size)

    def reset_state(self, prev_state):
        return self.inner.reset_state(prev_state)

    def update_statistics(self, rollout_extras):
        self.inner.update_statistics(rollout_extras)


class ForgetfulResidual(Residual):
    def update_statistics(self, rollout_extras):
        pass  # the classic bug: the normaliser inside never sees its history


def collect_and_fold(network: StatefulModule) -> None:
    """One step of a rollout, then fold its (T=1, B=4) history into the statistics."""
    out = network(network.initialize_state(4), jnp.ones((4, 3)))
    history = jax.tree.map(lambda leaf: leaf[None], out.rollout_extras)
    network.update_statistics(history)


rngs = nnx.Rngs(0)
collect_and_fold(Sequential([Residual(Sequential([Normalizer(3), Dense(3, 3, rngs)]))]))
try:
    collect_and_fold(
        Sequential([ForgetfulResidual(Sequential([Normalizer(3), Dense(3, 3, rngs)]))])
    )
except nnx_ppo.ContractError as error:
    print(error)
