"""Delay: the output at step t is the input of step t - k; a reset refills the line."""

import jax.numpy as jnp

from nnx_ppo.networks.delay import Delay

delay = Delay(jnp.zeros(1), k_steps=2, initial_value=-1.0)
state = delay.initialize_state(1)  # {"buffer": (B, k_steps, 1), "idx": (B,)}
outputs = []
for t in range(4):
    out = delay(state, jnp.full((1, 1), float(t)))
    state = out.next_state
    outputs.append(float(out.output[0, 0]))
print("inputs  0, 1, 2, 3 -> outputs", outputs)

state = delay.reset_state(state)
print("after a reset:", float(delay(state, jnp.full((1, 1), 9.0)).output[0, 0]))
