"""Straight-line Threefry keys draw exactly the numbers of JAX's default keys."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nnx_ppo import _threefry
from nnx_ppo._threefry import STRAIGHT_LINE_THREEFRY, standard_keys, straight_line_keys

SHAPES = [(), (1,), (3,), (2, 5), (4, 3, 2)]
"""Few shapes, so that the compiled draws below are reused across examples."""

seeds = st.integers(0, 2**32 - 1)
messages = st.integers(0, 2**32 - 1)


@functools.cache
def _draws(shape: tuple[int, ...], straight: bool):
    def draws(key: jax.Array, message: jax.Array) -> dict[str, jax.Array]:
        if straight:
            key = straight_line_keys(key)
        keys = jax.random.split(key, 4)
        return {
            "split": jax.random.key_data(jax.random.split(key, shape)),
            "fold_in": jax.random.key_data(jax.random.fold_in(key, message)),
            **{
                f"bits{width}": jax.random.bits(key, shape, jnp.dtype(f"uint{width}"))
                for width in (8, 16, 32)
            },
            "vmapped split": jax.random.key_data(jax.vmap(jax.random.split)(keys)),
            "vmapped bits": jax.vmap(lambda k: jax.random.bits(k, shape))(keys),
            "normal": jax.random.normal(key, shape),
            "categorical": jax.random.categorical(key, jnp.zeros((*shape, 5))),
            "permutation": jax.random.permutation(key, 10),
        }

    return jax.jit(draws)


@given(seed=seeds, message=messages, shape=st.sampled_from(SHAPES))
def test_every_draw_equals_the_default_keys(
    seed: int, message: int, shape: tuple[int, ...]
) -> None:
    key, data = jax.random.key(seed), jnp.uint32(message)
    expected = _draws(shape, straight=False)(key, data)
    got = _draws(shape, straight=True)(key, data)
    # The same bits are promised, so integers are equal. The normal draws are floats
    # computed from them in two separately compiled programs: equal to an ulp or two.
    np.testing.assert_allclose(got.pop("normal"), expected.pop("normal"), rtol=1e-6, atol=1e-7)
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_64_bit_draws_equal_the_default_keys() -> None:
    with jax.enable_x64(True):
        key = jax.random.key(7)
        expected = jax.random.bits(key, (3, 2), jnp.uint64)
        got = jax.random.bits(straight_line_keys(key), (3, 2), jnp.uint64)
        np.testing.assert_array_equal(got, expected)
        assert got.dtype == jnp.uint64


def test_draws_past_32_bit_counters_go_to_jax(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stand-in for draws of 2**32 elements or more (too large to make here)."""
    monkeypatch.setattr(_threefry, "_LARGEST_STRAIGHT_LINE_DRAW", 4)
    key = jax.random.key(3)
    straight = straight_line_keys(key)
    np.testing.assert_array_equal(
        jax.random.key_data(jax.random.split(straight, 6)),
        jax.random.key_data(jax.random.split(key, 6)),
    )
    np.testing.assert_array_equal(jax.random.bits(straight, (2, 3)), jax.random.bits(key, (2, 3)))


def test_keys_change_type_and_back_and_nothing_else_changes() -> None:
    key = jax.random.key(1)
    tree = {
        "key": key,
        "keys": jax.random.split(key, 3),
        "rbg": jax.random.key(2, impl="rbg"),
        "raw": jax.random.PRNGKey(3),
        "array": jnp.arange(3),
        "none": None,
    }
    straight = straight_line_keys(tree)
    assert jax.random.key_impl(straight["key"]) == STRAIGHT_LINE_THREEFRY
    assert jax.random.key_impl(straight["keys"]) == STRAIGHT_LINE_THREEFRY
    assert jax.random.key_impl(straight["rbg"]) == "rbg"
    for name in ("raw", "array"):
        assert straight[name] is tree[name]
    back = standard_keys(straight)
    for name in ("key", "keys", "rbg"):
        assert back[name].dtype == tree[name].dtype
        np.testing.assert_array_equal(
            jax.random.key_data(back[name]), jax.random.key_data(tree[name])
        )


def test_keys_stay_default_without_the_partitionable_scheme() -> None:
    """The straight-line hash reproduces JAX's default (partitionable) numbers only."""
    with jax.threefry_partitionable(False):
        key = jax.random.key(5)
        assert jax.random.key_impl(straight_line_keys(key)) == "threefry2x32"
