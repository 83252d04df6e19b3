"""Time one Brax PPO training run on a MuJoCo Playground env (MJX's JAX backend).

Brax's ``ppo.train`` runs ``num_training_steps_per_epoch`` PPO iterations in
one compiled call between evaluations. Asking for one evaluation slot per
iteration (``num_evals = iterations + 1``) with ``run_evals=False`` makes every
call a single iteration and runs no evaluation; ``policy_params_fn``, which
Brax calls after every such call, then marks the end of each iteration.

The workload's sizes translate as: ``batch_size * num_minibatches = n_envs``
(each env contributes one unroll of ``rollout_length`` steps per iteration, and
a minibatch is ``batch_size`` whole unrolls), ``num_updates_per_batch`` = epochs.

    python benchmarks/bench_brax.py --workload A --total-steps 20000
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
from typing import Any

from bench_common import WORKLOADS, IterationClock, emit


def _restore_device_put_replicated() -> None:
    """Give JAX 0.10 and later back the ``jax.device_put_replicated`` Brax 0.14.2 calls.

    Brax calls it once, to place the initial training state on its devices
    before the first iteration; later JAX releases removed it. Where the
    benchmark runs on the JAX a machine already has (a GPU image with no package
    registry), this stands in for it: each leaf stacked once per device and
    laid out one slice per device, which is what the removed function returned.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    try:
        jax.device_put_replicated  # noqa: B018 (present on JAX < 0.10)
        return
    except AttributeError:
        pass

    def device_put_replicated(tree: Any, devices: list[Any]) -> Any:
        sharding = NamedSharding(Mesh(np.array(devices), ("devices",)), PartitionSpec("devices"))
        return jax.tree.map(
            lambda leaf: jax.device_put(jnp.stack([jnp.asarray(leaf)] * len(devices)), sharding),
            tree,
        )

    jax.device_put_replicated = device_put_replicated  # pyright: ignore[reportAttributeAccessIssue]


def main() -> None:
    parser = argparse.ArgumentParser(description="time one Brax PPO training run")
    parser.add_argument("--workload", choices=["A", "B", "large"], required=True)
    parser.add_argument("--total-steps", type=int)
    args = parser.parse_args()
    clock = IterationClock()

    _restore_device_put_replicated()
    import brax
    from brax.training.agents.ppo import networks as ppo_networks
    from brax.training.agents.ppo import train as ppo
    from flax import linen
    from mujoco_playground import registry, wrapper

    workload = WORKLOADS[args.workload]
    if args.total_steps:
        workload = dataclasses.replace(workload, total_steps=args.total_steps)
    iterations = -(-workload.total_steps // workload.steps_per_iteration)
    env = registry.load(workload.env, config_overrides={"impl": "jax"})
    network_factory = functools.partial(
        ppo_networks.make_ppo_networks,
        policy_hidden_layer_sizes=workload.actor_sizes,
        value_hidden_layer_sizes=workload.critic_sizes,
        activation={"swish": linen.swish, "tanh": linen.tanh}[workload.activation],
    )

    def on_iteration(step: int, *_: Any) -> None:
        if step > 0:  # Brax also calls it once before training
            clock.tick(step)

    ppo.train(
        environment=env,
        num_timesteps=workload.total_steps,
        wrap_env_fn=wrapper.wrap_for_brax_training,
        num_envs=workload.n_envs,
        episode_length=workload.episode_length,
        learning_rate=workload.learning_rate,
        entropy_cost=workload.entropy_cost,
        discounting=workload.discount,
        unroll_length=workload.rollout_length,
        batch_size=workload.n_envs // workload.n_minibatches,
        num_minibatches=workload.n_minibatches,
        num_updates_per_batch=workload.n_epochs,
        normalize_observations=workload.normalize_obs,
        reward_scaling=workload.reward_scaling,
        clipping_epsilon=workload.clip,
        gae_lambda=workload.gae_lambda,
        network_factory=network_factory,
        seed=0,
        num_evals=iterations + 1,
        run_evals=False,
        policy_params_fn=on_iteration,
    )
    version = getattr(brax, "__version__", "?")
    result = {"library": "brax", "version": version, "workload": args.workload}
    emit({**result, **clock.summary(), "steps_per_iteration": workload.steps_per_iteration})


if __name__ == "__main__":
    main()
