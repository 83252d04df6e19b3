"""Distil a recurrent teacher into a student with a delay line instead of a carry-all LSTM."""

import jax
import numpy as np
from flax import nnx

from nnx_ppo import envs
from nnx_ppo.algorithms.config import EvalConfig
from nnx_ppo.algorithms.distillation import (
    DistillationConfig,
    DistillationTrainConfig,
    new_distillation_state,
    train_distillation,
)
from nnx_ppo.networks.adapter import PPOAdapter
from nnx_ppo.networks.containers import Concat, Parallel, Sequential
from nnx_ppo.networks.delay import Delay
from nnx_ppo.networks.factories import make_lstm_actor_critic
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.sampling_layers import CategoricalSampler
from nnx_ppo.networks.utils import Scale

env = envs.make("memory")  # the cue is shown once, asked for env.delay + 1 steps later
rngs = nnx.Rngs(0)
# In practice the teacher was trained with train_ppo; any PPO network will do here.
teacher = make_lstm_actor_critic(
    env.observation_size, env.action_size, 32, rngs, discrete=True, normalize_obs=False
)


def student(named_action: bool = False) -> Sequential:
    """An MLP over the observation now and env.delay + 1 steps ago."""
    sample = env.reset(jax.random.key(0)).obs
    sampler = Sequential([Dense(32, env.action_size, rngs), CategoricalSampler(rngs, 0.0)])
    return Sequential(
        [
            Parallel(now=Scale(1.0), past=Delay(sample, k_steps=env.delay + 1)),
            Concat(now=Scale(1.0), past=Scale(1.0)),
            Dense(2 * env.observation_size, 32, rngs, activation=nnx.tanh),
            PPOAdapter(
                action=Parallel(cue=sampler) if named_action else sampler,
                value=Dense(32, 1, rngs),
            ),
        ]
    )


config = DistillationTrainConfig(
    distillation=DistillationConfig(
        n_envs=16,
        rollout_length=12,
        total_steps=16 * 12 * 6,
        learning_rate=3e-2,
        n_epochs=2,
        n_minibatches=2,
    ),
    eval=EvalConfig(enabled=False),
)
teacher_before = jax.tree.leaves(nnx.state(teacher, nnx.Param))
nll: list[float] = []
result = train_distillation(
    env,
    teacher,
    student(),
    config,
    log_fn=lambda metrics, step: nll.append(metrics["losses/distillation_nll/mean"]),
)
print(f"{result.total_steps} env steps; the NLL of the teacher's actions fell: {nll[-1] < nll[0]}")
unchanged = all(
    np.array_equal(a, b)
    for a, b in zip(teacher_before, jax.tree.leaves(nnx.state(teacher, nnx.Param)), strict=True)
)
print(f"teacher unchanged: {unchanged}")

try:  # a student whose action tree is {"cue": action} cannot learn the teacher's bare action
    new_distillation_state(env, teacher, student(named_action=True), 8, seed=0)
except ValueError as error:
    print(error)
