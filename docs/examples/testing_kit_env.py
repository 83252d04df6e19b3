"""check_env on a custom environment whose time limit forgets to end the episode."""

import jax
import jax.numpy as jnp

from nnx_ppo.envs import State
from nnx_ppo.testing import ContractPropertyError, check_env


class Drift:
    """A point pushed by its action; the episode is cut after ``max_steps`` steps."""

    action_size = 1

    def __init__(self, max_steps=3):
        self.max_steps = max_steps

    def reset(self, rng):
        return State(
            obs=jax.random.uniform(rng, (1,), minval=-1, maxval=1),
            reward=jnp.zeros(()),
            done=jnp.zeros((), jnp.float32),
            metrics={},
            info={"truncated": jnp.zeros((), bool)},
            data={"steps": jnp.zeros((), jnp.int32)},
        )

    def step(self, state, action):
        steps = state.data["steps"] + 1
        truncated = steps >= self.max_steps
        return State(
            obs=state.obs + 0.1 * action,
            reward=-jnp.abs(state.obs[0]),
            done=truncated.astype(jnp.float32),
            metrics={},
            info={"truncated": truncated},
            data={"steps": steps},
        )


class ForgetfulDrift(Drift):
    def step(self, state, action):
        # Bug: the time limit is reported but the episode goes on.
        return super().step(state, action).replace(done=jnp.zeros((), jnp.float32))


check_env(Drift(), n_envs=4, steps=5)
print("Drift passes every property.")
try:
    check_env(ForgetfulDrift(), n_envs=4, steps=5)
except ContractPropertyError as error:
    print(error)
