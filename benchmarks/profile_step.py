"""Where one PPO iteration's time goes: the compiled step, and its parts compiled alone.

For a workload of ``bench_common.WORKLOADS`` it builds this repo's env, network
and config as ``bench_nnx_ppo.py`` does, then times, each as its own jitted
program on the same state (best of ``--repeats`` after a warm-up call):

- ``env only``: the vmapped env stepped ``rollout_length`` times with random
  actions, ended episodes reset (``train_throughput.random_rollout``; no network);
- ``rollout``: the step's rollout (``_step._collect``: ``rollout.unroll_env``
  keeping only the metrics the config logs), the env with the network acting;
- ``advantages``: GAE over the rollout;
- ``learn``: every epoch's minibatch updates (``_learn``);
- ``whole step``: the compiled PPO step as training runs it (one iteration,
  metrics and statistics included, its report fetched to the host);
- ``N/call`` (with ``--per-call N``): the same program running N iterations
  in one call, per iteration: what the host's dispatch of one call per
  iteration costs is its difference from ``whole step``;
- ``plain learn``: a reference outside this library, written in plain JAX and
  optax: the same layer shapes, activation, epochs, minibatches and optimizer
  (Adam, clipped as the config clips), each update the gradient of a squared
  output of actor and critic on a random minibatch. It does the learning's
  matmul arithmetic and nothing else, so it shows what this machine does with
  that arithmetic: ``learn`` can come close to it, but cannot beat it by much.

With ``--runs N`` every part is ``jax.vmap``-ed over N stacked runs (seeds
0..N-1), as ``train_ppo_runs`` does, and rates count all runs' steps: the
ratio to ``--runs 1`` shows which part gains from batching runs and which does
not.

The parts do not add up exactly to the whole (each program has its own
launch, and XLA fuses across part boundaries in the whole), but the shares
show where a step's time goes. Beside each it prints the matmul FLOPs of the
network in that part and the GFLOP/s they imply. ``--trace DIR`` also writes a
``jax.profiler`` trace of a few whole steps for a trace viewer (Perfetto).

    python benchmarks/profile_step.py --workload A
    python benchmarks/profile_step.py --workload small --runs 8
"""

from __future__ import annotations

import argparse
import contextlib
from typing import Any

import jax
import jax.numpy as jnp
import optax
from bench_ceiling import best_seconds, flops_per_iteration, layer_shapes
from bench_common import WORKLOADS, Workload
from bench_nnx_ppo import _config, _make_env, _make_network
from flax import nnx
from train_throughput import random_rollout


def _flops(workload: Workload, env: Any) -> tuple[float, float] | None:
    """Matmul FLOPs of the rollout's forward passes and of the learning, or None."""
    obs = env.observation_size
    if not isinstance(obs, int):
        return None
    shapes = layer_shapes(workload, obs, env.action_size)
    total = flops_per_iteration(workload, shapes)
    forward = sum(2 * a * b for a, b in shapes) * workload.steps_per_iteration
    return forward, total - forward


def _plain_learn(workload: Workload, shapes: list[tuple[int, int]], config: Any, runs: int) -> Any:
    """A jitted plain-JAX learning phase of ``workload``'s shapes; call it to run once.

    ``shapes`` lists the actor's layers, then the critic's (``layer_shapes``).
    """
    activation = getattr(jax.nn, workload.activation)
    n_actor = len(workload.actor_sizes) + 1
    steps = workload.steps_per_iteration
    minibatch = steps // workload.n_minibatches
    optimizer = optax.adam(workload.learning_rate)
    if config.gradient_clipping is not None:
        optimizer = optax.chain(optax.clip_by_global_norm(config.gradient_clipping), optimizer)

    def mlp(layers: Any, x: jax.Array) -> jax.Array:
        for i, (kernel, bias) in enumerate(layers):
            x = x @ kernel + bias
            if i < len(layers) - 1:
                x = activation(x)
        return x

    def loss(params: Any, x: jax.Array) -> jax.Array:
        return jnp.mean(mlp(params[:n_actor], x) ** 2) + jnp.mean(mlp(params[n_actor:], x) ** 2)

    def one_run(params: Any, opt_state: Any, observations: jax.Array, key: jax.Array) -> Any:
        def update(carry: Any, x: jax.Array) -> tuple[Any, None]:
            params, opt_state = carry
            updates, opt_state = optimizer.update(jax.grad(loss)(params, x), opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), None

        def epoch(carry: Any, key: jax.Array) -> tuple[Any, None]:
            shuffled = observations[jax.random.permutation(key, steps)]
            minibatches = shuffled.reshape(workload.n_minibatches, minibatch, -1)
            return jax.lax.scan(update, carry, minibatches)[0], None

        keys = jax.random.split(key, workload.n_epochs)
        return jax.lax.scan(epoch, (params, opt_state), keys)[0]

    def params_of(seed: int) -> list[tuple[jax.Array, jax.Array]]:
        keys = jax.random.split(jax.random.key(seed), len(shapes))
        return [
            (jax.random.normal(k, (a, b)) / a**0.5, jnp.zeros(b))
            for k, (a, b) in zip(keys, shapes, strict=True)
        ]

    params = jax.tree.map(lambda *leaves: jnp.stack(leaves), *map(params_of, range(runs)))
    opt_states = jax.vmap(optimizer.init)(params)
    observations = jax.random.normal(jax.random.key(runs), (runs, steps, shapes[0][0]))
    keys = jax.random.split(jax.random.key(runs + 1), runs)
    from nnx_ppo._compile import training_compile_options

    program = jax.jit(jax.vmap(one_run), compiler_options=training_compile_options())
    return lambda: program(params, opt_states, observations, keys)


def main() -> None:
    parser = argparse.ArgumentParser(description="time the parts of one PPO iteration")
    parser.add_argument("--workload", choices=list(WORKLOADS), default="A")
    parser.add_argument("--runs", type=int, default=1, help="runs vmapped in one program")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--trace", help="write a jax.profiler trace of 3 whole steps here")
    parser.add_argument(
        "--per-call",
        type=int,
        default=1,
        help="also time the compiled step with this many iterations in one call (ms per iteration)",
    )
    args = parser.parse_args()
    workload = WORKLOADS[args.workload]

    from nnx_ppo._compile import training_compile_options
    from nnx_ppo.algorithms import _step, rollout
    from nnx_ppo.algorithms._advantages import compute_advantages
    from nnx_ppo.algorithms._learn import _learn
    from nnx_ppo.algorithms._runs import _stack
    from nnx_ppo.algorithms.ppo import new_training_state

    env = _make_env(workload)
    config = _config(workload, 1).ppo
    states = [
        _step._prepared(
            "profile",
            new_training_state(env, _make_network(workload, env, "mlp", seed), config.n_envs, seed),
            config,
        )
        for seed in range(args.runs)
    ]
    graphdef, _ = nnx.split((states[0].networks, states[0].optimizer))
    splits = [nnx.split((s.networks, s.optimizer))[1] for s in states]
    carries = [_step._carry_of(s) for s in states]
    key = jax.random.key(1)
    options = training_compile_options()

    def collect(split: Any, carry: Any) -> Any:
        networks, _ = nnx.merge(graphdef, split)
        return _step._collect(env, config, networks, carry, None).transitions

    def advantages(transitions: Any) -> Any:
        return compute_advantages(transitions, config.gae_lambda, config.discounting_factor)

    def learn(split: Any, data: Any) -> Any:
        networks, optimizer = nnx.merge(graphdef, split)
        _learn(networks, optimizer, data, key, config)
        return nnx.state((networks, optimizer))

    def env_only(env_states: Any, key: Any) -> Any:
        return random_rollout(env, env_states, workload.rollout_length, key)

    if args.runs == 1:
        split, carry = splits[0], carries[0]
        programs = [
            jax.jit(f, compiler_options=options) for f in (collect, advantages, learn, env_only)
        ]
        whole_program = _step._compiled_steps
    else:
        split, carry = _stack(splits, None), _stack(carries, None)
        axis = _step._RUN_AXIS
        programs = [
            jax.jit(jax.vmap(f, axis_name=axis), compiler_options=options)
            for f in (collect, advantages, learn, env_only)
        ]
        whole_program = _step._compiled_run_steps
    collect_program, advantages_program, learn_program, env_program = programs
    arguments = (
        _step._EnvArgument(env),
        _step._ConfigArgument(config),
        _step._GraphArgument(graphdef),
    )

    def whole(iterations: int = 1) -> Any:
        return jax.device_get(whole_program(*arguments, split, carry, iterations)[2])

    with rollout._across_runs(_step._RUN_AXIS) if args.runs > 1 else contextlib.nullcontext():
        transitions = collect_program(split, carry)
        scored = advantages_program(transitions)
        data = (carry.network_states, transitions, *scored)
        times = {
            "env only": best_seconds(
                lambda: env_program(carry.env_states, carry.key), args.repeats
            ),
            "rollout": best_seconds(lambda: collect_program(split, carry), args.repeats),
            "advantages": best_seconds(lambda: advantages_program(transitions), args.repeats),
            "learn": best_seconds(lambda: learn_program(split, data), args.repeats),
            "whole step": best_seconds(whole, args.repeats),
        }
        if args.per_call > 1:
            many = best_seconds(lambda: whole(args.per_call), args.repeats)
            times[f"{args.per_call}/call"] = many / args.per_call
        obs = env.observation_size
        if isinstance(obs, int):
            shapes = layer_shapes(workload, obs, env.action_size)
            times["plain learn"] = best_seconds(
                _plain_learn(workload, shapes, config, args.runs), args.repeats
            )
        if args.trace:
            with jax.profiler.trace(args.trace):
                for _ in range(3):
                    whole()

    flops = _flops(workload, env)
    part_flops = {}
    if flops is not None:
        part_flops = {
            "rollout": flops[0],
            "learn": flops[1],
            "whole step": sum(flops),
            "plain learn": flops[1],
        }
        if args.per_call > 1:
            part_flops[f"{args.per_call}/call"] = sum(flops)
    part_flops = {name: f * args.runs for name, f in part_flops.items()}
    steps = workload.steps_per_iteration * args.runs
    print(
        f"workload {args.workload}, {args.runs} run(s): {workload.n_envs} envs x "
        f"{workload.rollout_length} steps, {workload.n_epochs} epochs x "
        f"{workload.n_minibatches} minibatches; best of {args.repeats}, "
        f"{jax.devices()[0].platform}"
    )
    print(f"{'part':<12} {'ms':>9} {'share':>7} {'env steps/s':>12} {'GFLOP':>8} {'GFLOP/s':>8}")
    for name, seconds in times.items():
        share = seconds / times["whole step"]
        gflop = part_flops.get(name)
        rate = "" if gflop is None else f"{gflop / 1e9:8.3f} {gflop / 1e9 / seconds:8.1f}"
        print(f"{name:<12} {seconds * 1e3:9.2f} {share:7.1%} {steps / seconds:12,.0f} {rate}")


if __name__ == "__main__":
    main()
