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


def learn_with(monkeypatch: pytest.MonkeyPatch, loss: Any, key: int) -> tuple[Any, Any, Any]:
    """``_learn`` with ``loss`` as the PPO loss, on a 1x1 linear network trained by SGD
    (learning rate 0.1) and a rollout whose every input holds its env's id.

    Returns the network, the diagnostics of every update and which epochs ran."""
    monkeypatch.setattr(_learn, "ppo_loss", loss)
    ids = jnp.arange(N_ENVS)
    per_step = jnp.broadcast_to(ids, (T, N_ENVS))
    network = nnx.Linear(1, 1, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(network, optax.sgd(0.1), wrt=nnx.Param)
    config = PPOConfig(
        n_envs=N_ENVS, rollout_length=T, n_minibatches=N_MINIBATCHES, n_epochs=N_EPOCHS
    )
    data = (ids, Steps(per_step, {"env": {}}), per_step, per_step)
    diagnostics, ran = _learn._learn(network, optimizer, data, jax.random.key(key), config)
    return network, diagnostics, ran


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

    _, diagnostics, ran = learn_with(monkeypatch, loss_of_ids, key)
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


@pytest.mark.parametrize(
    ("target_kl", "expected_ran"),
    # Each epoch's minibatches report approximate KLs of 0.01 and 0.03: the epoch's
    # mean is 0.02, so 0.025 runs every epoch (their sum, 0.04, would stop after one).
    [(0.025, [True, True, True]), (0.015, [True, False, False])],
)
def test_target_kl_compares_the_epochs_mean_kl_and_skips_the_epochs_after(target_kl, expected_ran):
    def epoch(state, key):
        del key
        return state + 1.0, {"losses/approx_kl": jnp.asarray([0.01, 0.03])}

    state, diagnostics, ran = _learn._epochs_until_kl(
        epoch, jnp.zeros(()), jax.random.split(jax.random.key(0), 3), target_kl
    )
    np.testing.assert_array_equal(ran, expected_ran)
    assert float(state) == sum(expected_ran)  # skipped epochs leave the state alone
    kls = np.asarray(diagnostics["losses/approx_kl"])
    assert np.isnan(kls[~np.asarray(expected_ran)]).all()
    np.testing.assert_allclose(kls[np.asarray(expected_ran)], [[0.01, 0.03]] * sum(expected_ran))


def test_grad_norm_is_the_norm_of_each_updates_gradient(monkeypatch):
    # A loss linear in the parameters: every update's gradient is (3, 4), norm 5,
    # whatever the parameters have become.
    def linear_loss(networks, carry, transitions, advantages, targets, config):
        del carry, transitions, advantages, targets, config
        loss = 3.0 * jnp.sum(networks.kernel[...]) + 4.0 * jnp.sum(networks.bias[...])
        return loss, {"losses/approx_kl": jnp.zeros(())}

    network, diagnostics, _ = learn_with(monkeypatch, linear_loss, key=0)
    np.testing.assert_allclose(diagnostics["grad_norm"], np.full((N_EPOCHS, N_MINIBATCHES), 5.0))
    # Each update moved the parameters by 0.1 * (3, 4).
    initial_bias = nnx.Linear(1, 1, rngs=nnx.Rngs(0)).bias[...]
    np.testing.assert_allclose(
        network.bias[...], initial_bias - 0.4 * N_EPOCHS * N_MINIBATCHES, atol=1e-5
    )
