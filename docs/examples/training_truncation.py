"""GAE at an episode's end: a time limit bootstraps from V(final obs), a termination from 0."""

import jax.numpy as jnp

from nnx_ppo.algorithms.ppo import gae

# Two envs, three steps. Both episodes end at step 1: env 0 by its time limit
# (truncated), env 1 by termination. A new episode starts at step 2.
rewards = jnp.ones((3, 2))
values = jnp.full((3, 2), 0.5)  # V(obs_t)
next_values = jnp.full((3, 2), 0.5).at[1].set(2.0)  # V(next_obs_t), pre-reset
done = jnp.array([[False, False], [True, True], [False, False]])
truncated = jnp.array([[False, False], [True, False], [False, False]])

advantages = gae(rewards, values, next_values, done, truncated, lambda_=0.95, gamma=0.9)
print(f"env 0 (time limit), step 1:  {advantages[1, 0]:.4f}  (1 + 0.9 * 2.0 - 0.5)")
print(f"env 1 (terminated), step 1:  {advantages[1, 1]:.4f}  (1 - 0.5)")
print(f"env 0, step 0:               {advantages[0, 0]:.4f}  (1 + 0.45 - 0.5 + 0.855 * 2.3)")
