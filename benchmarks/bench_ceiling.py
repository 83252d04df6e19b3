"""The machine's ceiling for a workload: matmul throughput, network FLOPs, env-only rate.

- fp32 matmul GFLOP/s of ``jnp.dot`` at the network's own layer shapes (batch =
  the rollout's ``n_envs`` and the update's minibatch) and at one large square.
- The network's FLOPs per PPO iteration, from the layer sizes: a forward pass
  of actor and critic for every rollout step, then for each epoch a forward and
  a backward pass (counted as twice the forward) over every step.
- The env-only rate: the vmapped Playground env stepped with random actions at
  the workload's ``n_envs``, resets included (``train_throughput.random_rollout``).

``compare.py`` divides the trainer's measured rate by these, and by the ceiling
rates: one iteration's steps over the env-only time of those steps plus the
network's products (the time the iteration would take if nothing but the env
and the products took time), with the products counted two ways: every FLOP
at the best rate measured at the network's forward shapes, and every FLOP at
the 2048^3 rate. (A third count, each product of an iteration timed alone at its
own shape, was dropped: config A ran faster than it, because the program runs
independent products side by side on the cores and a product timed alone does
not; see ``benchmarks/README.md``.)

The trainer's rate ``compare.py`` divides by comes from another process, minutes
apart, on a machine whose speed can drift by a third in that time. So this script
also times the parts side by side (:func:`paired_fractions`): rounds of this
repo's PPO iteration (one per call, and several fused in one call), one
iteration's env-only steps and one loop of products at the best network shape,
and the median of the rounds' fractions.

    python benchmarks/bench_ceiling.py --workload A
"""

from __future__ import annotations

import argparse
import functools
import itertools
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from bench_common import WORKLOADS, Workload, emit


def layer_shapes(workload: Workload, obs_size: int, action_size: int) -> list[tuple[int, int]]:
    """``(in, out)`` of every dense layer of the actor (mean and std out) and the critic."""
    shapes = []
    for sizes, out in ((workload.actor_sizes, 2 * action_size), (workload.critic_sizes, 1)):
        widths = [obs_size, *sizes, out]
        shapes += list(itertools.pairwise(widths))
    return shapes


def flops_per_iteration(workload: Workload, shapes: list[tuple[int, int]]) -> float:
    """Multiply-add FLOPs of the network in one PPO iteration (matmuls only)."""
    forward_per_sample = sum(2 * a * b for a, b in shapes)
    samples = workload.steps_per_iteration
    return forward_per_sample * samples * (1 + 3 * workload.n_epochs)


def best_seconds(run: Callable[[], Any], repeats: int) -> float:
    jax.block_until_ready(run())
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(run())
        best = min(best, time.perf_counter() - start)
    return best


def product_loop(
    lhs_shape: tuple[int, int], rhs_shape: tuple[int, int], inner: int = 50
) -> Callable[[], Any]:
    """A jitted loop of ``inner`` fp32 products ``lhs @ rhs``; call it to run once.

    Each loop iteration takes a new left operand, so XLA cannot hoist the product,
    and writes its result over the last one, which it reads one element of to pick
    that operand, so XLA cannot drop it either. (A loop that stacked the results
    would also time the first touch of a fresh output buffer's pages.)
    """
    keys = jax.random.split(jax.random.key(0), 2)
    lhs = jax.random.normal(keys[0], (inner, *lhs_shape), jnp.float32)
    rhs = jax.random.normal(keys[1], rhs_shape, jnp.float32)

    def product(x: jax.Array) -> jax.Array:
        return x @ rhs

    def body(i: jax.Array, last: jax.Array) -> jax.Array:
        return product(lhs[i + (last[0, 0] == jnp.inf).astype(i.dtype)])  # i: results are finite

    shape = jax.eval_shape(product, lhs[0])
    return jax.jit(lambda: jax.lax.fori_loop(0, inner, body, jnp.zeros(shape.shape, shape.dtype)))


@functools.cache
def product_seconds(
    lhs_shape: tuple[int, int],
    rhs_shape: tuple[int, int],
    inner: int = 50,
    repeats: int = 5,
) -> float:
    """Seconds of one fp32 product, the best of ``repeats`` :func:`product_loop` calls."""
    return best_seconds(product_loop(lhs_shape, rhs_shape, inner), repeats) / inner


def matmul_gflops(m: int, k: int, n: int, inner: int = 50, repeats: int = 5) -> float:
    """fp32 GFLOP/s of ``(m, k) @ (k, n)`` (:func:`product_seconds`)."""
    return 2 * m * k * n / product_seconds((m, k), (k, n), inner=inner, repeats=repeats) / 1e9


def env_only_rollout(workload: Workload) -> Callable[[], Any]:
    """One iteration's env steps, random actions, at the workload's ``n_envs``; call to run.

    Each call continues from the env states the last one left (resets included).
    """
    from mujoco_playground import registry
    from train_throughput import random_rollout

    from nnx_ppo.algorithms.rollout import reset_envs
    from nnx_ppo.wrappers.episode_wrapper import EpisodeWrapper

    env = EpisodeWrapper(
        registry.load(workload.env, config_overrides={"impl": "jax"}), workload.episode_length
    )
    state = {"s": reset_envs(env, jax.random.split(jax.random.key(1), workload.n_envs))}
    key = {"k": jax.random.key(2)}

    def step() -> Any:
        key["k"], rollout_key = jax.random.split(key["k"])
        state["s"] = random_rollout(env, state["s"], workload.rollout_length, rollout_key)
        return state["s"]

    # The first call's output state can differ in dtype or weak type from the reset
    # state it was given, so the second call may compile again: warm up on both.
    jax.block_until_ready(step())
    jax.block_until_ready(step())
    return step


def env_only_steps_per_second(workload: Workload, calls: int) -> float:
    """Random-action env steps/s of the workload's env at its ``n_envs``."""
    from train_throughput import steps_per_second

    return steps_per_second(env_only_rollout(workload), calls, workload.steps_per_iteration)


def _seconds(run: Callable[[], Any]) -> float:
    start = time.perf_counter()
    jax.block_until_ready(run())
    return time.perf_counter() - start


def paired_fractions(
    workload: Workload,
    flops: float,
    best_shape: tuple[int, int, int],
    rounds: int,
    fused: int = 4,
) -> dict[str, Any]:
    """This repo's PPO iteration against the ceiling's parts, timed in turn in one process.

    Each round times, once each so that every part of a round sees the machine in
    the same state:

    - one :func:`nnx_ppo.algorithms.ppo.ppo_step` (one iteration per call, its
      metrics fetched to the host before the next is dispatched);
    - one :func:`nnx_ppo.algorithms.ppo.ppo_steps` of ``fused`` iterations in one
      call (what ``train_ppo`` runs while no log, evaluation or checkpoint is due),
      counted per iteration;
    - one iteration's env-only steps, and one loop of products at ``best_shape``
      (``batch x in x out``).

    A round's fraction is its ceiling time (env-only time plus ``flops`` at that
    round's product rate) over its time per iteration.
    """
    from bench_nnx_ppo import prepared_state

    from nnx_ppo.algorithms.ppo import ppo_step, ppo_steps

    env, config, state = prepared_state(workload, "bench_ceiling")
    trained = {"state": state}

    def one_step() -> Any:
        trained["state"], metrics = ppo_step(env, trained["state"], config)
        return metrics

    def fused_steps() -> Any:
        trained["state"], metrics = ppo_steps(env, trained["state"], config, fused)
        return metrics

    batch, fan_in, fan_out = best_shape
    inner = 50
    products = product_loop((batch, fan_in), (fan_in, fan_out), inner)
    env_rollout = env_only_rollout(workload)
    for run in (one_step, one_step, fused_steps, fused_steps, products):  # compile, settle
        jax.block_until_ready(run())
    samples: dict[str, list[float]] = {
        key: [] for key in ("one_step_s", "fused_step_s", "env_s", "gflops")
    }
    for _ in range(rounds):
        samples["one_step_s"].append(_seconds(one_step))
        samples["fused_step_s"].append(_seconds(fused_steps) / fused)
        samples["env_s"].append(_seconds(env_rollout))
        samples["gflops"].append(2 * batch * fan_in * fan_out * inner / _seconds(products) / 1e9)
    ceiling_s = [
        env_s + flops / gflops / 1e9
        for env_s, gflops in zip(samples["env_s"], samples["gflops"], strict=True)
    ]
    fractions = {
        f"fraction_{kind}": [
            ceiling / step_s
            for ceiling, step_s in zip(ceiling_s, samples[f"{kind}_s"], strict=True)
        ]
        for kind in ("one_step", "fused_step")
    }
    return {
        "rounds": rounds,
        "fused_iterations": fused,
        "product_shape": f"{batch}x{fan_in}x{fan_out}",
        **samples,
        **fractions,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="matmul, network-FLOP and env-only ceilings")
    parser.add_argument("--workload", choices=["A", "B"], default="A")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument(
        "--paired-rounds", type=int, default=40, help="rounds of the paired measurement"
    )
    args = parser.parse_args()
    workload = WORKLOADS[args.workload]
    from mujoco_playground import registry

    env = registry.load(workload.env, config_overrides={"impl": "jax"})
    obs = env.observation_size
    obs_size = int(obs if isinstance(obs, int) else obs["state"][0])
    shapes = layer_shapes(workload, obs_size, env.action_size)
    minibatch = workload.steps_per_iteration // workload.n_minibatches
    rates = {
        (batch, a, b): matmul_gflops(batch, a, b)
        for batch in (workload.n_envs, minibatch)
        for a, b in sorted(set(shapes))
    }
    network_gflops = {f"{m}x{k}x{n}": rate for (m, k, n), rate in rates.items()}
    flops = flops_per_iteration(workload, shapes)
    emit(
        {
            "library": "ceiling",
            "workload": args.workload,
            "layer_shapes": shapes,
            "flops_per_iteration": flops,
            "matmul_gflops_network_shapes": network_gflops,
            "matmul_gflops_large": matmul_gflops(2048, 2048, 2048, inner=2, repeats=3),
            "env_only_steps_per_s": env_only_steps_per_second(workload, args.calls),
            "steps_per_iteration": workload.steps_per_iteration,
            "paired": paired_fractions(
                workload, flops, max(rates, key=rates.__getitem__), args.paired_rounds
            ),
        }
    )


if __name__ == "__main__":
    main()
