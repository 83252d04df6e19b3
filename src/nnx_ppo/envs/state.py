"""The state of one built-in environment, and the time limit they share.

Every built-in environment follows the MuJoCo Playground convention (the docs'
environments page): ``reset(key) -> State`` and ``step(state, action) -> State`` for
**one** environment, which the library vmaps over ``n_envs``.

Conventions shared by the built-in environments:

- ``done`` is a ``float32`` scalar, 1.0 at the end of an episode (as in
  Playground);
- ``info["truncated"]`` is a ``bool`` scalar, ``True`` when the episode ended
  by its time limit rather than by termination (a step that both terminates
  and reaches the limit counts as terminated);
- ``observation_size`` and ``action_size`` follow Playground: an ``int`` for a
  flat array, a dict of shapes (observations) or of ints (actions) for dict
  trees;
- ``discrete_actions`` (a class attribute, ``bool``) tells whether an action
  leaf is one integer scalar choosing among ``action_size`` options (``True``)
  or an array of ``action_size`` floats (``False``; Playground envs have no
  such attribute and are continuous).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray, PyTree

from nnx_ppo.contract.axes import Scalar, Unbatched

__all__ = ["EnvState", "RLEnv", "State", "time_limit"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class State:
    """One environment's state: a frozen pytree dataclass with Playground's fields.

    Attributes:
      obs: the observation, a pytree of arrays.
      reward: the reward of the step that led here, a scalar or a pytree of
        scalars (one per agent or objective); zero after ``reset``.
      done: a ``float32`` scalar, 1.0 when the episode ended at this step.
      metrics: a dict of scalars, for logging.
      info: a dict; the built-in envs write ``info["truncated"]`` here.
      data: the environment's hidden state (positions, counters, the cue of a
        memory task); Playground keeps its ``mjx.Data`` in this field.
    """

    obs: Unbatched
    reward: PyTree[Scalar]
    done: Scalar
    metrics: dict[str, Any]
    info: dict[str, Any]
    data: Any = ()

    def replace(self, **changes: Any) -> State:
        """Return a copy with the given fields replaced."""
        return dataclasses.replace(self, **changes)


@runtime_checkable
class EnvState(Protocol):
    """One environment's state, as in MuJoCo Playground.

    The fields are read-only properties so that frozen dataclasses (Playground's
    ``State``, :class:`nnx_ppo.envs.State`) satisfy the protocol. ``done`` is a
    scalar (``float`` in Playground, ``bool`` elsewhere) or one scalar per reward
    leaf; ``info["truncated"]`` (ours) or ``info["truncation"]`` (Playground)
    marks an episode cut short by a time limit.
    """

    @property
    def obs(self) -> Any: ...
    @property
    def reward(self) -> Any: ...
    @property
    def done(self) -> Any: ...
    @property
    def metrics(self) -> dict[str, Any]: ...
    @property
    def info(self) -> dict[str, Any]: ...
    def replace(self, **changes: Any) -> Any:
        """A copy with the given fields replaced (Playground's and our ``State`` have it)."""
        ...


@runtime_checkable
class RLEnv(Protocol):
    """One unbatched environment; the library vmaps ``reset`` and ``step`` over envs.

    ``step`` takes the env's own state type and one env's action (an
    :data:`~nnx_ppo.contract.axes.Unbatched` tree); the protocol leaves both as
    ``Any``, since a protocol's parameters must accept every env's narrower types.
    """

    def reset(self, rng: PRNGKeyArray, /) -> EnvState: ...
    def step(self, state: Any, action: Any, /) -> EnvState: ...


def time_limit(
    terminated: Bool[Array, ""], steps_taken: Int[Array, ""], max_steps: int
) -> tuple[Float[Array, ""], Bool[Array, ""]]:
    """The ``(done, truncated)`` pair of a step, given termination and a step budget.

    Truncation is marked only where the episode did not terminate, so a value
    target bootstraps exactly where the episode was cut short.

    Args:
      terminated: whether the env reached a terminal state at this step.
      steps_taken: the number of steps taken in the episode, this one included.
      max_steps: the episode's time limit.

    Returns:
      ``done`` as a ``float32`` scalar and ``truncated`` as a ``bool`` scalar.
    """
    truncated = jnp.logical_and(steps_taken >= max_steps, jnp.logical_not(terminated))
    return jnp.logical_or(terminated, truncated).astype(jnp.float32), truncated
