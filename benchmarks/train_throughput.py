"""Env steps per second of PPO training, against stepping the same env with random actions.

The ratio says how much of the training step is the env itself: near 1, training
is env-bound; far below 1, the network and the updates dominate.

    python benchmarks/train_throughput.py --env cartpole --n-envs 256 --rollout-length 32
    python benchmarks/train_throughput.py --reset-work 200   # a costly, simulator-like reset
    python benchmarks/train_throughput.py --env CartpoleBalance   # with the playground extra
"""

from __future__ import annotations

import argparse
import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, PRNGKeyArray

from nnx_ppo.algorithms.config import PPOConfig
from nnx_ppo.algorithms.ppo import new_training_state, ppo_step
from nnx_ppo.algorithms.rollout import (
    episode_ended,
    episode_flags,
    reset_envs,
    tree_where,
    unmapped_state_paths,
)
from nnx_ppo.envs import make
from nnx_ppo.networks.factories import make_discrete_mlp_actor_critic, make_mlp_actor_critic


class CostlyReset:
    """Wraps an env so that ``reset`` does ``work`` extra dependent operations.

    Simulators (MuJoCo Playground) reset far more expensively than the built-in
    cart-pole; this stands in for them when measuring what resets cost.
    """

    def __init__(self, env: Any, work: int) -> None:
        self.env, self.work = env, work

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def reset(self, rng: PRNGKeyArray) -> Any:
        state = self.env.reset(rng)
        noise = jax.random.normal(rng, (64,))
        noise = jax.lax.fori_loop(0, self.work, lambda _, x: jnp.sin(x) * 1.0001, noise)
        return state.replace(metrics={**state.metrics, "reset_noise": noise.sum()})

    def step(self, state: Any, action: Any) -> Any:
        stepped = self.env.step(state, action)
        return stepped.replace(
            metrics={**stepped.metrics, "reset_noise": state.metrics["reset_noise"]}
        )


def random_actions(env: Any, key: PRNGKeyArray, n_envs: int) -> Array:
    """Uniform actions for ``n_envs`` envs of a flat (non-dict) action space."""
    if getattr(env, "discrete_actions", False):
        return jax.random.randint(key, (n_envs,), 0, env.action_size)
    return jax.random.uniform(key, (n_envs, env.action_size), minval=-1.0, maxval=1.0)


@functools.partial(jax.jit, static_argnums=(0, 2, 4))
def random_rollout(
    env: Any, state: Any, length: int, key: PRNGKeyArray, reset_every_step: bool = False
) -> Any:
    """``length`` steps of every env with random actions, resetting ended episodes.

    Reset states are drawn once per rollout, as ``unroll_env`` does; with
    ``reset_every_step`` a full vmapped reset runs on every step instead (the
    naive way, measured for comparison).
    """
    n_envs = jax.tree.leaves(state.done)[0].shape[0]
    reset_key, action_key = jax.random.split(key)
    fresh = reset_envs(env, jax.random.split(reset_key, n_envs))
    unmapped = unmapped_state_paths(env)

    def step(state: Any, key: PRNGKeyArray) -> tuple[Any, None]:
        stepped = jax.vmap(env.step)(state, random_actions(env, key, n_envs))
        reset = reset_envs(env, jax.random.split(key, n_envs)) if reset_every_step else fresh
        ended = episode_ended(episode_flags(stepped)[0])
        return tree_where(ended, reset, stepped, unmapped), None

    state, _ = jax.lax.scan(step, state, jax.random.split(action_key, length))
    return state


def steps_per_second(run: Any, calls: int, steps_per_call: int) -> float:
    """Time ``calls`` calls of ``run`` after one warm-up (compiling) call."""
    jax.block_until_ready(run())
    start = time.perf_counter()
    for _ in range(calls):
        jax.block_until_ready(run())
    return calls * steps_per_call / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description="PPO training vs random-action env throughput")
    parser.add_argument("--env", default="cartpole")
    parser.add_argument("--n-envs", type=int, default=256)
    parser.add_argument("--rollout-length", type=int, default=32)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument(
        "--reset-work",
        type=int,
        default=0,
        help="extra operations per reset, to emulate a simulator's costly reset",
    )
    args = parser.parse_args()

    env: Any = make(args.env)
    if args.reset_work:
        env = CostlyReset(env, args.reset_work)
    factory = (
        make_discrete_mlp_actor_critic
        if getattr(env, "discrete_actions", False)
        else make_mlp_actor_critic
    )
    sizes = [args.hidden, args.hidden]
    network = factory(env.observation_size, env.action_size, sizes, sizes, nnx.Rngs(0))
    config = PPOConfig(n_envs=args.n_envs, rollout_length=args.rollout_length)
    steps = config.steps_per_iteration
    training = {"state": new_training_state(env, network, args.n_envs, seed=0)}

    def train() -> Any:
        training["state"], metrics = ppo_step(env, training["state"], config)
        return metrics

    rollout = {"state": reset_envs(env, jax.random.split(jax.random.key(1), args.n_envs))}
    keys = iter(jax.random.split(jax.random.key(2), 2 * args.calls + 2))

    def step_randomly(reset_every_step: bool) -> Any:
        rollout["state"] = random_rollout(
            env, rollout["state"], args.rollout_length, next(keys), reset_every_step
        )
        return rollout["state"]

    train_sps = steps_per_second(train, args.calls, steps)
    random_sps = steps_per_second(lambda: step_randomly(False), args.calls, steps)
    naive_sps = steps_per_second(lambda: step_randomly(True), args.calls, steps)
    print(
        f"env {args.env} (reset work {args.reset_work}), {args.n_envs} envs x "
        f"{args.rollout_length} steps, {jax.devices()[0]}"
    )
    print(f"training loop:                     {train_sps:14,.0f} env steps/s")
    print(f"random-action rollout:             {random_sps:14,.0f} env steps/s")
    print(f"  with a vmapped reset every step: {naive_sps:14,.0f} env steps/s")
    print(f"ratio (training / random): {train_sps / random_sps:.3f}")
    print(f"reset cost saved by drawing resets once per rollout: {random_sps / naive_sps:.2f}x")


if __name__ == "__main__":
    main()
