"""Cart-pole balancing with Gymnasium's CartPole-v1 dynamics, in pure JAX."""

from __future__ import annotations

import math
from typing import ClassVar

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from nnx_ppo.contract.arguments import as_whole, require_int
from nnx_ppo.contract.env_checks import check_action_tree
from nnx_ppo.envs.state import State, time_limit

__all__ = ["CartPole"]

_GRAVITY = 9.8
_CART_MASS = 1.0
_POLE_MASS = 0.1
_TOTAL_MASS = _CART_MASS + _POLE_MASS
_POLE_HALF_LENGTH = 0.5
_POLE_MASS_LENGTH = _POLE_MASS * _POLE_HALF_LENGTH
_FORCE = 10.0
_DT = 0.02
_X_LIMIT = 2.4
_THETA_LIMIT = 12 * 2 * math.pi / 360


class CartPole:
    """Keep a pole upright on a cart by pushing the cart left or right.

    The dynamics, constants, explicit Euler integration and termination are
    those of Gymnasium's ``CartPole-v1``.

    - Observation: ``float32[4]``, ``(x, x_dot, theta, theta_dot)``; the
      initial state is drawn uniformly from ``[-0.05, 0.05]^4``.
    - Action: an integer scalar (``discrete_actions = True``, ``action_size =
      2``): 0 pushes the cart left, 1 pushes it right, with a force of 10 N (any
      other value pushes left, as 0 does: a sampled action is always 0 or 1).
    - Reward: 1.0 for every step, the terminating one included; 0.0 at reset.
    - End: termination when ``|x| > 2.4`` or ``|theta| > 12`` degrees; truncation
      (``info["truncated"] = True``) after ``max_steps`` steps (500, as in
      ``CartPole-v1``).
    """

    observation_size: ClassVar[int] = 4
    action_size: ClassVar[int] = 2
    discrete_actions: ClassVar[bool] = True
    dt: ClassVar[float] = _DT

    def __init__(self, max_steps: int = 500) -> None:
        self.max_steps = require_int("CartPole", "max_steps", as_whole(max_steps), 1)

    def reset(self, rng: PRNGKeyArray) -> State:
        """A cart-pole at rest near upright: each coordinate uniform in [-0.05, 0.05]."""
        obs = jax.random.uniform(rng, (4,), minval=-0.05, maxval=0.05)
        return State(
            obs=obs,
            reward=jnp.zeros(()),
            done=jnp.zeros((), jnp.float32),
            metrics={},
            info={"truncated": jnp.zeros((), bool)},
            data={"steps": jnp.zeros((), jnp.int32)},
        )

    def step(self, state: State, action: Int[Array, ""]) -> State:
        """Push the cart for one 0.02 s Euler step."""
        check_action_tree(action, self, where="CartPole.step")
        obs = _euler_step(state.obs, action)
        x, theta = obs[0], obs[2]
        terminated = jnp.logical_or(jnp.abs(x) > _X_LIMIT, jnp.abs(theta) > _THETA_LIMIT)
        steps = state.data["steps"] + 1
        done, truncated = time_limit(terminated, steps, self.max_steps)
        return State(
            obs=obs,
            reward=jnp.ones(()),
            done=done,
            metrics={},
            info={"truncated": truncated},
            data={"steps": steps},
        )


def _euler_step(obs: Float[Array, "4"], action: Int[Array, ""]) -> Float[Array, "4"]:
    x, x_dot, theta, theta_dot = obs
    force = jnp.where(action == 1, _FORCE, -_FORCE)
    cos, sin = jnp.cos(theta), jnp.sin(theta)
    temp = (force + _POLE_MASS_LENGTH * theta_dot**2 * sin) / _TOTAL_MASS
    theta_acc = (_GRAVITY * sin - cos * temp) / (
        _POLE_HALF_LENGTH * (4.0 / 3.0 - _POLE_MASS * cos**2 / _TOTAL_MASS)
    )
    x_acc = temp - _POLE_MASS_LENGTH * theta_acc * cos / _TOTAL_MASS
    return jnp.stack(
        [
            x + _DT * x_dot,
            x_dot + _DT * x_acc,
            theta + _DT * theta_dot,
            theta_dot + _DT * theta_acc,
        ]
    )
