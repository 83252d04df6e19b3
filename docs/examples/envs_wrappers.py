"""EpisodeWrapper (a time limit marked as truncation) and RewardScalingWrapper."""

import jax
import jax.numpy as jnp

from nnx_ppo import envs
from nnx_ppo.wrappers import EpisodeWrapper, RewardScalingWrapper

env = RewardScalingWrapper(EpisodeWrapper(envs.make("cartpole"), max_len=3), reward_scale=0.1)
print("forwarded attributes:", env.action_size, env.discrete_actions)

state = env.reset(jax.random.key(0))
for _ in range(3):
    state = env.step(state, jnp.asarray(0))
    counter, truncated = state.info["step_counter"], state.info["truncated"]
    print(f"step {counter}: reward {state.reward:.1f}, done {state.done}, truncated {truncated}")

# Opt in to staggered starts, so envs reset together drift apart in time.
staggered = EpisodeWrapper(envs.make("pendulum"), max_len=100, random_initial_step=True)
counters = jax.vmap(staggered.reset)(jax.random.split(jax.random.key(1), 5)).info["step_counter"]
print("initial counters:", counters)
