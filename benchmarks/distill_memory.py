"""Distil an LSTM policy for the memory task into a student with no recurrence.

The teacher, an LSTM actor-critic, is trained with PPO until it remembers the
cue; the student sees the observation now and the one ``delay + 1`` steps ago
(a :class:`~nnx_ppo.networks.delay.Delay` line) through an MLP, so it can answer
the query without a recurrent carry. It is trained by distillation only (no
reward), and should reach at least 90% of the teacher's evaluation return.

    python benchmarks/distill_memory.py
    python benchmarks/distill_memory.py --distillation-steps 20000 --seed 1
"""

from __future__ import annotations

import argparse
import time

import jax
from flax import nnx

from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.distillation import (
    DistillationConfig,
    DistillationTrainConfig,
    train_distillation,
)
from nnx_ppo.algorithms.ppo import train_ppo
from nnx_ppo.algorithms.types import RLEnv
from nnx_ppo.envs import make
from nnx_ppo.envs.memory import MemoryTask
from nnx_ppo.networks.adapter import PPOAdapter
from nnx_ppo.networks.containers import Concat, Parallel, Sequential
from nnx_ppo.networks.delay import Delay
from nnx_ppo.networks.factories import make_lstm_actor_critic
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.sampling_layers import CategoricalSampler
from nnx_ppo.networks.types import StatefulModule
from nnx_ppo.networks.utils import Scale


def delay_student(env: MemoryTask, rngs: nnx.Rngs) -> StatefulModule:
    """An MLP over ``[obs_t, obs_{t - delay - 1}]``: at the query the second part is the cue."""
    sample = env.reset(jax.random.key(0)).obs
    return Sequential(
        [
            Parallel(now=Scale(1.0), past=Delay(sample, k_steps=env.delay + 1)),
            Concat(now=Scale(1.0), past=Scale(1.0)),
            Dense(2 * env.observation_size, 32, rngs, activation=nnx.tanh),
            PPOAdapter(
                action=Sequential(
                    [Dense(32, env.action_size, rngs), CategoricalSampler(rngs, 0.0)]
                ),
                value=Dense(32, 1, rngs),
            ),
        ]
    )


def evaluation(every_steps: int) -> EvalConfig:
    """At the start and after ``every_steps`` env steps: the end of the run."""
    return EvalConfig(every_steps=every_steps, n_envs=256, max_episode_length=10)


def train_teacher(env: RLEnv, seed: int) -> tuple[StatefulModule, float]:
    teacher = make_lstm_actor_critic(
        env.observation_size,
        env.action_size,
        32,
        nnx.Rngs(seed),
        discrete=True,
        activation=nnx.tanh,
        normalize_obs=False,
    )
    ppo = PPOConfig(
        n_envs=32,
        rollout_length=24,
        total_steps=50_000,
        learning_rate=3e-3,
        critic_loss_weight=0.5,
        gradient_clipping=0.5,
    )
    result = train_ppo(
        env, teacher, TrainConfig(ppo=ppo, eval=evaluation(ppo.total_steps), seed=seed)
    )
    return teacher, result.eval_history[-1]["eval/episode_reward/mean"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--distillation-steps", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    env = make("memory")
    assert isinstance(env, MemoryTask)
    start = time.perf_counter()
    teacher, teacher_return = train_teacher(env, args.seed)
    teacher_seconds = time.perf_counter() - start

    config = DistillationTrainConfig(
        distillation=DistillationConfig(
            n_envs=32,
            rollout_length=12,
            total_steps=args.distillation_steps,
            learning_rate=3e-3,
            n_epochs=2,
            n_minibatches=2,
        ),
        eval=evaluation(args.distillation_steps),
        seed=args.seed,
    )
    start = time.perf_counter()
    student = delay_student(env, nnx.Rngs(args.seed + 1))
    result = train_distillation(env, teacher, student, config)
    distill_seconds = time.perf_counter() - start
    before = result.eval_history[0]["eval/episode_reward/mean"]
    student_return = result.eval_history[-1]["eval/episode_reward/mean"]

    print(f"teacher (LSTM, PPO 50k steps): return {teacher_return:.3f} in {teacher_seconds:.1f}s")
    print(
        f"student (MLP + Delay, distilled {result.total_steps} steps): return "
        f"{before:.3f} -> {student_return:.3f} in {distill_seconds:.1f}s"
    )
    ratio = student_return / teacher_return if teacher_return else float("nan")
    print(f"student / teacher: {ratio:.3f} ({'ok' if ratio >= 0.9 else 'BELOW 0.9'})")


if __name__ == "__main__":
    main()
