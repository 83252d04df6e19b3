"""Every public function of the PPO engine runs inside jax.jit / nnx.jit with the checks on."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import nnx_ppo
from nnx_ppo.algorithms.config import PPOConfig
from nnx_ppo.algorithms.ppo import compute_advantages, gae, ppo_loss
from nnx_ppo.algorithms.rollout import eval_rollout, reset_envs, tree_where, unroll_env
from nnx_ppo.envs import make
from nnx_ppo.networks.factories import make_lstm_actor_critic

T, B = 6, 4


def test_the_engine_runs_compiled_with_checks_on() -> None:
    env = make("memory")
    network = make_lstm_actor_critic(
        env.observation_size, env.action_size, 8, nnx.Rngs(0), discrete=True
    )
    config = PPOConfig(n_envs=B, rollout_length=T, n_minibatches=2)
    with nnx_ppo.checks(True):
        env_states = jax.jit(functools.partial(reset_envs, env))(
            jax.random.split(jax.random.key(0), B)
        )
        carry = network.initialize_state(B)

        @nnx.jit
        def collect(network, carry, env_states, key):
            return unroll_env(env, env_states, network, carry, T, key)

        _, next_env_states, transitions = collect(network, carry, env_states, jax.random.key(1))
        assert jax.tree.leaves(transitions.rewards)[0].shape == (T, B)

        advantages, targets = jax.jit(compute_advantages, static_argnums=(1, 2))(
            transitions, 0.95, 0.99
        )
        values = transitions.network_output.value_estimates
        direct = jax.jit(gae, static_argnums=(5, 6))(
            transitions.rewards,
            values,
            transitions.next_value_estimates,
            transitions.done,
            transitions.truncated,
            0.95,
            0.99,
        )
        np.testing.assert_allclose(np.asarray(direct), np.asarray(advantages), rtol=1e-6)

        @nnx.jit
        def loss(network, carry, transitions, advantages, targets):
            return ppo_loss(network, carry, transitions, advantages, targets, config)

        total, _ = loss(network, carry, transitions, advantages, targets)
        assert np.isfinite(float(total))

        mask = jnp.arange(B) % 2 == 0
        selected = jax.jit(tree_where)(mask, env_states, next_env_states)
        np.testing.assert_array_equal(
            np.asarray(selected.obs)[1], np.asarray(next_env_states.obs)[1]
        )

        network.eval()
        metrics = jax.jit(eval_rollout, static_argnums=(0, 2, 3))(
            env, network, 8, 10, jax.random.key(2)
        )
        assert "eval/episode_reward/mean" in metrics
