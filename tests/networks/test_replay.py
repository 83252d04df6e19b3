"""Loss replay reproduces rollout: samplers, bottlenecks and a mixed network, whole and sliced.

A rollout runs ``T`` steps from an initial carry with ``rollout_extras=None``,
resetting the carry of envs that finished, and stacks what the network emitted.
Replay runs the same steps from the same initial carry, feeding the stored
extras back. The two must agree, also when replay sees only a minibatch of
envs (the carry, inputs and extras sliced along ``B``), and the stored actions
must be scored, never resampled.

Agreement is a property of the maths, not of one compiled program: XLA picks
different kernels (and summation orders) for a batch of 4 and a slice of 2, or
for a program with stored extras and one without, and float32 results then
differ in the last bits (7e-9 has been seen on CPUs without AVX-512). Outputs
are compared to ``FLOAT32``: a few hundred ulps of float32 (eps 1.2e-7) over
the handful of layers here, far below the O(1) gap that a resampled action or
a wrong carry row makes. What is copied rather than computed (the stored
extras replay hands back) is compared exactly.
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import nnx_ppo
from nnx_ppo.algorithms.rollout import tree_where
from nnx_ppo.networks.adapter import PPOAdapter
from nnx_ppo.networks.containers import Sequential, Splitter
from nnx_ppo.networks.delay import Delay
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.normalizer import Normalizer
from nnx_ppo.networks.recurrent import LSTM
from nnx_ppo.networks.sampling_layers import (
    CategoricalSampler,
    NormalSampler,
    NormalTanhSampler,
)
from nnx_ppo.networks.types import PPONetworkOutput, StatefulModule
from nnx_ppo.networks.utils import Flattener, Map
from nnx_ppo.networks.variational import AR1VariationalBottleneck, VariationalBottleneck

T, B = 4, 4
MINIBATCH = np.array([3, 1])  # permuted on purpose: rows must follow their env
FLOAT32 = {"rtol": 1e-5, "atol": 1e-6}
"""Tolerance of recomputed float32 outputs (see the module docstring)."""


@nnx.jit
def _step(net: StatefulModule, carry: Any, x: Any, extras: Any, done: Any) -> Any:
    carry = tree_where(done, jax.vmap(net.reset_state)(carry), carry)
    return net(carry, x, extras)


def _run(
    net: StatefulModule, carry: Any, inputs: Any, dones: np.ndarray, extras: Any = None
) -> tuple[list[Any], Any]:
    """Step ``net`` over the ``T`` leading axis of ``inputs``; return outputs and stacked extras.

    ``dones[t]`` marks the envs whose episode ended at step ``t - 1``: their carry is
    reset before step ``t``. With ``extras`` (stacked ``(T, B, ...)``) this is replay.
    """
    outputs, emitted = [], []
    for t in range(dones.shape[0]):
        step_extras = None if extras is None else jax.tree.map(lambda e, t=t: e[t], extras)
        x = jax.tree.map(lambda v, t=t: v[t], inputs)
        out = _step(net, carry, x, step_extras, jnp.asarray(dones[t]))
        outputs.append(out.output)
        emitted.append(out.rollout_extras)
        carry = out.next_state
    return outputs, jax.tree.map(lambda *leaves: jnp.stack(leaves), *emitted)


def _rows(tree: Any, rows: np.ndarray, axis: int) -> Any:
    return jax.tree.map(lambda leaf: jnp.take(leaf, rows, axis=axis), tree)


def _dones(rng: np.random.Generator, steps: int, batch: int) -> np.ndarray:
    dones = rng.random((steps, batch)) < 0.3
    dones[0] = False
    return dones


def _assert_same(rollout: list[Any], replay: list[Any]) -> None:
    for step_rollout, step_replay in zip(rollout, replay, strict=True):
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(a, b, **FLOAT32), step_rollout, step_replay
        )


def _assert_rows(full: list[Any], sliced: list[Any], rows: np.ndarray) -> None:
    for step_full, step_sliced in zip(full, sliced, strict=True):
        jax.tree.map(
            lambda f, s: np.testing.assert_allclose(np.asarray(f)[rows], s, **FLOAT32),
            step_full,
            step_sliced,
        )


# ------------------------------------------------------------ single stochastic modules

WIDTHS = {"tanh": 4, "normal": 2, "categorical": 3, "bottleneck": 4, "ar1": 4}
SAMPLERS = ("tanh", "normal", "categorical")


def _every_stochastic_module() -> Sequential:
    """Each sampler and bottleneck on its own slice of one input: one compile for all five."""
    return Sequential(
        [
            Splitter(**WIDTHS),
            Map(
                tanh=NormalTanhSampler(nnx.Rngs(1), entropy_weight=0.1),
                normal=NormalSampler(nnx.Rngs(2), entropy_weight=0.1, action_size=2),
                categorical=CategoricalSampler(nnx.Rngs(3), entropy_weight=0.1),
                bottleneck=VariationalBottleneck(2, nnx.Rngs(4), kl_weight=0.1),
                ar1=AR1VariationalBottleneck(2, nnx.Rngs(5), kl_weight=0.1),
            ),
        ]
    )


def test_replay_reproduces_every_stochastic_module_whole_and_sliced():
    assert nnx_ppo.checks_enabled()
    net = _every_stochastic_module()
    rng = np.random.default_rng(0)
    inputs = jnp.asarray(rng.normal(size=(T, B, sum(WIDTHS.values()))), jnp.float32)
    dones = _dones(rng, T, B)
    carry = net.initialize_state(B)

    rollout, extras = _run(net, carry, inputs, dones)
    replay, replay_extras = _run(net, carry, inputs, dones, extras)
    _assert_same(rollout, replay)
    jax.tree.map(np.testing.assert_array_equal, extras, replay_extras)  # handed back, not computed
    for name in WIDTHS:  # different steps draw different numbers
        first, last = jax.tree.leaves(rollout[0][name])[0], jax.tree.leaves(rollout[-1][name])[0]
        assert not np.array_equal(first, last), name

    sliced, _ = _run(
        net,
        _rows(carry, MINIBATCH, 0),
        _rows(inputs, MINIBATCH, 1),
        dones[:, MINIBATCH],
        _rows(extras, MINIBATCH, 1),
    )
    _assert_rows(rollout, sliced, MINIBATCH)

    # Under new parameters (here: new inputs) replay scores the stored actions, never
    # resamples. Scoring itself is checked against SciPy in test_sampling_layers.py.
    updated, _ = _run(net, carry, 1.5 * inputs + 0.7, dones, extras)
    for t in range(T):
        for name in SAMPLERS:
            np.testing.assert_allclose(
                updated[t][name]["action"], rollout[t][name]["action"], **FLOAT32
            )
            assert not np.allclose(
                updated[t][name]["log_likelihood"], rollout[t][name]["log_likelihood"]
            )


# ----------------------------------------------------------------- a mixed network

OBS, HIDDEN, LATENT, ACTIONS = 3, 6, 2, 2


def _mixed_network(rngs: nnx.Rngs) -> Sequential:
    """Normalizer -> Delay -> Dense -> LSTM -> adapter(bottleneck + tanh sampler, value)."""
    return Sequential(
        [
            Normalizer(OBS),
            Delay(np.zeros(OBS, np.float32), k_steps=2),
            Dense(OBS, HIDDEN, rngs, activation=nnx.tanh),
            LSTM(HIDDEN, HIDDEN, rngs),
            PPOAdapter(
                action=Sequential(
                    [
                        Dense(HIDDEN, 2 * LATENT, rngs),
                        VariationalBottleneck(LATENT, rngs, kl_weight=0.01),
                        Dense(LATENT, 2 * ACTIONS, rngs),
                        NormalTanhSampler(rngs, entropy_weight=0.01),
                    ]
                ),
                value=Dense(HIDDEN, 1, rngs),
            ),
        ]
    )


def test_a_recurrent_delayed_noisy_network_replays_exactly_whole_and_sliced():
    net = _mixed_network(nnx.Rngs(7))
    rng = np.random.default_rng(2)
    observations = jnp.asarray(3.0 + 2.0 * rng.normal(size=(T + 1, B, OBS)), jnp.float32)
    dones = _dones(rng, T + 1, B)
    carry = net.initialize_state(B)

    rollout, extras = _run(net, carry, observations, dones)
    replay, _ = _run(net, carry, observations, dones, extras)
    _assert_same(rollout, replay)
    assert isinstance(rollout[0], PPONetworkOutput)
    assert rollout[0].value_estimates.shape == (B,)
    assert not np.array_equal(rollout[0].actions, rollout[1].actions)

    sliced, _ = _run(
        net,
        _rows(carry, MINIBATCH, 0),
        _rows(observations, MINIBATCH, 1),
        dones[:, MINIBATCH],
        _rows(extras, MINIBATCH, 1),
    )
    _assert_rows(rollout, sliced, MINIBATCH)

    # The stored extras carry the normalizer's inputs; folding them in changes the statistics.
    nnx.jit(lambda n, e: n.update_statistics(e))(net, extras)
    normalizer = net[0]
    assert isinstance(normalizer, Normalizer)
    assert float(normalizer.counter[...]) == (T + 1) * B
    np.testing.assert_allclose(normalizer.mean[...], observations.mean(axis=(0, 1)), rtol=1e-5)


# ------------------------------------------- dict observations and dict actions, scanned


def _dict_network(rngs: nnx.Rngs) -> Sequential:
    return Sequential(
        [
            Normalizer({"pos": 3, "vel": 2}),
            Flattener(),
            Dense(5, HIDDEN, rngs, activation=nnx.relu),
            PPOAdapter(
                action=Sequential(
                    [
                        Dense(HIDDEN, 2 * ACTIONS + 3, rngs),
                        Splitter(arm=2 * ACTIONS, gripper=3),
                        Map(
                            arm=NormalTanhSampler(rngs, entropy_weight=0.01),
                            gripper=CategoricalSampler(rngs, entropy_weight=0.01),
                        ),
                    ]
                ),
                value=Sequential([Dense(HIDDEN, 2, rngs), Splitter(task=1, energy=1)]),
            ),
        ]
    )


@nnx.jit
def _scan_rollout(net: StatefulModule, carry: Any, observations: Any) -> tuple[Any, Any]:
    def step(carry: Any, obs: Any) -> tuple[Any, Any]:
        out = net(carry, obs)
        return out.next_state, (out.output, out.rollout_extras, out.regularization_loss)

    _, (outputs, extras, regularization) = jax.lax.scan(step, carry, observations)
    return (outputs, regularization), extras


@nnx.jit
def _scan_replay(net: StatefulModule, carry: Any, observations: Any, extras: Any) -> Any:
    def step(carry: Any, inputs: Any) -> tuple[Any, Any]:
        out = net(carry, *inputs)
        return out.next_state, (out.output, out.regularization_loss)

    return jax.lax.scan(step, carry, (observations, extras))[1]


def test_dict_observations_and_dict_actions_replay_under_jit_and_scan():
    assert nnx_ppo.checks_enabled()
    net = _dict_network(nnx.Rngs(11))
    rng = np.random.default_rng(3)
    observations = {
        "pos": jnp.asarray(rng.normal(size=(T, B, 3)), jnp.float32),
        "vel": jnp.asarray(rng.normal(size=(T, B, 2)), jnp.float32),
    }
    carry = net.initialize_state(B)
    (outputs, regularization), extras = _scan_rollout(net, carry, observations)

    assert isinstance(outputs, PPONetworkOutput)
    assert outputs.actions["arm"].shape == (T, B, ACTIONS)
    assert outputs.actions["gripper"].shape == (T, B)
    assert outputs.actions["gripper"].dtype == jnp.int32
    assert set(outputs.loglikelihoods) == {"arm", "gripper"}
    assert outputs.loglikelihoods["gripper"].shape == (T, B)
    assert set(outputs.value_estimates) == {"task", "energy"}
    assert outputs.value_estimates["task"].shape == (T, B)
    assert regularization.shape == (T, B)

    replayed, replay_regularization = _scan_replay(net, carry, observations, extras)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, **FLOAT32), outputs, replayed)
    np.testing.assert_allclose(regularization, replay_regularization, **FLOAT32)

    sliced, _ = _scan_replay(
        net,
        _rows(carry, MINIBATCH, 0),
        _rows(observations, MINIBATCH, 1),
        _rows(extras, MINIBATCH, 1),
    )
    jax.tree.map(
        lambda full, part: np.testing.assert_allclose(
            np.asarray(full)[:, MINIBATCH], part, **FLOAT32
        ),
        outputs,
        sliced,
    )
