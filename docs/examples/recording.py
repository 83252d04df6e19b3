"""Activation recording: every module's output over evaluation episodes, by its path."""

import jax
import jax.numpy as jnp
from flax import nnx

from nnx_ppo import envs
from nnx_ppo.algorithms.rollout import (
    eval_rollout_for_render_scan,
    record_activations_rollout,
    unstack_trajectory,
)
from nnx_ppo.networks.factories import make_default_network
from nnx_ppo.networks.recording import extract_activations, with_recording

env = envs.make("cartpole")
network = make_default_network(env, nnx.Rngs(0), hidden_sizes=(16,))
network.eval()  # the deterministic policy

# One episode in each of 4 envs, up to 100 steps: every module's output, (T, B, *feat).
activations, finished = record_activations_rollout(env, network, 4, 100, jax.random.key(0))
for path, output in sorted(activations.items()):
    shapes = [leaf.shape for leaf in jax.tree.leaves(output)]
    print(f"{path or '(network)'}: {shapes}")
print("hidden layer (T, B, 16):", activations[".layers[1].components['action'].layers[0]"].shape)
print("steps after an episode ended:", int(finished.sum()))

# One call: a Recorder runs the network unchanged and adds the activations to metrics.
recorder = with_recording(network)
out = recorder(network.initialize_state(2), jnp.zeros((2, 4)))
print("recorded in one call:", len(extract_activations(out.metrics)), "modules")

# Rendering: one env's states, slimmed, then one by one for env.render.
states, final_state, episode_return = eval_rollout_for_render_scan(
    env, network, 10, jax.random.key(1)
)
frames = unstack_trajectory(states, final_state, 10)
print("frames:", len(frames), "return:", float(episode_return))
