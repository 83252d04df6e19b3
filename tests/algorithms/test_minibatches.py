"""How the learning phase deals a rollout's envs into minibatches, epoch after epoch."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx, struct

from nnx_ppo.algorithms import _learn
from nnx_ppo.algorithms.config import PPOConfig

N_ENVS, N_MINIBATCHES, N_EPOCHS, T = 12, 3, 4, 2


@struct.dataclass
class Steps:
    """What ``_select_envs`` needs of a rollout: ``(T, B)`` leaves, the metrics it drops and
    ``replace`` (which ``struct.dataclass`` gives)."""

    obs: jax.Array
    metrics: dict[str, Any]


def env_ids_seen(monkeypatch: pytest.MonkeyPatch, key: int) -> dict[str, np.ndarray]:
    """The env ids each update's loss received, leaves ``(epochs, minibatches, ...)``.

    Every input of the loss holds its env's id, so the loss reports which envs the
    minibatch took from each of them."""

    def loss_of_ids(networks, carry, transitions, advantages, targets, config):
        del config
        zero = sum(jnp.sum(p) for p in jax.tree.leaves(nnx.state(networks, nnx.Param))) * 0.0
        return zero, {
            "carry": carry,
            "obs": transitions.obs,
            "advantages": advantages,
            "targets": targets,
            "losses/approx_kl": jnp.zeros(()),
        }

    monkeypatch.setattr(_learn, "ppo_loss", loss_of_ids)
    ids = jnp.arange(N_ENVS)
    per_step = jnp.broadcast_to(ids, (T, N_ENVS))
    network = nnx.Linear(1, 1, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(network, optax.sgd(0.1), wrt=nnx.Param)
    config = PPOConfig(
        n_envs=N_ENVS, rollout_length=T, n_minibatches=N_MINIBATCHES, n_epochs=N_EPOCHS
    )
    data = (ids, Steps(per_step, {"env": {}}), per_step, per_step)
    diagnostics, ran = _learn._learn(network, optimizer, data, jax.random.key(key), config)
    assert np.asarray(ran).all()
    return jax.tree.map(np.asarray, diagnostics)


def test_each_epoch_deals_every_env_to_exactly_one_minibatch_one_per_group(monkeypatch):
    seen = env_ids_seen(monkeypatch, key=0)
    carry = seen["carry"]
    groups = N_ENVS // N_MINIBATCHES
    assert carry.shape == (N_EPOCHS, N_MINIBATCHES, groups)
    for name in ("obs", "advantages", "targets"):  # the same envs from every input
        np.testing.assert_array_equal(
            seen[name], np.broadcast_to(carry[:, :, None], (*carry.shape[:2], T, groups))
        )
    for epoch in carry:
        assert sorted(epoch.ravel()) == list(range(N_ENVS))
        for minibatch in epoch:  # one env of each group of neighbours
            np.testing.assert_array_equal(minibatch // N_MINIBATCHES, np.arange(groups))


def test_the_deal_is_shuffled_and_differs_between_epochs_and_keys(monkeypatch):
    first = env_ids_seen(monkeypatch, key=0)["carry"]
    columns = first % N_MINIBATCHES  # which env of its group each minibatch took
    in_order = np.broadcast_to(np.arange(N_MINIBATCHES)[:, None], columns.shape[1:])
    assert any((epoch != in_order).any() for epoch in columns)  # not minibatch m <- env m
    assert len({epoch.tobytes() for epoch in first}) == N_EPOCHS  # a new deal every epoch
    other = env_ids_seen(monkeypatch, key=1)["carry"]
    assert not np.array_equal(first, other)
