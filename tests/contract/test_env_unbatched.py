"""check_env_unbatched says "batched env" only when reset behaves like one."""

from typing import Any

import jax
import jax.numpy as jnp
import pytest

from nnx_ppo import ContractError, envs
from nnx_ppo.contract.env_checks import check_env_unbatched
from nnx_ppo.envs import State


class WantsABatchOfKeys:
    """A batched env, like Brax's VmapWrapper: reset maps a batch of keys to a batch of states."""

    def reset(self, keys: jax.Array) -> State:
        return jax.vmap(envs.CartPole().reset)(keys)


class MismatchedObservation:
    """An unbatched env with an ordinary bug: reset adds arrays of shapes (3,) and (4,)."""

    def reset(self, key: jax.Array) -> State:
        state = envs.CartPole().reset(key)
        return state.replace(obs=state.obs + jnp.zeros(3))


class IndexesItsKey:
    """An unbatched env that indexes its key: it fails on one key, yet on a batch of keys
    returns one state (no leading batch axis), so it is not a batched env."""

    def reset(self, key: jax.Array) -> State:
        return envs.CartPole().reset(key[0])


def test_an_env_that_wants_a_batch_of_keys_is_called_batched() -> None:
    with pytest.raises(ContractError) as caught:
        check_env_unbatched(WantsABatchOfKeys())
    message = str(caught.value)
    assert "WantsABatchOfKeys.reset: env.reset failed when given one key" in message
    assert "given a batch of 3 keys it returns 3 states: the env is batched" in message
    assert "leaf:     key" in message
    assert isinstance(caught.value.__cause__, Exception)


@pytest.mark.parametrize(
    ("env", "error", "message"),
    [
        (MismatchedObservation(), TypeError, "add got incompatible shapes"),
        (IndexesItsKey(), IndexError, "Too many indices"),
    ],
)
def test_an_ordinary_reset_bug_raises_its_own_error(env: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message) as caught:
        check_env_unbatched(env)
    assert not isinstance(caught.value, ContractError)
    assert "batched" not in str(caught.value)
