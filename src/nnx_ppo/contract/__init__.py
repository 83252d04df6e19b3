"""The checking machinery of the contract. Imports nothing else of nnx_ppo."""

from nnx_ppo.contract.checking import (
    CHECKS_ENV_VAR,
    checks,
    checks_enabled,
    describe_module,
    install_checks,
)
from nnx_ppo.contract.errors import ContractError, format_violation

__all__ = [
    "CHECKS_ENV_VAR",
    "ContractError",
    "checks",
    "checks_enabled",
    "describe_module",
    "format_violation",
    "install_checks",
]
