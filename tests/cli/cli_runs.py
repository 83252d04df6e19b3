"""Tiny ``nnx-ppo train`` runs shared by the CLI tests: 8 envs x 16 steps per PPO step."""

from pathlib import Path

import jax
import numpy as np
from flax import nnx

from nnx_ppo.algorithms.checkpointing import load_checkpoint
from nnx_ppo.cli.main import main
from nnx_ppo.envs import make
from nnx_ppo.networks.factories import make_default_network

TINY = [
    "--set", "ppo.n_envs=8",
    "--set", "ppo.rollout_length=16",
    "--set", "ppo.n_minibatches=2",
    "--set", "ppo.n_epochs=2",
    "--set", "eval.n_envs=4",
    "--set", "eval.every_steps=512",
    "--set", "eval.max_episode_length=50",
    "--set", "checkpoint_every_steps=512",
    "--set", "network.hidden_sizes=[16]",
]  # fmt: skip
STEP = 8 * 16
"""Env steps per PPO step of a TINY run."""


def train(run_dir: Path, steps: int, *extra: str) -> int:
    """``nnx-ppo train`` on cart-pole with the TINY settings; its exit status."""
    return main(["train", "--steps", str(steps), "--run-dir", str(run_dir), *TINY, *extra])


def parameters(run_dir: Path) -> list[np.ndarray]:
    """The network parameters of a TINY run's latest checkpoint."""
    network = make_default_network(make("cartpole"), nnx.Rngs(0), hidden_sizes=[16])
    load_checkpoint(run_dir, network)
    return [np.asarray(leaf) for leaf in jax.tree.leaves(nnx.state(network, nnx.Param))]
