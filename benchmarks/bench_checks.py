"""The contract checks' cost at run time, measured in one process: checks on against off.

Separate processes (``compare.py``'s ``checks`` rows) measure compile time well,
but their steady rates differ from run to run by more than the 2% in question.
This script takes that noise out:

1. it builds one training state for a workload, as ``bench_nnx_ppo.py`` does;
2. it traces, lowers and compiles the PPO step (one iteration per call) twice,
   inside ``nnx_ppo.checks(True)`` and ``nnx_ppo.checks(False)``, clearing JAX's
   caches in between so that the second is traced afresh;
3. it compares the two programs JAX hands to XLA (StableHLO, source locations
   left out): the checks run while JAX traces, so the programs should be equal,
   and XLA compiles equal programs to equal executables;
4. it runs the two executables alternately on the same inputs, ``--calls``
   times each, and prints the median, min and max seconds per call and their
   ratios.

    python benchmarks/bench_checks.py --workload A
"""

from __future__ import annotations

import argparse
import pathlib
import re
import statistics
import time
from typing import Any

import jax
from bench_common import WORKLOADS, emit
from bench_nnx_ppo import prepared_state
from flax import nnx


def program_text(lowered: Any) -> str:
    """The lowered program (StableHLO) without source locations, the module's name removed."""
    return _MODULE_NAME.sub("module", lowered.as_text(debug_info=False))


_MODULE_NAME = re.compile(r"^module @\S+", re.MULTILINE)


def main() -> None:
    parser = argparse.ArgumentParser(description="checks on vs off in one process")
    parser.add_argument("--workload", choices=list(WORKLOADS), default="A")
    parser.add_argument("--calls", type=int, default=40, help="calls of each executable")
    parser.add_argument("--dump", help="write the two programs' text to this folder")
    args = parser.parse_args()
    workload = WORKLOADS[args.workload]

    import nnx_ppo
    from nnx_ppo.algorithms import _step

    env, config, state = prepared_state(workload, "bench_checks")
    graphdef, split = nnx.split((state.networks, state.optimizer))
    carry = _step._carry_of(state)
    static = (
        _step._EnvArgument(env),
        _step._ConfigArgument(config),
        _step._GraphArgument(graphdef),
    )

    compiled: dict[str, Any] = {}
    texts: dict[str, str] = {}
    compile_seconds: dict[str, float] = {}
    for label, enabled in (("on", True), ("off", False)):
        jax.clear_caches()
        start = time.perf_counter()
        with nnx_ppo.checks(enabled):
            lowered = _step._compiled_steps.lower(*static, split, carry, 1)
        compiled[label] = lowered.compile()
        texts[label] = program_text(lowered)
        compile_seconds[label] = time.perf_counter() - start
    if args.dump:
        folder = pathlib.Path(args.dump)
        folder.mkdir(parents=True, exist_ok=True)
        for label, text in texts.items():
            (folder / f"checks_{label}.mlir").write_text(text)
    lines_on, lines_off = texts["on"].splitlines(), texts["off"].splitlines()
    differing = sum(a != b for a, b in zip(lines_on, lines_off, strict=False))
    differing += abs(len(lines_on) - len(lines_off))

    seconds: dict[str, list[float]] = {"on": [], "off": []}
    for label in ("on", "off"):  # a warm-up call each
        jax.block_until_ready(compiled[label](split, carry))
    for _ in range(args.calls):
        for label in ("on", "off"):
            start = time.perf_counter()
            jax.block_until_ready(compiled[label](split, carry))
            seconds[label].append(time.perf_counter() - start)
    emit(
        {
            "library": "checks-paired",
            "workload": args.workload,
            "programs_equal": texts["on"] == texts["off"],
            "program_lines": [len(lines_on), len(lines_off)],
            "differing_lines": differing,
            "compile_s": compile_seconds,
            "call_s": {
                label: {"median": statistics.median(s), "min": min(s), "max": max(s)}
                for label, s in seconds.items()
            },
            "calls": args.calls,
        }
    )


if __name__ == "__main__":
    main()
