"""A container's child order is static structure: eager, compiled, merged and restored alike."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from nnx_ppo.algorithms.checkpointing import load_checkpoint, make_checkpoint_fn
from nnx_ppo.algorithms.ppo import new_training_state
from nnx_ppo.envs import make
from nnx_ppo.networks import Concat, Dense


def _declared_out_of_sorted_order(seed: int) -> Concat:
    # "z" before "a": NNX keeps a Dict's keys sorted after split/merge.
    return Concat(z=Dense(1, 1, nnx.Rngs(seed)), a=Dense(1, 2, nnx.Rngs(seed + 1)))


def _reference(module: Concat, x: dict[str, jnp.ndarray]) -> np.ndarray:
    parts = []
    for key in ("z", "a"):  # the declared order, written out independently
        dense = module.components[key]
        kernel = np.asarray(dense.linear.kernel[...])
        bias = np.asarray(dense.linear.bias[...])
        parts.append(np.asarray(x[key]) @ kernel + bias)
    return np.concatenate(parts, axis=-1)


X = {"z": jnp.full((2, 1), 1.0), "a": jnp.full((2, 1), 2.0)}
STATE = {"z": (), "a": ()}


def test_concat_order_is_the_declared_one_in_every_execution_mode() -> None:
    module = _declared_out_of_sorted_order(0)
    expected = _reference(module, X)
    eager = module(STATE, X).output
    compiled = nnx.jit(lambda m, s, x: m(s, x).output)(module, STATE, X)
    merged = nnx.merge(*nnx.split(module))(STATE, X).output
    for actual in (eager, compiled, merged):
        np.testing.assert_allclose(np.asarray(actual), expected, rtol=1e-6)


def test_concat_order_survives_a_checkpoint_round_trip(tmp_path) -> None:
    env = make("cartpole")
    saved = _declared_out_of_sorted_order(0)
    make_checkpoint_fn(tmp_path)(new_training_state(env, saved, 2, seed=0), 1)

    restored = _declared_out_of_sorted_order(7)
    load_checkpoint(tmp_path, restored)

    np.testing.assert_allclose(
        np.asarray(restored(STATE, X).output), _reference(saved, X), rtol=1e-6
    )
