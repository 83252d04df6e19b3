"""The nnx-ppo pytest plugin: the contract test kit as fixtures.

Installed with nnx-ppo (a ``pytest11`` entry point), so a test needs no import::

    def test_my_cell(check_module):
        check_module(MyCell(3, 8, nnx.Rngs(0)), jnp.zeros(3))

    def test_my_env(check_env):
        check_env(MyEnv())

``pytest --nnx-ppo-max-examples=50`` raises the number of Hypothesis examples of
every ``check_module`` call that does not set its own ``max_examples`` (e.g. for a
nightly job). The kit, JAX and Hypothesis are imported when a fixture is first
used, not when pytest starts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest

__all__ = ["check_env", "check_module", "pytest_addoption"]

_MAX_EXAMPLES_OPTION = "--nnx-ppo-max-examples"


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register ``--nnx-ppo-max-examples``."""
    parser.getgroup("nnx-ppo").addoption(
        _MAX_EXAMPLES_OPTION,
        type=int,
        default=None,
        help="Hypothesis examples per check_module call that sets no max_examples itself "
        "(default: check_module's own, 10).",
    )


@pytest.fixture
def check_module(request: pytest.FixtureRequest) -> Callable[..., None]:
    """:func:`nnx_ppo.testing.check_module`, with ``--nnx-ppo-max-examples`` applied."""
    from nnx_ppo.testing.check_module import check_module as check

    max_examples = request.config.getoption(_MAX_EXAMPLES_OPTION)
    if max_examples is None:
        return check
    # A keyword given in the test overrides this default.
    return functools.partial(check, max_examples=max_examples)


@pytest.fixture
def check_env() -> Callable[..., None]:
    """:func:`nnx_ppo.testing.check_env`."""
    from nnx_ppo.testing.check_env import check_env as check

    return check
