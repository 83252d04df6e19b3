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

Install with ``pip install nnx-ppo[testing]`` (Hypothesis and pytest). pytest
imports the plugin in every session of an environment where nnx-ppo is installed,
so this package imports without Hypothesis too: :func:`check_env`,
:class:`ContractPropertyError` and :mod:`~nnx_ppo.testing.modules` work there,
and the parts built on Hypothesis say how to install it when used.
"""

from typing import Any

from nnx_ppo.testing import modules
from nnx_ppo.testing._harness import ContractPropertyError
from nnx_ppo.testing.env_properties import ENV_PROPERTIES, EnvProperty, check_env, random_action

try:
    from nnx_ppo.testing import strategies
    from nnx_ppo.testing.module_properties import MODULE_PROPERTIES, ModuleProperty, check_module
except ModuleNotFoundError as missing:
    if missing.name != "hypothesis":
        raise
    _NEEDS_HYPOTHESIS = ("MODULE_PROPERTIES", "ModuleProperty", "check_module", "strategies")

    def __getattr__(name: str) -> Any:
        if name not in _NEEDS_HYPOTHESIS:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        raise ModuleNotFoundError(
            f"nnx_ppo.testing.{name} needs Hypothesis: pip install 'nnx-ppo[testing]'",
            name="hypothesis",
        )


__all__ = [
    "ENV_PROPERTIES",
    "MODULE_PROPERTIES",
    "ContractPropertyError",
    "EnvProperty",
    "ModuleProperty",
    "check_env",
    "check_module",
    "modules",
    "random_action",
    "strategies",
]
