"""Pendulum swing-up with Gymnasium's Pendulum-v1 dynamics and reward, in pure JAX."""

from __future__ import annotations

import math
from typing import ClassVar

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from nnx_ppo.contract.arguments import as_whole, require_int
from nnx_ppo.contract.env_checks import check_action_tree
from nnx_ppo.envs.state import State, time_limit

__all__ = ["Pendulum"]

_MAX_SPEED = 8.0
_MAX_TORQUE = 2.0
_DT = 0.05
_GRAVITY = 10.0
_MASS = 1.0
_LENGTH = 1.0


class Pendulum:
    """Swing a pendulum up and hold it upright with a bounded torque.

    The dynamics, constants and reward are those of Gymnasium's ``Pendulum-v1``
    (``g = 10``); the action is rescaled so that the policy acts in ``[-1, 1]``.

    - Observation: ``float32[3]``, ``(cos(theta), sin(theta), theta_dot)``, with
      ``theta = 0`` upright; the initial ``theta`` is uniform in ``[-pi, pi]``
      and ``theta_dot`` uniform in ``[-1, 1]``.
    - Action: ``float32[1]`` (``action_size = 1``, ``discrete_actions =
      False``), clipped to ``[-1, 1]`` and scaled to the maximum torque of 2.
    - Reward: ``-(theta^2 + 0.1 theta_dot^2 + 0.001 torque^2)`` on the state
      before the step, ``theta`` normalized to ``[-pi, pi)``; in
      ``[-16.27, 0]``; 0.0 at reset.
    - End: never terminates; truncation (``info["truncated"] = True``) after
      ``max_steps`` steps (200, as in ``Pendulum-v1``).
    """

    observation_size: ClassVar[int] = 3
    action_size: ClassVar[int] = 1
    discrete_actions: ClassVar[bool] = False
    dt: ClassVar[float] = _DT

    def __init__(self, max_steps: int = 200) -> None:
        self.max_steps = require_int("Pendulum", "max_steps", as_whole(max_steps), 1)

    def reset(self, rng: PRNGKeyArray) -> State:
        """A pendulum at a uniformly random angle and speed."""
        high = jnp.array([math.pi, 1.0])
        theta, theta_dot = jax.random.uniform(rng, (2,), minval=-high, maxval=high)
        return _state(theta, theta_dot, jnp.zeros(()), jnp.zeros((), jnp.int32), self.max_steps)

    def step(self, state: State, action: Float[Array, "1"]) -> State:
        """Apply the torque for one 0.05 s step."""
        check_action_tree(action, self, where="Pendulum.step")
        theta, theta_dot = state.data["theta"], state.data["theta_dot"]
        torque = jnp.clip(action[0], -1.0, 1.0) * _MAX_TORQUE
        cost = _normalize_angle(theta) ** 2 + 0.1 * theta_dot**2 + 0.001 * torque**2
        theta_dot = theta_dot + _DT * (
            3 * _GRAVITY / (2 * _LENGTH) * jnp.sin(theta) + 3.0 / (_MASS * _LENGTH**2) * torque
        )
        theta_dot = jnp.clip(theta_dot, -_MAX_SPEED, _MAX_SPEED)
        theta = theta + _DT * theta_dot
        return _state(theta, theta_dot, -cost, state.data["steps"] + 1, self.max_steps)


def _normalize_angle(theta: Float[Array, ""]) -> Float[Array, ""]:
    return (theta + math.pi) % (2 * math.pi) - math.pi


def _state(
    theta: Float[Array, ""],
    theta_dot: Float[Array, ""],
    reward: Float[Array, ""],
    steps: Int[Array, ""],
    max_steps: int,
) -> State:
    done, truncated = time_limit(jnp.zeros((), bool), steps, max_steps)
    return State(
        obs=jnp.stack([jnp.cos(theta), jnp.sin(theta), theta_dot]),
        reward=reward,
        done=done,
        metrics={},
        info={"truncated": truncated},
        data={"theta": theta, "theta_dot": theta_dot, "steps": steps},
    )
