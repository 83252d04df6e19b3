"""Writing an environment: one unbatched env, Playground-style State, a time limit."""

from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from nnx_ppo.algorithms.rollout import reset_envs, unroll_env
from nnx_ppo.envs import State, time_limit
from nnx_ppo.networks.factories import make_default_network


class Reach1D:
    """Move a point on a line to the origin. Terminates there; truncates after max_steps."""

    observation_size: ClassVar[int] = 1
    action_size: ClassVar[int] = 1
    discrete_actions: ClassVar[bool] = False

    def __init__(self, max_steps: int = 20):
        self.max_steps = max_steps

    def reset(self, rng):
        return State(
            obs=jax.random.uniform(rng, (1,), minval=-1.0, maxval=1.0),
            reward=jnp.zeros(()),
            done=jnp.zeros((), jnp.float32),
            metrics={"distance": jnp.zeros(())},
            info={"truncated": jnp.zeros((), bool)},
            data={"steps": jnp.zeros((), jnp.int32)},
        )

    def step(self, state, action):
        position = state.obs + 0.1 * jnp.clip(action, -1.0, 1.0)
        distance = jnp.abs(position[0])
        steps = state.data["steps"] + 1
        done, truncated = time_limit(distance < 0.05, steps, self.max_steps)
        return State(
            obs=position,
            reward=-distance,
            done=done,
            metrics={"distance": distance},
            info={"truncated": truncated},
            data={"steps": steps},
        )


env = Reach1D(max_steps=5)
network = make_default_network(env, nnx.Rngs(0), hidden_sizes=(8,))
n_envs = 4
env_states = reset_envs(env, jax.random.split(jax.random.key(0), n_envs))
carry, env_states, rollout = unroll_env(
    env, env_states, network, network.initialize_state(n_envs), 6, jax.random.key(1)
)
print("rewards:", rollout.rewards.shape, "truncated at step 5:", rollout.truncated[4])
kept = jnp.all(rollout.next_obs[4] != rollout.obs[5])
print("next_obs keeps the final observation of an ended episode:", bool(kept))
