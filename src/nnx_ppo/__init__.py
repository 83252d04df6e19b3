"""nnx-ppo: PPO for JAX and Flax NNX with checked contracts for stateful networks.

The package top level holds what every user meets: the version, the one
exception type of the contract, the switch that turns the checks off, and
:func:`summary`, the table of a network's modules.
"""

from nnx_ppo.contract import CHECKS_ENV_VAR, ContractError, checks, checks_enabled
from nnx_ppo.networks.network_summary import summary

__version__ = "0.4.0.dev0"

__all__ = ["CHECKS_ENV_VAR", "ContractError", "__version__", "checks", "checks_enabled", "summary"]
