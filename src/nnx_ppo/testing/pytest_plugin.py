"""The nnx-ppo pytest plugin: the contract test kit as fixtures.

Installed with nnx-ppo (a ``pytest11`` entry point), so a test needs no import::

    def test_my_cell(check_module):
        check_module(MyCell(3, 8, nnx.Rngs(0)), jnp.zeros(3))

    def test_my_env(check_env):
        check_env(MyEnv())

``pytest --nnx-ppo-max-examples=50`` raises the number of Hypothesis examples of
every ``check_module`` call that does not set its own ``max_examples``, through the
fixture or called directly (e.g. for a nightly job): it sets the environment
variable ``NNX_PPO_MAX_EXAMPLES`` for the session.

pytest imports this plugin in every session of an environment where nnx-ppo is
installed, whatever the tests. Importing it imports ``nnx_ppo`` (and so JAX) and
the ``nnx_ppo.testing`` package with its kit, and Hypothesis where it is installed
(one to two seconds at the start of every session, mostly JAX's import); a test
suite that never uses the kit leaves it out with ``pytest -p no:nnx_ppo``. Without
the ``testing`` extra pytest still runs, and ``check_module`` there says how to
install Hypothesis.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

__all__ = [
    "check_env",
    "check_module",
    "pytest_addoption",
    "pytest_configure",
    "pytest_unconfigure",
]

_MAX_EXAMPLES_OPTION = "--nnx-ppo-max-examples"
_PREVIOUS = pytest.StashKey[str | None]()


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register ``--nnx-ppo-max-examples``."""
    parser.getgroup("nnx-ppo").addoption(
        _MAX_EXAMPLES_OPTION,
        type=int,
        default=None,
        help="Hypothesis examples per check_module call that sets no max_examples itself, "
        "fixture or direct call (default: NNX_PPO_MAX_EXAMPLES, else 10).",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Make ``--nnx-ppo-max-examples`` the default of every ``check_module`` call."""
    max_examples = config.getoption(_MAX_EXAMPLES_OPTION)
    if max_examples is None:
        return
    if max_examples < 1:
        raise pytest.UsageError(
            f"{_MAX_EXAMPLES_OPTION} must be a positive int, got {max_examples}"
        )
    from nnx_ppo.testing.module_properties import MAX_EXAMPLES_ENV_VAR

    config.stash[_PREVIOUS] = os.environ.get(MAX_EXAMPLES_ENV_VAR)
    os.environ[MAX_EXAMPLES_ENV_VAR] = str(max_examples)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Give ``NNX_PPO_MAX_EXAMPLES`` back the value it had before the session."""
    if _PREVIOUS not in config.stash:
        return
    from nnx_ppo.testing.module_properties import MAX_EXAMPLES_ENV_VAR

    previous = config.stash[_PREVIOUS]
    if previous is None:
        os.environ.pop(MAX_EXAMPLES_ENV_VAR, None)
    else:
        os.environ[MAX_EXAMPLES_ENV_VAR] = previous


@pytest.fixture
def check_module() -> Callable[..., None]:
    """:func:`nnx_ppo.testing.check_module`."""
    from nnx_ppo.testing import check_module as check

    return check


@pytest.fixture
def check_env() -> Callable[..., None]:
    """:func:`nnx_ppo.testing.check_env`."""
    from nnx_ppo.testing import check_env as check

    return check
