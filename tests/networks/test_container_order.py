"""Containers: child order is static structure (eager, compiled, merged and restored alike),
and reset_state reaches every child."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from nnx_ppo.algorithms.checkpointing import load_checkpoint, make_checkpoint_fn
from nnx_ppo.algorithms.ppo import new_training_state
from nnx_ppo.envs import make
from nnx_ppo.networks import GRU, Concat, Delay, Dense, Parallel, Sequential


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


def _recurrent_and_delay() -> dict[str, GRU | Delay]:
    return {
        "gru": GRU(2, 3, nnx.Rngs(0)),
        "delay": Delay(jnp.zeros(2), k_steps=2, initial_value=0.5),
    }


def test_every_containers_reset_state_resets_every_child() -> None:
    x = jnp.arange(8.0).reshape(4, 2) / 8
    children = _recurrent_and_delay()
    containers = {
        "Sequential": (Sequential([children["delay"], children["gru"]]), x),
        "Parallel": (Parallel(_recurrent_and_delay()), x),
        "Concat": (Concat(_recurrent_and_delay()), {"gru": x, "delay": x}),
    }
    for name, (container, inputs) in containers.items():
        initial = container.initialize_state(4)
        state = initial
        for _ in range(3):
            state = container(state, inputs).next_state
        for leaf, (moved, fresh) in enumerate(
            zip(jax.tree.leaves(state), jax.tree.leaves(initial), strict=True)
        ):
            assert not np.array_equal(moved, fresh), f"{name}: carry leaf {leaf} never moved"
        for got, fresh in zip(
            jax.tree.leaves(container.reset_state(state)), jax.tree.leaves(initial), strict=True
        ):
            np.testing.assert_array_equal(got, fresh, err_msg=name)
