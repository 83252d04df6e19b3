"""Proximal Policy Optimization for stateful networks and pytree actions and rewards.

This module is the public face of the PPO engine; the engine itself is split
along its seams, one kind of code per file:

- ``_advantages``: **score** a rollout, :func:`gae` and :func:`compute_advantages`;
- ``_loss``: :func:`ppo_loss` and the replay of a rollout it rests on;
- ``_learn``: epochs of minibatches of whole environments over the loss;
- ``_step``: the compiled PPO step (collect, score, learn, fold statistics,
  advance), and :func:`ppo_step` / :func:`ppo_steps` that call it;
- ``_train``: :func:`new_training_state` and the host loop of :func:`train_ppo`;
- ``_runs``: :func:`train_ppo_runs`, many runs (seeds, learning rates) in one program.

Truncation: an episode cut short by a time limit (``truncated``) bootstraps
from the value of its true final observation, ``V(next_obs)`` under the carry
before the reset; a terminated one bootstraps from zero. Either way the GAE
trace stops at the episode's end.

The step is compiled once per (env, network structure, optimizer,
:class:`~nnx_ppo.algorithms.config.PPOConfig`): :func:`ppo_step` keeps the
compiled function and reuses it for every call.
"""

# The names 0.3.0's module imported, which its users' scripts import from here too.
from nnx_ppo.algorithms import rollout as rollout
from nnx_ppo.algorithms._advantages import compute_advantages, gae
from nnx_ppo.algorithms._loss import ppo_loss
from nnx_ppo.algorithms._runs import train_ppo_runs
from nnx_ppo.algorithms._step import ppo_step, ppo_steps
from nnx_ppo.algorithms._train import default_config, new_training_state, train_ppo
from nnx_ppo.algorithms.config import EvalConfig as EvalConfig
from nnx_ppo.algorithms.config import PPOConfig as PPOConfig
from nnx_ppo.algorithms.config import TrainConfig as TrainConfig
from nnx_ppo.algorithms.config import TrainResult as TrainResult
from nnx_ppo.algorithms.config import VideoConfig as VideoConfig
from nnx_ppo.algorithms.config import VideoData as VideoData
from nnx_ppo.algorithms.metrics import compute_metrics as compute_metrics
from nnx_ppo.algorithms.metrics import log_weight_stats as log_weight_stats
from nnx_ppo.algorithms.types import EnvState as EnvState
from nnx_ppo.algorithms.types import LoggingLevel as LoggingLevel
from nnx_ppo.algorithms.types import RLEnv as RLEnv
from nnx_ppo.algorithms.types import TrainingState as TrainingState
from nnx_ppo.networks.types import ModuleState as ModuleState
from nnx_ppo.networks.types import StatefulModule as StatefulModule

__all__ = [
    "compute_advantages",
    "default_config",
    "gae",
    "new_training_state",
    "ppo_loss",
    "ppo_step",
    "ppo_steps",
    "train_ppo",
    "train_ppo_runs",
]
