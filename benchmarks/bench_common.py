"""What every timing script shares: the workloads' settings, the clock, the result line.

Standard library only: every peer's venv imports this file from ``benchmarks/``
(the running script's folder is on ``sys.path``), whatever else it has installed.

A timing script calls :meth:`IterationClock.tick` once after every PPO
iteration (with the env steps taken so far) and :func:`emit` once at the end;
:func:`emit` prints one line, ``BENCH_RESULT {json}``, that ``compare.py``
collects.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import resource
import sys
import time
from typing import Any

RESULT_PREFIX = "BENCH_RESULT "
T0_ENV_VAR = "NNX_PPO_BENCH_T0"
"""Set by ``compare.py`` to ``time.time()`` just before it starts the process."""


@dataclasses.dataclass(frozen=True)
class Workload:
    """One PPO configuration, in the terms every library's script translates from.

    ``n_minibatches`` split the ``n_envs * rollout_length`` steps of an iteration;
    each of ``n_epochs`` passes takes every minibatch once.
    """

    env: str
    n_envs: int
    rollout_length: int
    n_epochs: int
    n_minibatches: int
    actor_sizes: tuple[int, ...]
    critic_sizes: tuple[int, ...]
    activation: str
    learning_rate: float
    discount: float = 0.99
    gae_lambda: float = 0.95
    clip: float = 0.2
    reward_scaling: float = 1.0
    normalize_obs: bool = True
    entropy_cost: float = 1e-2
    episode_length: int = 1000
    total_steps: int = 400_000

    @property
    def steps_per_iteration(self) -> int:
        """Env steps one PPO iteration collects."""
        return self.n_envs * self.rollout_length


_CONFIG_A = Workload(
    env="CartpoleBalance",
    n_envs=256,
    rollout_length=20,
    n_epochs=4,
    n_minibatches=4,
    actor_sizes=(64, 64, 64, 64),
    critic_sizes=(256, 256),
    activation="swish",
    learning_rate=1e-3,
)

WORKLOADS: dict[str, Workload] = {
    # Config A: a small continuous-control setting on Playground's MJX cart-pole.
    "A": _CONFIG_A,
    # Config B: Playground's tuned CartpoleBalance settings (dm_control_suite_params),
    # scaled from 2048 to 256 envs; the networks are Brax's defaults, which that
    # config uses: policy 4x32, value 5x256, swish.
    "B": Workload(
        env="CartpoleBalance",
        n_envs=256,
        rollout_length=30,
        n_epochs=16,
        n_minibatches=8,
        actor_sizes=(32, 32, 32, 32),
        critic_sizes=(256, 256, 256, 256, 256),
        activation="swish",
        learning_rate=1e-3,
        discount=0.995,
        clip=0.3,
        reward_scaling=10.0,
    ),
    # CleanRL's classic CartPole PPO: few envs, long rollouts, whole run in seconds.
    "small": Workload(
        env="cartpole",
        n_envs=4,
        rollout_length=128,
        n_epochs=4,
        n_minibatches=4,
        actor_sizes=(64, 64),
        critic_sizes=(64, 64),
        activation="tanh",
        learning_rate=2.5e-4,
        normalize_obs=False,
        episode_length=500,
        total_steps=500_000,
    ),
    # Config A at 4,096 envs, for a GPU (gpu_compare.sh): 20,480-step minibatches.
    "large": dataclasses.replace(_CONFIG_A, n_envs=4096, total_steps=40 * 4096 * 20),
    # The built-in memory task; the LSTM run uses one 64-wide LSTM after a 64-wide
    # encoder, the MLP run the sizes below.
    "memory": Workload(
        env="memory",
        n_envs=256,
        rollout_length=20,
        n_epochs=4,
        n_minibatches=4,
        actor_sizes=(64, 64),
        critic_sizes=(64, 64),
        activation="tanh",
        learning_rate=1e-3,
    ),
}


def start_time() -> float:
    """When the harness started this process (``time.time()``), or now if run by hand."""
    return float(os.environ.get(T0_ENV_VAR, time.time()))


class IterationClock:
    """Wall-clock times of the ends of PPO iterations, from the process's start."""

    def __init__(self) -> None:
        self.t0 = start_time()
        self.times: list[float] = []
        self.steps: list[int] = []

    def tick(self, steps: int) -> None:
        """Record that the iteration ending at ``steps`` env steps has finished."""
        self.times.append(time.time())
        self.steps.append(int(steps))

    def summary(self) -> dict[str, Any]:
        """The raw figures ``compare.py`` turns into the table's columns."""
        end = time.time()
        first = self.times[0] - self.t0 if self.times else None
        durations = [b - a for a, b in itertools.pairwise(self.times)]
        step_deltas = [b - a for a, b in itertools.pairwise(self.steps)]
        return {
            "first_iteration_s": first,
            "wall_s": end - self.t0,
            "iteration_s": durations,
            "iteration_steps": step_deltas,
            "total_steps": self.steps[-1] if self.steps else 0,
        }


def emit(result: dict[str, Any]) -> None:
    """Print the result line, with this process's peak resident memory and JAX's device.

    On a GPU the device's own peak memory is added too (``device_peak_mb``), where
    JAX reports it.
    """
    result = {
        **result,
        "self_max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    jax = sys.modules.get("jax")  # imported by every timing script by now
    if jax is not None:
        device = jax.devices()[0]
        platform, kind = device.platform, device.device_kind  # kind: "cpu", or the GPU's model
        result["device"] = platform if kind == platform else f"{platform} ({kind})"
        peak = (device.memory_stats() or {}).get("peak_bytes_in_use")
        if peak is not None:
            result["device_peak_mb"] = peak / 2**20
    print(RESULT_PREFIX + json.dumps(result), flush=True)
