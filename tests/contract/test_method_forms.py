"""How a contract method may be written: its signature, and NNX transforms inside it."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from nnx_ppo import ContractError
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput


def test_a_call_without_rollout_extras_is_refused_when_the_class_is_made() -> None:
    # The library calls __call__(state, x, rollout_extras) in replay: a TypeError
    # naming no module came at the first replay.
    with pytest.raises(TypeError) as caught:

        class NoExtras(StatefulModule):
            def __call__(self, state: Any, x: Any) -> StatefulModuleOutput:
                return StatefulModuleOutput(state, x, jnp.zeros(()), {})

    message = str(caught.value)
    assert "NoExtras.__call__(self, state, x) cannot be called as the library" in message
    assert "with (state, x, rollout_extras)" in message
    assert "Define __call__(self, state, x, rollout_extras=None)" in message


def test_a_statistics_method_taking_two_histories_is_refused() -> None:
    with pytest.raises(TypeError, match=r"update_statistics\(self, rollout_extras\)"):

        class TwoHistories(StatefulModule):
            def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> Any:
                return StatefulModuleOutput(state, x, jnp.zeros(()), {})

            def update_statistics(self, first: Any, second: Any) -> None:
                del first, second


def test_extra_keyword_only_parameters_are_accepted() -> None:
    class Flexible(StatefulModule):
        def __call__(
            self, state: Any, x: Any, rollout_extras: Any = None, *, scale: float = 1.0
        ) -> Any:
            return StatefulModuleOutput(state, scale * x, jnp.zeros(()), {})

    out = Flexible()((), jnp.ones((2, 3)))
    assert out.output.shape == (2, 3)


class Block(nnx.Module):
    def __init__(self) -> None:
        self.linear = nnx.Linear(3, 3, rngs=nnx.Rngs(0))

    def __call__(self, x: jax.Array) -> jax.Array:
        return jnp.tanh(self.linear(x))


class ThroughNnxJit(StatefulModule):
    def __init__(self) -> None:
        self.block = Block()

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        y = nnx.jit(lambda block, h: block(h))(self.block, x)
        return StatefulModuleOutput(state, y, jnp.zeros(()), {})


class ThroughNnxRemat(ThroughNnxJit):
    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        y = nnx.remat(lambda block, h: block(h))(self.block, x)
        return StatefulModuleOutput(state, y, jnp.zeros(()), {})


def test_an_eager_nnx_jit_that_hands_back_equal_values_is_no_write() -> None:
    # nnx.jit gives every variable back as a new array: compared by identity alone, each
    # was "written".
    out = ThroughNnxJit()((), jnp.ones((2, 3)))
    assert out.output.shape == (2, 3)


def test_a_traced_nnx_remat_write_back_is_named_with_the_way_around_it() -> None:
    module = ThroughNnxRemat()
    with pytest.raises(ContractError) as caught:
        nnx.jit(lambda m, x: m((), x).output)(module, jnp.ones((2, 3)))
    message = str(caught.value)
    assert "wrote the variable ThroughNnxRemat.block.linear" in message
    assert "an NNX transform inside the call (nnx.remat, nnx.jit) did" in message
    assert "jax.checkpoint" in message


def test_a_real_write_under_jit_gets_no_transform_hint() -> None:
    class RunningMean(StatefulModule):
        def __init__(self) -> None:
            self.mean = nnx.BatchStat(jnp.zeros(3))

        def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> Any:
            self.mean[...] = 0.9 * self.mean[...] + 0.1 * x.mean(0)
            return StatefulModuleOutput(state, x - self.mean[...], jnp.zeros(()), {})

    for call in (
        lambda module, x: module((), x),
        nnx.jit(lambda module, x: module((), x).output),  # a traced write: a tracer too
    ):
        with pytest.raises(ContractError) as caught:
            call(RunningMean(), jnp.ones((2, 3)))
        assert "wrote the variable RunningMean.mean" in str(caught.value)
        assert "NNX transform" not in str(caught.value)
