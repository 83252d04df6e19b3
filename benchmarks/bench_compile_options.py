"""The library's XLA options for its training programs against XLA's defaults, in one process.

On CPU the library compiles its training programs with
``nnx_ppo._compile.training_compile_options()`` (YNNPACK given dots alone). This
script shows what that buys, without the run-to-run noise of separate processes:

1. it builds one training state for a workload, as ``bench_nnx_ppo.py`` does;
2. it compiles the three programs of a one-step call (the fresh env states'
   reset, the rollout and the learning) twice: with the library's options and
   with XLA's defaults (``TrainingProgram.plain``), timing each compile;
3. it runs the two sets alternately on the same inputs, ``--calls`` times each
   (one call = reset, rollout, learning, as ``train_ppo`` runs a step), and
   prints the median, min and max milliseconds per part and per step.

    python benchmarks/bench_compile_options.py --workload A
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import jax
from bench_common import WORKLOADS
from bench_nnx_ppo import step_arguments

PARTS = ("reset", "rollout", "learning")


def main() -> None:
    parser = argparse.ArgumentParser(description="the library's XLA options against defaults")
    parser.add_argument("--workload", choices=list(WORKLOADS), default="A")
    parser.add_argument("--calls", type=int, default=30, help="steps run with each set")
    args = parser.parse_args()
    workload = WORKLOADS[args.workload]

    from nnx_ppo._compile import training_compile_options
    from nnx_ppo.algorithms import _step

    env, config, state, arguments = step_arguments(workload, "bench_compile_options")
    dynamic = arguments[3:]  # the compiled executables take the non-static arguments
    reset_static = (_step._EnvArgument(env), state.rng_key, config.n_envs)
    fresh = _step._fresh_env_states(env, state, config.n_envs)
    collected = _step._compiled_collect(*arguments, fresh)

    sets: dict[str, tuple[Any, Any, Any]] = {}
    compile_seconds: dict[str, dict[str, float]] = {}
    for label, library in (("library options", True), ("XLA defaults", False)):
        programs = []
        seconds = {}
        jax.clear_caches()  # the set-up above compiled the library's programs once already
        for part, program, inputs in (
            ("reset", _step._compiled_reset, reset_static),
            ("rollout", _step._compiled_collect, (*arguments, fresh)),
            ("learning", _step._compiled_learn, _step._learning_arguments(arguments, collected)),
        ):
            start = time.perf_counter()
            programs.append((program if library else program.plain).lower(*inputs).compile())
            seconds[part] = time.perf_counter() - start
        sets[label] = tuple(programs)  # type: ignore[assignment]
        compile_seconds[label] = seconds

    def step(programs: tuple[Any, Any, Any]) -> dict[str, float]:
        reset, collect, learn = programs
        times = {}
        start = time.perf_counter()
        jax.block_until_ready(reset(state.rng_key))
        times["reset"] = time.perf_counter() - start
        start = time.perf_counter()
        out = jax.block_until_ready(collect(*dynamic, fresh))
        times["rollout"] = time.perf_counter() - start
        start = time.perf_counter()
        jax.block_until_ready(learn(*_step._learning_arguments(arguments, out)[3:]))
        times["learning"] = time.perf_counter() - start
        return times

    samples: dict[str, list[dict[str, float]]] = {label: [] for label in sets}
    for programs in sets.values():  # a warm-up step each
        step(programs)
    for _ in range(args.calls):
        for label, programs in sets.items():
            samples[label].append(step(programs))

    print(
        f"workload {args.workload}: {config.n_envs} envs x {config.rollout_length} steps, "
        f"{config.n_epochs} epochs x {config.n_minibatches} minibatches; "
        f"{args.calls} steps per set, alternating; options {training_compile_options()}"
    )
    print(f"{'set':<16} {'part':<9} {'compile s':>9} {'median ms':>10} {'min':>8} {'max':>8}")
    medians: dict[str, float] = {}
    for label, steps in samples.items():
        for part in (*PARTS, "step"):
            values = [sum(s.values()) if part == "step" else s[part] for s in steps]
            compiled = compile_seconds[label]
            compile_s = sum(compiled.values()) if part == "step" else compiled[part]
            median = statistics.median(values)
            medians[f"{label} {part}"] = median
            print(
                f"{label:<16} {part:<9} {compile_s:9.1f} {median * 1e3:10.2f} "
                f"{min(values) * 1e3:8.2f} {max(values) * 1e3:8.2f}"
            )
    for part in (*PARTS, "step"):
        ratio = medians[f"XLA defaults {part}"] / medians[f"library options {part}"]
        print(f"XLA defaults / library options, {part} median: {ratio:.3f}")


if __name__ == "__main__":
    main()
