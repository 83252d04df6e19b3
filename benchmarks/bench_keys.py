"""One run's whole-run program with JAX's default keys and with straight-line keys.

On CPU, ``train_ppo_runs`` hashes the keys of a device's several runs as
straight-line code (``nnx_ppo._threefry``); one run's programs keep JAX's own
hash, a small loop. This script times that choice for one run: the workload's
whole run as one program, compiled in one process twice: the library's own
(``_compiled_steps``), and the same steps with their keys rewrapped as
straight-line keys on the way in (and back on the way out); called alternately.
It also checks that the two programs end in bit-identical states and reports.

    python benchmarks/bench_keys.py --workload small
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import jax
import numpy as np
from bench_common import WORKLOADS, emit
from bench_nnx_ppo import step_arguments


def _bits(tree: Any) -> list[np.ndarray]:
    """Every leaf as a NumPy array, keys as their data."""

    def data(leaf: Any) -> Any:
        is_key = jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)
        return jax.random.key_data(leaf) if is_key else leaf

    return [np.asarray(data(leaf)) for leaf in jax.tree.leaves(jax.device_get(tree))]


def main() -> None:
    parser = argparse.ArgumentParser(description="JAX's keys against straight-line keys, one run")
    parser.add_argument("--workload", choices=list(WORKLOADS), default="small")
    parser.add_argument("--calls", type=int, default=6, help="calls of each program")
    args = parser.parse_args()
    workload = WORKLOADS[args.workload]

    from nnx_ppo._threefry import standard_keys
    from nnx_ppo.algorithms import _step

    _, config, _, arguments = step_arguments(workload, "bench_keys")
    env_argument, config_argument, graph, module_state, carry = arguments
    iterations = config.total_steps // config.steps_per_iteration

    def straight_keys(module_state: Any, carry: Any) -> Any:
        trained = _step._scan_steps(
            env_argument,
            config_argument,
            graph,
            *_step._with_straight_line_keys(module_state, carry),
            iterations,
        )
        return standard_keys(trained)

    from nnx_ppo._compile import training_compile_options

    programs = {}
    start = time.perf_counter()
    programs["JAX keys (the library's program)"] = _step._compiled_steps.lower(
        env_argument, config_argument, graph, module_state, carry, iterations
    ).compile()
    print(f"JAX keys: traced and compiled in {time.perf_counter() - start:.2f} s", flush=True)
    start = time.perf_counter()
    straight = jax.jit(straight_keys, compiler_options=training_compile_options())
    programs["straight-line keys"] = straight.lower(module_state, carry).compile()
    print(f"straight-line keys: traced and compiled in {time.perf_counter() - start:.2f} s")

    results = {name: program(module_state, carry) for name, program in programs.items()}
    identical = all(
        np.array_equal(a, b, equal_nan=True)
        for a, b in zip(*(_bits(r) for r in results.values()), strict=True)
    )
    seconds: dict[str, list[float]] = {name: [] for name in programs}
    for _ in range(args.calls):
        for name, program in programs.items():
            start = time.perf_counter()
            jax.block_until_ready(program(module_state, carry))
            seconds[name].append(time.perf_counter() - start)
    for name, times in seconds.items():
        print(
            f"{name}: {iterations} iterations in {statistics.median(times):.3f} s "
            f"(median of {len(times)}; {min(times):.3f}-{max(times):.3f})"
        )
    print(f"results bit-identical: {identical}")
    emit(
        {
            "library": "bench_keys",
            "workload": args.workload,
            "iterations": iterations,
            "call_s": seconds,
            "bit_identical": identical,
        }
    )


if __name__ == "__main__":
    main()
