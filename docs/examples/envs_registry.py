"""The registry, one unbatched env, and how an episode ends."""

import jax
import jax.numpy as jnp

from nnx_ppo import envs

print("built-in:", envs.names()[:4])

env = envs.make("cartpole")
print(f"cartpole: {env.observation_size} obs, {env.action_size} actions, {env.discrete_actions=}")
state = env.reset(jax.random.key(0))
for field in (state.obs, state.reward, state.done, state.info["truncated"]):
    print(f"  {field.dtype}{field.shape}", end="")
print("  <- obs, reward, done, truncated after reset")

state = env.step(state, jnp.asarray(1))  # one integer scalar: push right
print("after one step: reward", float(state.reward), "done", float(state.done))

# A time limit ends the episode (done = 1.0) and marks it as a truncation.
pendulum = envs.make("pendulum", max_steps=3)
state = pendulum.reset(jax.random.key(1))
for _ in range(3):
    state = pendulum.step(state, jnp.zeros(1))
print(f"after 3 of 3 steps: done {state.done}, truncated {state.info['truncated']}")

# The library vmaps reset and step; an env never sees the batch axis.
batch = jax.vmap(env.reset)(jax.random.split(jax.random.key(2), 8))
print("8 envs:", batch.obs.shape, batch.done.shape)

two = envs.make("two_agent")
print("two_agent rewards:", jax.tree.map(jnp.shape, two.reset(jax.random.key(3)).reward))

try:
    envs.make("cartpol")
except ValueError as error:
    print(error)
