"""Time one rejax PPO run on gymnax's CartPole-v1: the whole training loop in one jit.

rejax compiles every iteration of a run into one function, so there are no
per-iteration times: this reports the compile time, the run time of the one
compiled call, and the whole process's wall time. Its evaluation callback is
replaced by one that does nothing (the nnx-ppo runs evaluate nothing either),
and ``eval_freq`` is the whole budget so the loop is a single scan step.

    python benchmarks/bench_rejax.py --total-steps 20000
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from importlib import metadata
from typing import Any

from bench_common import WORKLOADS, emit, start_time


def main() -> None:
    parser = argparse.ArgumentParser(description="time one rejax PPO run")
    parser.add_argument("--workload", choices=["small"], default="small")
    parser.add_argument("--total-steps", type=int)
    args = parser.parse_args()
    t0 = start_time()

    import jax
    import jax.numpy as jnp
    from rejax import PPO

    workload = WORKLOADS[args.workload]
    if args.total_steps:
        workload = dataclasses.replace(workload, total_steps=args.total_steps)
    algo = PPO.create(
        env="CartPole-v1",
        num_envs=workload.n_envs,
        num_steps=workload.rollout_length,
        num_epochs=workload.n_epochs,
        num_minibatches=workload.n_minibatches,
        learning_rate=workload.learning_rate,
        max_grad_norm=0.5,
        total_timesteps=workload.total_steps,
        eval_freq=workload.total_steps,
        skip_initial_evaluation=True,
        gamma=workload.discount,
        gae_lambda=workload.gae_lambda,
        clip_eps=workload.clip,
        ent_coef=workload.entropy_cost,
        vf_coef=0.5,
        normalize_observations=workload.normalize_obs,
        agent_kwargs={
            "activation": workload.activation,
            "hidden_layer_sizes": workload.actor_sizes,
        },
    )

    def no_evaluation(_algo: Any, _ts: Any, _rng: Any) -> Any:
        return jnp.zeros(())

    algo = algo.replace(eval_callback=no_evaluation)
    rng = jax.random.key(0) if hasattr(jax.random, "key") else jax.random.PRNGKey(0)
    start = time.time()
    compiled = jax.jit(type(algo).train).lower(algo, rng).compile()
    compiled_at = time.time()
    train_state, _ = compiled(algo, rng)
    jax.block_until_ready(train_state)
    end = time.time()
    iterations = -(-workload.total_steps // workload.steps_per_iteration)
    emit(
        {
            "library": "rejax",
            "version": metadata.version("rejax"),
            "gymnax": metadata.version("gymnax"),
            "workload": args.workload,
            "setup_s": start - t0,
            "compile_s": compiled_at - start,
            "run_s": end - compiled_at,
            "wall_s": end - t0,
            "total_steps": iterations * workload.steps_per_iteration,
            "steps_per_iteration": workload.steps_per_iteration,
        }
    )


if __name__ == "__main__":
    main()
