"""Flax NNX layers and transforms inside contract modules, each passing the test kit."""

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from nnx_ppo.networks import Sequential, Stateless
from nnx_ppo.networks.recurrent import GRU
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput
from nnx_ppo.networks.utils import new_env_keys, split_env_keys
from nnx_ppo.testing import check_module

WIDTH = 4


class Ensemble(StatefulModule):
    """Three linear heads made with nnx.vmap and applied with it; their mean is the output."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        @nnx.split_rngs(splits=3)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def heads(rngs: nnx.Rngs) -> nnx.Linear:
            return nnx.Linear(WIDTH, WIDTH, rngs=rngs)

        self.heads = heads(rngs)

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        each = nnx.vmap(lambda head, x: head(x), in_axes=(0, None))(self.heads, x)
        return StatefulModuleOutput(state, each.mean(axis=0), jnp.zeros(()), {})


class RecurrentEnsemble(StatefulModule):
    """Three GRU cells made with nnx.vmap; carry, call and reset routed through it.

    The carry is ``(B, 3, WIDTH)``: the member axis second to last, so that
    ``reset_state`` finds it both in the batch and in one env's ``(3, WIDTH)`` slice.
    """

    def __init__(self, rngs: nnx.Rngs) -> None:
        @nnx.split_rngs(splits=3)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def members(rngs: nnx.Rngs) -> GRU:
            return GRU(WIDTH, WIDTH, rngs)

        self.members = members(rngs)

    def initialize_state(self, batch_size: int) -> jax.Array:
        start = nnx.vmap(lambda member: member.initialize_state(batch_size), out_axes=1)
        return start(self.members)

    def reset_state(self, prev_state: jax.Array) -> jax.Array:
        reset = nnx.vmap(lambda member, h: member.reset_state(h), in_axes=(0, -2), out_axes=-2)
        return reset(self.members, prev_state)

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        def step(member: GRU, h: jax.Array) -> tuple[jax.Array, jax.Array]:
            out = member(h, x)
            return out.next_state, out.output

        next_state, each = nnx.vmap(step, in_axes=(0, 1), out_axes=1)(self.members, state)
        return StatefulModuleOutput(next_state, each.mean(axis=1), jnp.zeros(()), {})


class PerEnvDropout(StatefulModule):
    """nnx.Dropout drawing from per-env keys in the carry, not from an nnx.Rngs."""

    def __init__(self, rate: float, rngs: nnx.Rngs) -> None:
        self.dropout = nnx.Dropout(rate)
        self.rngs = rngs  # read in initialize_state only

    def initialize_state(self, batch_size: int) -> jax.Array:
        return new_env_keys(self.rngs, batch_size)

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        keys, step_keys = split_env_keys(state)
        y = jax.vmap(lambda key, row: self.dropout(row, rngs=nnx.Rngs(dropout=key)))(step_keys, x)
        return StatefulModuleOutput(keys, y, jnp.zeros(()), {})


class FoldedBatchNorm(StatefulModule):
    """nnx.BatchNorm reading its running averages in __call__, updating them from the history."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        self.norm = nnx.BatchNorm(WIDTH, use_running_average=True, rngs=rngs)

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        return StatefulModuleOutput(state, self.norm(x), jnp.zeros(()), {}, rollout_extras=x)

    def update_statistics(self, rollout_extras: Any) -> None:
        samples = rollout_extras.reshape(-1, WIDTH)  # (T, B, WIDTH) as one batch of T * B
        self.norm(samples, use_running_average=False)


class Rematerialised(StatefulModule):
    """A child recomputed in the backward pass: jax.checkpoint over its nnx.split state."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        self.linear = nnx.Linear(WIDTH, WIDTH, rngs=rngs)

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        graphdef, variables = nnx.split(self.linear)
        run = jax.checkpoint(lambda variables, x: jnp.tanh(nnx.merge(graphdef, variables)(x)))
        return StatefulModuleOutput(state, run(variables, x), jnp.zeros(()), {})


# Stateless NNX layers need no class of their own.
rngs = nnx.Rngs(4)
layers = nnx.Sequential(nnx.Linear(WIDTH, WIDTH, rngs=rngs), nnx.LayerNorm(WIDTH, rngs=rngs))
trunk = Sequential([Stateless(layers), Ensemble(rngs)])

for module, stochastic in [
    (trunk, False),
    (Ensemble(nnx.Rngs(0)), False),
    (RecurrentEnsemble(nnx.Rngs(5)), False),
    (PerEnvDropout(0.5, nnx.Rngs(1)), True),
    (FoldedBatchNorm(nnx.Rngs(2)), False),
    (Rematerialised(nnx.Rngs(3)), False),
]:
    check_module(module, jnp.zeros(WIDTH), max_examples=3, stochastic=stochastic)
    print(f"{type(module).__name__} passes every property.")
