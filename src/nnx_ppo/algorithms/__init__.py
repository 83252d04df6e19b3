"""PPO on top of the network contract.

* :mod:`~nnx_ppo.algorithms.types`: ``RLEnv``, ``EnvState``, ``Transition``,
  ``TrainingState``, ``LoggingLevel``;
* :mod:`~nnx_ppo.algorithms.config`: ``PPOConfig``, ``EvalConfig``, ``TrainConfig``,
  ``TrainResult``;
* :mod:`~nnx_ppo.algorithms.rollout`: ``unroll_env``, ``eval_rollout``, ``tree_where``;
* :mod:`~nnx_ppo.algorithms.ppo`: ``gae``, ``compute_advantages``, ``ppo_loss``,
  ``ppo_step``, ``ppo_steps``, ``new_training_state``, ``train_ppo``;
* :mod:`~nnx_ppo.algorithms.metrics`: how metrics are named and summarised.
"""

from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig, TrainResult
from nnx_ppo.algorithms.ppo import (
    compute_advantages,
    gae,
    new_training_state,
    ppo_loss,
    ppo_step,
    ppo_steps,
    train_ppo,
)
from nnx_ppo.algorithms.rollout import eval_rollout, tree_where, unroll_env
from nnx_ppo.algorithms.types import LoggingLevel, TrainingState, Transition

__all__ = [
    "EvalConfig",
    "LoggingLevel",
    "PPOConfig",
    "TrainConfig",
    "TrainResult",
    "TrainingState",
    "Transition",
    "compute_advantages",
    "eval_rollout",
    "gae",
    "new_training_state",
    "ppo_loss",
    "ppo_step",
    "ppo_steps",
    "train_ppo",
    "tree_where",
    "unroll_env",
]
