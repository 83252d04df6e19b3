"""Contract modules called inside an NNX transform of their container, for the tools' tests."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from flax import nnx

from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput


class DenseEnsemble(StatefulModule):
    """Three Dense heads made and applied with nnx.vmap: each call is on the transform's copy."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        @nnx.split_rngs(splits=3)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def heads(rngs: nnx.Rngs) -> Dense:
            return Dense(4, 4, rngs)

        self.heads = heads(rngs)

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        each = nnx.vmap(lambda head, x: head((), x).output, in_axes=(0, None))(self.heads, x)
        return StatefulModuleOutput(state, each.mean(0), jnp.zeros(()), {})
