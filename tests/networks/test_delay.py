"""Delay: exact k-step delay per env, through resets, against a Python reference."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given
from hypothesis import strategies as st

import nnx_ppo
from nnx_ppo.networks.delay import Delay
from nnx_ppo.networks.types import StatefulModuleOutput

SAMPLE = {"position": jnp.zeros((2,), jnp.float32), "count": jnp.zeros((), jnp.int32)}
INITIAL = -1.0
N_STEPS = 8


@nnx.jit
def _step(module: Delay, state: Any, x: Any, reset: jax.Array) -> StatefulModuleOutput:
    """Reset the envs where ``reset`` holds (one env's slice at a time), then step."""
    fresh = jax.vmap(module.reset_state)(state)
    state = jax.tree.map(
        lambda new, old: jnp.where(reset.reshape(-1, *[1] * (old.ndim - 1)), new, old),
        fresh,
        state,
    )
    return module(state, x)


def _inputs(step: int, batch: int) -> dict[str, np.ndarray]:
    """Values unique per (step, env), so an output names the step it came from."""
    env = np.arange(batch)
    return {
        "position": np.stack([100.0 * step + env, -100.0 * step - env], axis=-1).astype(np.float32),
        "count": (1000 * step + env).astype(np.int32),
    }


def _shapes_and_dtypes(tree: Any) -> Any:
    return jax.tree.map(lambda leaf: (leaf.shape, leaf.dtype), tree)


@given(
    k_steps=st.sampled_from([1, 2, 3]),
    batch=st.sampled_from([1, 2, 3]),
    resets=st.lists(st.lists(st.booleans(), min_size=3, max_size=3), min_size=N_STEPS),
)
def test_output_is_the_input_from_k_steps_ago_per_env(
    k_steps: int, batch: int, resets: list[list[bool]]
):
    assert nnx_ppo.checks_enabled()
    delay = Delay(SAMPLE, k_steps, initial_value=INITIAL)
    state = delay.initialize_state(batch)
    last_reset = np.zeros(batch, int)
    for step in range(N_STEPS):
        reset = np.array(resets[step][:batch]) & (step > 0)
        last_reset[reset] = step
        out = _step(delay, state, _inputs(step, batch), jnp.asarray(reset))

        source = step - k_steps
        for env in range(batch):
            for name, leaf in out.output.items():
                got = np.asarray(leaf[env])
                if source >= last_reset[env]:
                    np.testing.assert_array_equal(got, _inputs(source, batch)[name][env])
                else:
                    np.testing.assert_array_equal(got, np.full_like(got, INITIAL))
        assert _shapes_and_dtypes(out.output) == _shapes_and_dtypes(_inputs(step, batch))
        assert out.rollout_extras is None
        state = out.next_state


def test_batched_reset_refills_buffer_and_rewinds_idx():
    delay = Delay(SAMPLE, 2, initial_value=INITIAL)
    state = delay.initialize_state(3)
    for step in range(3):
        state = _step(delay, state, _inputs(step, 3), jnp.zeros(3, bool)).next_state
    assert np.all(np.asarray(state["idx"]) == 1)

    reset = delay.reset_state(state)

    assert _shapes_and_dtypes(reset) == _shapes_and_dtypes(state)
    assert _shapes_and_dtypes(reset) == _shapes_and_dtypes(delay.initialize_state(3))
    jax.tree.map(lambda b: np.testing.assert_array_equal(b, INITIAL), reset["buffer"])
    np.testing.assert_array_equal(reset["idx"], 0)
    one_env = jax.tree.map(lambda leaf: leaf[0], state)
    assert _shapes_and_dtypes(delay.reset_state(one_env)) == _shapes_and_dtypes(one_env)


def test_array_input_and_carry_layout():
    delay = Delay(jnp.zeros((4,)), 3)
    state = delay.initialize_state(2)
    assert _shapes_and_dtypes(state) == {
        "buffer": ((2, 3, 4), jnp.float32),
        "idx": ((2,), jnp.int32),
    }
    out = delay(state, jnp.ones((2, 4)))
    np.testing.assert_array_equal(out.output, np.zeros((2, 4)))


def test_mismatched_input_is_named():
    delay = Delay(SAMPLE, 2)
    state = delay.initialize_state(2)
    with pytest.raises(ValueError, match=r"x\['position'\] has shape \(2, 3\)"):
        delay(state, {"position": jnp.ones((2, 3)), "count": jnp.ones((2,), jnp.int32)})
    with pytest.raises(ValueError, match="tree structure"):
        delay(state, {"position": jnp.ones((2, 2))})


def test_an_input_of_another_kind_is_refused_and_one_of_the_same_kind_cast():
    delay = Delay(SAMPLE, 1)
    state = delay.initialize_state(2)
    position = jnp.full((2, 2), 0.5)
    refused = r"x\['count'\] is float32, but the delay line holds int32"
    with pytest.raises(ValueError, match=refused):
        delay(state, {"position": position, "count": jnp.full((2,), 2.7)})  # would store 2
    wide = jnp.array([300, 4], jnp.int64 if jax.config.jax_enable_x64 else jnp.uint32)
    with pytest.raises(ValueError, match=r"x\['count'\] is u?int(64|32), but the delay"):
        delay(state, {"position": position, "count": wide})  # would wrap
    narrow = {"position": position.astype(jnp.bfloat16), "count": jnp.array([3, 4], jnp.int8)}
    stored = delay(delay(state, narrow).next_state, narrow).output
    assert _shapes_and_dtypes(stored) == _shapes_and_dtypes(_inputs(0, 2))
    np.testing.assert_array_equal(stored["count"], [3, 4])


@pytest.mark.parametrize(
    ("sample", "k_steps", "error"),
    [
        (SAMPLE, 0, ValueError),
        (SAMPLE, -1, ValueError),
        (SAMPLE, 2.0, TypeError),
        (SAMPLE, True, TypeError),
        ({}, 2, ValueError),
        ({"a": 1.5}, 2, TypeError),
    ],
)
def test_bad_constructor_arguments_are_named(sample: Any, k_steps: Any, error: type):
    with pytest.raises(error, match="Delay"):
        Delay(sample, k_steps)


@pytest.mark.parametrize(
    ("dtype", "initial_value", "becomes"),
    [(np.int32, 0.5, "0"), (np.bool_, 0.5, "True"), (np.uint8, -1.0, "255")],
)
def test_an_initial_value_the_leaf_cannot_hold_is_refused(dtype, initial_value, becomes):
    with pytest.raises(ValueError, match=f"cannot be held by the .* leaf .*become {becomes}"):
        Delay(np.zeros(1, dtype), 1, initial_value=initial_value)
    Delay(np.zeros(1, dtype), 1, initial_value=1.0)  # a value it holds
