"""A rollout is replayed in one flat batch when the carry cannot follow the parameters.

The loss replays it so; so does the rollout for its values.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_ppo.algorithms import rollout
from nnx_ppo.algorithms.config import PPOConfig
from nnx_ppo.algorithms.ppo import compute_advantages, ppo_loss
from nnx_ppo.algorithms.rollout import reset_envs, unroll_env
from nnx_ppo.envs import make
from nnx_ppo.networks.factories import make_default_network
from nnx_ppo.networks.types import PPONetworkOutput, StatefulModule, StatefulModuleOutput

N_ENVS, STEPS = 4, 6


def rollout_of(env, network):
    # Compiled: run eagerly, a continuous policy's rollout compiles each op on its own.
    @nnx.jit
    def unrolled(network):
        env_states = reset_envs(env, jax.random.split(jax.random.key(0), N_ENVS))
        carry = network.initialize_state(N_ENVS)
        _, _, transitions = unroll_env(env, env_states, network, carry, STEPS, jax.random.key(1))
        return carry, transitions

    return unrolled(network)


def loss_and_gradient(network, carry, transitions, monkeypatch, scan: bool):
    if scan:
        monkeypatch.setattr(rollout, "_carry_follows_parameters", lambda *_: True)
    advantages, targets = compute_advantages(transitions, 0.95, 0.99)
    config = PPOConfig(n_envs=N_ENVS, n_minibatches=1)

    @nnx.jit  # traced here, while the patch (if any) is in place
    def value_and_gradient(network, carry, transitions, advantages, targets):
        return nnx.value_and_grad(
            lambda n: ppo_loss(n, carry, transitions, advantages, targets, config), has_aux=True
        )(network)

    (loss, diagnostics), grads = value_and_gradient(
        network, carry, transitions, advantages, targets
    )
    monkeypatch.undo()
    return loss, diagnostics, grads


@pytest.mark.parametrize("env_name", ["pendulum", "cartpole"])
def test_flat_replay_equals_the_scan_for_a_feedforward_policy(env_name, monkeypatch):
    env = make(env_name)
    network = make_default_network(env, nnx.Rngs(0), hidden_sizes=(8,))
    carry, transitions = rollout_of(env, network)
    assert transitions.carries is not None  # per-env sampler keys only
    first = jax.tree.map(lambda x: x[0], transitions.obs)
    assert not rollout._carry_follows_parameters(network, carry, first)
    flat = loss_and_gradient(network, carry, transitions, monkeypatch, scan=False)
    scanned = loss_and_gradient(network, carry, transitions, monkeypatch, scan=True)
    np.testing.assert_allclose(flat[0], scanned[0], rtol=1e-5, atol=1e-6)
    for a, b in zip(jax.tree.leaves(flat[2]), jax.tree.leaves(scanned[2]), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_a_recurrent_carry_is_replayed_by_scanning():
    env = make("memory")
    network = make_default_network(env, nnx.Rngs(0), hidden_sizes=(8,))  # an LSTM
    carry, transitions = rollout_of(env, network)
    assert transitions.carries is None  # a float hidden state: not kept
    advantages, targets = compute_advantages(transitions, 0.95, 0.99)
    config = PPOConfig(n_envs=N_ENVS, n_minibatches=1)
    loss, _ = ppo_loss(network, carry, transitions, advantages, targets, config)
    assert np.isfinite(loss)


class ArgmaxMemory(StatefulModule):
    """An integer carry chosen by the parameters: kept by the rollout, but it follows them."""

    def __init__(self) -> None:
        self.w = nnx.Param(jnp.ones((2,)))

    def __call__(self, state, x, rollout_extras=None) -> StatefulModuleOutput:
        choice = jnp.argmax(x * self.w[...], axis=-1).astype(jnp.int32)
        value = self.w[...][0] * x[:, 0]
        output = PPONetworkOutput(jnp.zeros((x.shape[0], 1)), value, value)
        return StatefulModuleOutput(choice + state, output, jnp.zeros(()), {})

    def initialize_state(self, batch_size: int):
        return jnp.zeros(batch_size, jnp.int32)

    def reset_state(self, prev_state):
        return jnp.zeros_like(prev_state)


@pytest.mark.parametrize("depends", [True, False])
def test_the_data_flow_check_sees_a_parameter_reaching_the_carry(depends):
    network = ArgmaxMemory()
    x = jnp.ones((3, 2))
    if not depends:
        network.w = nnx.Variable(network.w[...])  # no longer a parameter
    assert rollout._carry_follows_parameters(network, network.initialize_state(3), x) is depends


class LearnedEpisodeMode(ArgmaxMemory):
    """The call keeps its integer carry; each episode starts from a mode the parameters pick."""

    def __call__(self, state, x, rollout_extras=None) -> StatefulModuleOutput:
        value = self.w[...][0] * x[:, 0] + state.astype(jnp.float32)
        output = PPONetworkOutput(jnp.zeros((x.shape[0], 1)), value, value)
        return StatefulModuleOutput(state, output, jnp.zeros(()), {})

    def reset_state(self, prev_state):
        return jnp.full_like(prev_state, jnp.argmax(self.w[...]).astype(prev_state.dtype))


def test_the_data_flow_check_sees_a_parameter_reaching_the_reset_carry():
    # A replay from stored carries would keep the mode the rollout's parameters picked.
    network = LearnedEpisodeMode()
    assert rollout._carry_follows_parameters(network, network.initialize_state(3), jnp.ones((3, 2)))


def per_step_values(network, carry, transitions):
    """The value of each step's observation, the network called step by step from the carries."""

    def at(tree, t):
        return jax.tree.map(lambda x: x[t], tree)

    values = []
    for t in range(STEPS):
        if transitions.carries is None:  # a recurrent carry: stepped, reset where episodes ended
            out = network(carry, at(transitions.obs, t))
            ended = rollout.episode_ended(at(transitions.done, t))
            carry = rollout.tree_where(ended, network.reset_state(out.next_state), out.next_state)
        else:
            out = network(at(transitions.carries, t), at(transitions.obs, t))
        values.append(out.output.value_estimates)
    return jnp.stack(values)


@pytest.mark.parametrize("env_name", ["pendulum", "cartpole", "memory"])
def test_the_rollout_values_are_each_steps_value(env_name, flat_replay_callers, monkeypatch):
    """Flat-replayed (feedforward) or computed in the scan (LSTM), they are the step's own."""
    env = make(env_name)
    network = make_default_network(env, nnx.Rngs(0), hidden_sizes=(8,))
    carry, transitions = rollout_of(env, network)
    callers = list(flat_replay_callers)
    monkeypatch.undo()
    recurrent = env_name == "memory"
    assert (transitions.carries is None) == recurrent
    assert callers == ([] if recurrent else ["unroll_env"])  # flat only where the carry allows
    expected = per_step_values(network, carry, transitions)
    np.testing.assert_allclose(
        transitions.network_output.value_estimates, expected, rtol=1e-5, atol=1e-6
    )
    ended = np.asarray(rollout.episode_ended(transitions.done))
    following = np.asarray(transitions.next_value_estimates)[:-1][~ended[:-1]]
    np.testing.assert_allclose(
        following, np.asarray(expected)[1:][~ended[:-1]], rtol=1e-5, atol=1e-6
    )
