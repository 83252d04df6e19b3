"""PPO steps per second over 1, 2, 4 ... devices: how data-parallel training scales.

Each device count runs in a fresh process (the forced CPU device count is fixed
when JAX starts). On CPU, forced devices share the machine's cores, so the
figures measure the cost of splitting, not a speed-up; on a machine with several
GPUs, ``--platform gpu`` uses the real devices.

    python benchmarks/scaling.py                       # CPU: 1, 2, 4 forced devices
    python benchmarks/scaling.py --platform gpu --devices 1 2 4 8 --n-envs 4096

Printed per device count: the steady-state env steps/s of the compiled PPO step
(median of the timed calls, min and max), the compile time of the first call,
and the steady rate as a ratio to one device.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def measure(args: argparse.Namespace, devices: int) -> dict[str, float]:
    """Train in this process over ``devices`` devices; the timings as a dict."""
    import jax
    from flax import nnx

    from nnx_ppo.algorithms import sharding
    from nnx_ppo.algorithms.config import PPOConfig
    from nnx_ppo.algorithms.ppo import new_training_state, ppo_steps
    from nnx_ppo.envs import make
    from nnx_ppo.networks.factories import make_default_network

    env = make(args.env)
    networks = make_default_network(env, nnx.Rngs(0), hidden_sizes=(64, 64))
    config = PPOConfig(
        n_envs=args.n_envs,
        rollout_length=args.rollout_length,
        n_minibatches=args.n_minibatches,
        n_epochs=args.n_epochs,
    )
    state = new_training_state(env, networks, config.n_envs, seed=0)
    state = sharding.shard_training_state(state, sharding.data_mesh(devices))
    start = time.perf_counter()
    state, _ = ppo_steps(env, state, config, args.iterations_per_call)
    jax.block_until_ready(jax.tree.leaves(state.env_states))
    compile_s = time.perf_counter() - start
    rates = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        state, _ = ppo_steps(env, state, config, args.iterations_per_call)
        jax.block_until_ready(jax.tree.leaves(state.env_states))
        elapsed = time.perf_counter() - start
        rates.append(args.iterations_per_call * config.steps_per_iteration / elapsed)
    return {
        "devices": devices,
        "platform": jax.default_backend(),
        "median": statistics.median(rates),
        "min": min(rates),
        "max": max(rates),
        "compile_s": compile_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--platform", choices=("cpu", "gpu", "tpu"), default="cpu")
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--env", default="cartpole")
    parser.add_argument("--n-envs", type=int, default=256)
    parser.add_argument("--rollout-length", type=int, default=32)
    parser.add_argument("--n-minibatches", type=int, default=4)
    parser.add_argument("--n-epochs", type=int, default=4)
    parser.add_argument("--iterations-per-call", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        print(json.dumps(measure(args, args.worker)))
        return

    rows = []
    for devices in args.devices:
        environment = dict(os.environ, JAX_PLATFORMS=args.platform)
        if args.platform == "cpu":
            environment["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
        command = [sys.executable, __file__, *sys.argv[1:], "--worker", str(devices)]
        completed = subprocess.run(
            command, env=environment, capture_output=True, text=True, check=False
        )
        if completed.returncode != 0:
            print(completed.stderr[-2000:], file=sys.stderr)
            raise SystemExit(f"the run over {devices} devices failed")
        rows.append(json.loads(completed.stdout.strip().splitlines()[-1]))

    base = rows[0]["median"]
    print(
        f"env {args.env}, {args.n_envs} envs x {args.rollout_length} steps, "
        f"{args.n_epochs} epochs x {args.n_minibatches} minibatches, platform {args.platform}"
    )
    print(
        f"{'devices':>7}  {'steps/s (median)':>16}  {'min':>9}  {'max':>9}  "
        f"{'compile s':>9}  {'vs 1st':>6}"
    )
    for row in rows:
        print(
            f"{row['devices']:>7}  {row['median']:>16,.0f}  {row['min']:>9,.0f}  "
            f"{row['max']:>9,.0f}  {row['compile_s']:>9.1f}  {row['median'] / base:>6.2f}"
        )


if __name__ == "__main__":
    main()
