"""A module annotated with TypedDict observations: required, optional and undeclared keys."""

from typing import NotRequired

import jax.numpy as jnp
from jaxtyping import Array, Float
from typing_extensions import TypedDict

import nnx_ppo
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput


class Observation(TypedDict, closed=True):
    pos: Float[Array, "B 3"]
    goal: NotRequired[Float[Array, "B 2"]]


class Reach(StatefulModule):
    def __call__(
        self, state: None, x: Observation, rollout_extras: None = None
    ) -> StatefulModuleOutput:
        return StatefulModuleOutput(state, x["pos"].sum(axis=-1), jnp.zeros(()), {})


reach = Reach()
print("without the goal:", reach(None, {"pos": jnp.ones((4, 3))}).output.shape)
try:
    reach(None, {"pos": jnp.ones((4, 3)), "vel": jnp.ones((4, 3))})
except nnx_ppo.ContractError as error:
    print(error)
