"""The contract test kit: run the contract's property checks on your own modules and envs.

* :func:`check_module`: every property of the module contract (per-sample purity,
  carry preservation, reset, replay across episode ends, statistics routing, no
  writes in the forward path, eager and compiled agreement), checked with
  Hypothesis on random batch sizes, rollout lengths, episode ends and inputs.
  Fails with :class:`ContractPropertyError`, an ``AssertionError``. The command
  ``nnx-ppo check MODULE:FACTORY`` runs it from the command line.
* :func:`check_env`: the env contract (one unbatched env, vmappable, jittable,
  deterministic given the key, a well-formed truncation signal).
* :mod:`nnx_ppo.testing.pytest_plugin`: the same two as pytest fixtures,
  ``check_module`` and ``check_env``.
* :mod:`nnx_ppo.testing.strategies`: batch sizes, time lengths, batched pytree
  observations, and random nestings of the containers over leaf modules.
* :mod:`nnx_ppo.testing.modules`: small leaf modules, one stateless, one with a
  carry, one that keeps running statistics, to nest your own module among.

Install with ``pip install nnx-ppo[testing]`` (Hypothesis and pytest).
"""

from nnx_ppo.testing import modules, strategies
from nnx_ppo.testing.check_env import EnvProperty, check_env, random_action
from nnx_ppo.testing.check_module import ContractPropertyError, ModuleProperty, check_module

__all__ = [
    "ContractPropertyError",
    "EnvProperty",
    "ModuleProperty",
    "check_env",
    "check_module",
    "modules",
    "random_action",
    "strategies",
]
