"""Built-in pure-JAX environments and the registry that makes them by name.

Every environment here handles **one** environment (``reset(key)``,
``step(state, action)``; the library vmaps both) and follows the conventions
of :mod:`nnx_ppo.envs.state`. :func:`make` also builds MuJoCo Playground
environments when ``mujoco_playground`` is installed (the ``playground``
extra).

Example::

    env = nnx_ppo.envs.make("cartpole")
    state = env.reset(jax.random.key(0))
    state = env.step(state, jnp.asarray(1))
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from typing import Any

from nnx_ppo.envs.cartpole import CartPole
from nnx_ppo.envs.memory import MemoryTask
from nnx_ppo.envs.pendulum import Pendulum
from nnx_ppo.envs.state import RLEnv, State, time_limit
from nnx_ppo.envs.two_agent import TwoAgentReach

__all__ = [
    "CartPole",
    "MemoryTask",
    "Pendulum",
    "RLEnv",
    "State",
    "TwoAgentReach",
    "make",
    "names",
    "time_limit",
]

_BUILT_IN: dict[str, Callable[..., RLEnv]] = {
    "cartpole": CartPole,
    "pendulum": Pendulum,
    "memory": MemoryTask,
    "two_agent": TwoAgentReach,
}


def _playground_registry() -> Any:
    """Playground's registry module, or ``None`` where Playground is not installed."""
    if importlib.util.find_spec("mujoco_playground") is None:
        return None
    # ``registry`` is an attribute of the package, not an importable submodule.
    return importlib.import_module("mujoco_playground").registry


def names() -> tuple[str, ...]:
    """The names :func:`make` accepts: the built-ins, then Playground's if installed."""
    registry = _playground_registry()
    playground = () if registry is None else tuple(registry.ALL_ENVS)
    return (*_BUILT_IN, *playground)


def make(name: str, **kwargs: Any) -> RLEnv:
    """Build an environment by name.

    Args:
      name: a built-in name (``cartpole``, ``pendulum``, ``memory``,
        ``two_agent``) or, with the ``playground`` extra installed, a MuJoCo
        Playground name (e.g. ``"CartpoleBalance"``).
      **kwargs: the built-in env's constructor arguments, or for Playground,
        ``mujoco_playground.registry.load``'s (``config``, ``config_overrides``).

    Raises:
      ValueError: ``name`` is none of the above; the message lists the names.
    """
    if name in _BUILT_IN:
        return _BUILT_IN[name](**kwargs)
    registry = _playground_registry()
    if registry is not None and name in registry.ALL_ENVS:
        return registry.load(name, **kwargs)
    built_in = ", ".join(_BUILT_IN)
    if registry is None:
        hint = (
            "MuJoCo Playground names need the playground extra: pip install 'nnx-ppo[playground]'"
        )
    else:
        hint = f"or one of the {len(registry.ALL_ENVS)} MuJoCo Playground envs in names()"
    raise ValueError(f"Unknown environment {name!r}. Built-in: {built_in}; {hint}.")
