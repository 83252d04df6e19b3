"""Env contract errors, raised while JAX traces: a batched reward, and a dtype that changes."""

import jax
import jax.numpy as jnp
from flax import nnx

import nnx_ppo
from nnx_ppo.algorithms.rollout import reset_envs, unroll_env
from nnx_ppo.envs import State
from nnx_ppo.networks.factories import make_default_network


class Drift:
    observation_size = 1
    action_size = 1

    def reset(self, rng):
        return State(
            obs=jnp.zeros(1), reward=jnp.zeros(()), done=jnp.zeros(()), metrics={}, info={}
        )

    def step(self, state, action):
        return state.replace(obs=state.obs + action, reward=-jnp.abs(state.obs[0]))


class SelfBatched(Drift):
    def reset(self, rng):
        # Bug: a reward per env, though the library vmaps reset over the envs itself.
        return super().reset(rng).replace(reward=jnp.zeros(8))


class IntegerStep(Drift):
    def step(self, state, action):
        # Bug: reset returned a float32 observation; the env state is a scan carry.
        return super().step(state, action).replace(obs=jnp.round(state.obs).astype(jnp.int32))


keys = jax.random.split(jax.random.key(0), 8)
try:
    reset_envs(SelfBatched(), keys)
except nnx_ppo.ContractError as error:
    print(error, end="\n\n")

env = IntegerStep()
network = make_default_network(env, nnx.Rngs(0), hidden_sizes=(4,))
try:
    unroll_env(env, reset_envs(env, keys), network, network.initialize_state(8), 2, keys[0])
except nnx_ppo.ContractError as error:
    print(error)
