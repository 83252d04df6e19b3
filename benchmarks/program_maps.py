"""How many memory mappings a process holds as it trains and checks modules, round by round.

Every compiled XLA program keeps its code mapped while the program is cached, and
Linux caps the mappings of a process (``/proc/sys/vm/max_map_count``, often
65,530); past the cap, LLVM fails to map the next program's code and the process
aborts ("Unable to allocate section memory") or segfaults in the compile. Each
round here compiles fresh programs the way a sweep or a long test session does:
``train_ppo`` on a new cart-pole env object and on a new one whose step calls back
to the host (throughput logging and evaluation on), then ``check_module`` on a
small actor-critic. It prints the process's mappings after each round.

    python benchmarks/program_maps.py --seconds 120
    python benchmarks/program_maps.py --seconds 120 --clear-caches   # jax.clear_caches() each round
"""

from __future__ import annotations

import argparse
import gc
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from nnx_ppo import envs
from nnx_ppo._compile import memory_mappings
from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.ppo import train_ppo
from nnx_ppo.algorithms.types import LoggingLevel
from nnx_ppo.networks.factories import make_default_network, make_mlp_actor_critic
from nnx_ppo.testing import check_module
from nnx_ppo.wrappers import Wrapper


class CallsBack(Wrapper):
    """Cart-pole whose reward passes through the host (``jax.pure_callback``) each step."""

    def step(self, state: Any, action: Any) -> Any:
        stepped = self.env.step(state, action)
        reward = jax.pure_callback(
            lambda r: np.asarray(r, np.float32),
            jax.ShapeDtypeStruct((), jnp.float32),
            stepped.reward + 0 * stepped.obs[0],  # per step, so XLA cannot hoist it
            vmap_method="expand_dims",
        )
        return stepped.replace(reward=reward)


def one_round(index: int) -> None:
    config = TrainConfig(
        ppo=PPOConfig(
            n_envs=4,
            rollout_length=8,
            total_steps=4 * 8 * 6,
            n_minibatches=2,
            logging_level=LoggingLevel.THROUGHPUT | LoggingLevel.LOSSES,
            iterations_per_call=1 + index % 3,
        ),
        eval=EvalConfig(enabled=True, every_steps=64, n_envs=2, max_episode_length=20),
    )
    for env in (envs.make("cartpole"), CallsBack(envs.make("cartpole"))):
        network = make_default_network(env, nnx.Rngs(index), hidden_sizes=(8 + index % 5,))
        train_ppo(env, network, config)
    check_module(
        lambda: make_mlp_actor_critic(3, 2, [4 + index % 3], [4], nnx.Rngs(0)),
        jnp.zeros(3),
        batch_sizes=(1, 3),
        stochastic=True,
        max_examples=3,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="stop after this long")
    parser.add_argument("--clear-caches", action="store_true", help="jax.clear_caches() each round")
    args = parser.parse_args()
    counts = memory_mappings()
    if counts is None:
        parser.exit(1, "program_maps.py reads /proc, which only Linux has\n")
    print(f"vm.max_map_count: {counts[1]}; mappings at the start: {counts[0]}")
    deadline, index = time.monotonic() + args.seconds, 0
    while time.monotonic() < deadline:
        one_round(index)
        if args.clear_caches:
            jax.clear_caches()
        gc.collect()
        index += 1
        print(f"round {index}: {(memory_mappings() or (0, 0))[0]} mappings", flush=True)


if __name__ == "__main__":
    main()
