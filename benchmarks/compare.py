"""nnx-ppo against the JAX PPO trainers users would pick instead, run side by side.

One command installs every peer into its own cached venv (see ``peers.py``),
runs each workload's variants alternately (ours, peer, ours, peer, ...), each
run in a fresh process that prints one result line, and prints one table per
workload:

    python benchmarks/compare.py                      # every workload, full budgets
    python benchmarks/compare.py --quick              # every workload at 20k steps (smoke)
    python benchmarks/compare.py --workloads A,checks --repeats 3
    python benchmarks/compare.py --platform cuda --workloads large   # on a GPU
    python benchmarks/compare.py --platform cuda --wheelhouse .whl   # GPU image, no registry

Workloads: ``A`` and ``B`` (Playground CartpoleBalance, MJX's JAX backend:
this repo, nnx-ppo 0.3.0, Brax), ``large`` (config A at 4,096 envs, for a
GPU: ``gpu_compare.sh``), ``large-calls`` (this repo alone on ``large``, one
iteration per call against four), ``small`` (CleanRL's CartPole config: this
repo's built-in cart-pole, the whole run in one call and one step per call,
against rejax on gymnax), ``seeds`` (the small config, 8 seeds in one program,
split over one CPU device per core and on one device, against one seed: steps/s
are summed over the runs), ``lstm`` (this repo's memory
task, LSTM against MLP), ``checks`` (config A with the contract checks on and
off, in separate processes), ``checks-paired`` (config A's step compiled with
the checks on and off in one process: are the programs equal, and their call
times alternating) and ``ceiling`` (matmul GFLOP/s, network FLOPs, env-only
rate and the per-shape ceiling against this repo's config A rate). Raw results go to
``~/.cache/nnx-ppo-bench/results/``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import RESULT_PREFIX, T0_ENV_VAR, WORKLOADS
from peers import CACHE, PEERS, PLATFORMS, InstallRecord, Peer, ensure, peers_for

HERE = Path(__file__).resolve().parent
ALL_WORKLOADS = (
    "A",
    "B",
    "large",
    "large-calls",
    "small",
    "seeds",
    "lstm",
    "checks",
    "checks-paired",
    "ceiling",
)
SINGLE_RUN_WORKLOADS = ("checks-paired", "ceiling")
"""Workloads whose one script run measures everything, so it runs once."""
DEFAULT_WORKLOADS = {
    "cpu": tuple(w for w in ALL_WORKLOADS if not w.startswith("large")),
    "cuda": ("large",),
}
"""What runs without ``--workloads``: on CPU, all but the GPU-sized config."""
QUICK_STEPS = 20_000
RUN_TIMEOUT_S = 3600
VERSION_PACKAGES = {
    "ours": ("nnx-ppo", "jax", "flax", "playground", "mujoco-mjx"),
    "nnx-ppo-0.3.0": ("nnx-ppo", "jax", "flax", "playground", "mujoco-mjx"),
    "brax": ("brax", "jax", "flax", "playground", "mujoco-mjx"),
    "rejax": ("rejax", "gymnax", "jax", "flax"),
}


@dataclasses.dataclass(frozen=True)
class Variant:
    """One row of a table: a peer, the timing script's arguments, extra env vars."""

    label: str
    peer: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    script: str | None = None


@dataclasses.dataclass
class Run:
    """One finished process: its parsed result line (or why there is none)."""

    variant: Variant
    result: dict[str, Any] | None
    wall_s: float
    max_rss_mb: float
    error: str = ""


def _run_devices(runs: int) -> int:
    """The most CPU devices, one per core this process may use, that ``runs`` split over."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(d for d in range(1, min(runs, cores or 1) + 1) if runs % d == 0)


def variants_for(workload: str) -> list[Variant]:
    """The rows of ``workload``'s table; the first is the one ratios are taken to."""
    if workload in ("A", "B", "large"):
        args = ("--workload", workload)
        return [
            Variant("nnx-ppo (this repo)", "ours", args),
            Variant("nnx-ppo 0.3.0", "nnx-ppo-0.3.0", args),
            Variant("Brax PPO", "brax", args),
        ]
    if workload == "large-calls":
        # Does the host's dispatch of one call per iteration leave the GPU waiting?
        return [
            Variant("one iteration per call", "ours", ("--workload", "large")),
            Variant(
                "four iterations per call",
                "ours",
                ("--workload", "large", "--iterations-per-call", "4"),
            ),
        ]
    if workload == "small":
        # rejax compiles the whole run as one function; so does this repo with
        # iterations_per_call past the run's length (no evaluation is due).
        whole_run = ("--workload", "small", "--iterations-per-call", "100000")
        return [
            Variant("nnx-ppo, whole run per call", "ours", whole_run),
            Variant("nnx-ppo, one step per call", "ours", ("--workload", "small")),
            Variant("rejax (gymnax)", "rejax", ("--workload", "small")),
        ]
    if workload == "seeds":
        small = ("--workload", "small", "--iterations-per-call", "100000")
        eight = (*small, "--runs", "8")
        devices = _run_devices(8)
        # One CPU device per core (set before JAX starts): train_ppo_runs gives each
        # device its share of the runs. One run's 4 envs cannot split over devices.
        forced = (("XLA_FLAGS", f"--xla_force_host_platform_device_count={devices}"),)
        return [
            Variant(f"8 seeds in one program, {devices} CPU devices", "ours", eight, forced),
            Variant("8 seeds in one program, 1 device", "ours", eight),
            Variant("1 seed", "ours", small),
        ]
    if workload == "lstm":
        memory = ("--workload", "memory")
        return [
            Variant("MLP 2x64", "ours", (*memory, "--network", "mlp")),
            Variant("LSTM 64", "ours", (*memory, "--network", "lstm")),
        ]
    if workload == "checks":
        return [
            Variant("checks on", "ours", ("--workload", "A"), (("NNX_PPO_CHECKS", "1"),)),
            Variant("checks off", "ours", ("--workload", "A"), (("NNX_PPO_CHECKS", "0"),)),
        ]
    if workload == "checks-paired":
        label = "checks on vs off, one process"
        return [Variant(label, "ours", ("--workload", "A"), script="bench_checks.py")]
    if workload == "ceiling":
        return [Variant("ceiling", "ours", ("--workload", "A"), script="bench_ceiling.py")]
    raise ValueError(f"unknown workload {workload!r}; choose from {', '.join(ALL_WORKLOADS)}")


def run_once(variant: Variant, peer: Peer, total_steps: int | None, platform: str = "cpu") -> Run:
    """Run ``variant`` in a fresh process of its peer's venv and collect its result line.

    On ``cuda`` the process may use nothing but the GPU (``JAX_PLATFORMS=cuda``):
    a venv or machine without one fails the run instead of timing the CPU.
    """
    script = HERE / (variant.script or peer.script)
    command = [str(peer.python), str(script), *variant.args]
    if total_steps is not None and variant.script is None:
        command += ["--total-steps", str(total_steps)]
    env = {**os.environ, **dict(variant.env)}
    env.pop("PYTHONPATH", None)
    if platform != "cpu":
        env["JAX_PLATFORMS"] = platform
    env[T0_ENV_VAR] = repr(time.time())
    start = time.perf_counter()
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        stdout, stderr = process.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
    wall = time.perf_counter() - start
    # The child's own peak RSS (this harness starts one child at a time and waits
    # for it, so RUSAGE_CHILDREN's maximum so far is this child's unless an earlier
    # child peaked higher: the child reports its own figure too, used first).
    children_rss = _children_max_rss_mb()
    result = None
    for line in stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            result = json.loads(line[len(RESULT_PREFIX) :])
    rss = result.get("self_max_rss_mb", children_rss) if result else children_rss
    error = ""
    if result is None:
        tail = [line for line in stderr.strip().splitlines() if line.strip()][-6:]
        error = f"exit {process.returncode}: " + " | ".join(tail)
    elif "unavailable" in result:
        error = result["unavailable"]
    return Run(variant, result, wall, rss, error)


_SETTINGS_OF = {
    "large-calls": "large",
    "seeds": "small",
    "lstm": "memory",
    "checks": "A",
    "checks-paired": "A",
    "ceiling": "A",
}
"""The ``WORKLOADS`` entry whose settings a workload's runs use, where its name is not one."""


def _devices(runs: list[Run]) -> str:
    """``, on <device>`` from the runs' results (each names the device JAX ran on), or ``""``."""
    devices = sorted(
        {str(run.result["device"]) for run in runs if run.result and "device" in run.result}
    )
    return f", on {' / '.join(devices)}" if devices else ""


def _children_max_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


@dataclasses.dataclass
class Row:
    """A variant's figures over its runs, as the table shows them."""

    label: str
    steady: tuple[float, float, float] | None = None  # median, min, max steps/s
    wall_sps: float | None = None
    first_s: float | None = None
    wall_s: float | None = None
    rss_mb: float | None = None
    runs: int = 0
    note: str = ""


def summarise(label: str, runs: list[Run]) -> Row:
    """Pool the per-iteration rates of every run; take medians of the per-run figures."""
    good = [run for run in runs if run.result is not None and not run.error]
    if not good:
        reason = runs[0].error if runs else "not run"
        return Row(label, note=f"unavailable: {reason}")
    rates: list[float] = []
    wall_rates, firsts = [], []
    for run in good:
        r = run.result or {}
        per_call = r.get("iterations_per_call", 1)
        if _one_call(r):  # its ticks arrive together: only the whole run's rate is known
            rates.append(r["total_steps"] / r["wall_s"])
            wall_rates.append(r["total_steps"] / r["wall_s"])
        elif per_call > 1:
            call_rates, after_first = _per_call_rates(
                r["iteration_steps"], r["iteration_s"], per_call
            )
            rates += call_rates
            wall_rates.append(after_first)
        elif r.get("iteration_s"):
            rates += [s / t for s, t in zip(r["iteration_steps"], r["iteration_s"], strict=True)]
            wall_rates.append(sum(r["iteration_steps"]) / sum(r["iteration_s"]))
        elif "run_s" in r:  # one compiled call for the whole run (rejax)
            rates.append(r["total_steps"] / r["run_s"])
            wall_rates.append(r["total_steps"] / r["run_s"])
        if r.get("first_iteration_s") is not None:
            firsts.append(r["first_iteration_s"])
    row = Row(label, runs=len(good))
    if rates:
        row.steady = (statistics.median(rates), min(rates), max(rates))
        row.wall_sps = statistics.median(wall_rates)
    row.first_s = statistics.median(firsts) if firsts else None
    row.wall_s = statistics.median(run.wall_s for run in good)
    row.rss_mb = statistics.median(run.max_rss_mb for run in good)
    r0 = good[0].result or {}
    per_call = r0.get("iterations_per_call", 1)
    if _one_call(r0):
        row.first_s = None
        row.note = (
            "the whole run in one call: rates are the whole run's, start-up and compile included"
        )
    elif per_call > 1:
        row.note = (
            f"{per_call} iterations per call: steady is per call, 1st iter is the first call's end"
        )
    if isinstance(r0.get("compile_s"), int | float):  # rejax's; bench_checks' is per label
        compile_s = statistics.median((run.result or {})["compile_s"] for run in good)
        row.note = f"whole loop in one jit: compile {compile_s:.1f} s; rates are its run"
    device_peaks = [run.result["device_peak_mb"] for run in good if "device_peak_mb" in run.result]
    if device_peaks:
        peak = f"device peak memory {statistics.median(device_peaks):,.0f} MB"
        row.note = f"{row.note}; {peak}" if row.note else peak
    return row


def _one_call(result: dict[str, Any]) -> bool:
    """Whether a run of several iterations per call ran them all in its one call."""
    per_call = result.get("iterations_per_call", 1)
    return per_call > 1 and len(result.get("iteration_s", ())) < per_call


def _per_call_rates(
    steps: list[int], seconds: list[float], per_call: int
) -> tuple[list[float], float]:
    """Each call's steps/s after the first call, and their pooled rate.

    With ``per_call`` iterations per compiled call the host logs a call's
    iterations together when it ends, so the ticks come in bursts of
    ``per_call``: ``steps`` and ``seconds`` (between consecutive ticks) are
    grouped from the first call's last tick on, one group per call.
    """
    start = per_call - 1  # the gaps before this are inside the first call
    groups = [
        (sum(steps[i : i + per_call]), sum(seconds[i : i + per_call]))
        for i in range(start, len(steps), per_call)
    ]
    rates = [s / t for s, t in groups if t > 0]
    return rates, sum(steps[start:]) / sum(seconds[start:])


def _ratio(value: float | None, reference: float | None) -> str:
    if value is None or not reference:
        return "-"
    return f"{value / reference:.2f}"


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def format_table(title: str, rows: list[Row]) -> str:
    """One plain-text table; every ``x ref`` column is this row's value / the first row's."""
    ref = rows[0]
    header = [
        "variant",
        "steady sps med [min-max]",
        "x ref",
        "wall sps >1st",
        "x ref",
        "1st iter s",
        "x ref",
        "run s",
        "x ref",
        "peak RSS MB",
        "x ref",
        "runs",
    ]
    lines = []
    for row in rows:
        if row.steady is None and row.wall_s is None:
            lines.append([row.label, row.note])
            continue
        steady = (
            "-"
            if row.steady is None
            else f"{row.steady[0]:,.0f} [{row.steady[1]:,.0f}-{row.steady[2]:,.0f}]"
        )
        lines.append(
            [
                row.label,
                steady,
                _ratio(row.steady and row.steady[0], ref.steady and ref.steady[0]),
                _num(row.wall_sps),
                _ratio(row.wall_sps, ref.wall_sps),
                _num(row.first_s, 1),
                _ratio(row.first_s, ref.first_s),
                _num(row.wall_s, 1),
                _ratio(row.wall_s, ref.wall_s),
                _num(row.rss_mb),
                _ratio(row.rss_mb, ref.rss_mb),
                str(row.runs),
            ]
        )
    full = [line for line in lines if line[2:]]
    widths = [max([len(h)] + [len(line[i]) for line in full]) for i, h in enumerate(header)]
    out = [title, "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    for line in lines:
        if line[2:]:
            out.append("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)))
        else:  # unavailable: the label and the reason only
            out.append(f"{line[0].ljust(widths[0])}  {line[1]}")
    notes = [f"  {row.label}: {row.note}" for row in rows if row.note and row.steady]
    return "\n".join(out + notes)


def format_ceiling(ceiling: dict[str, Any] | None, ours: Row | None) -> str:
    """The ceiling figures, and this repo's config-A rate as a fraction of them."""
    if ceiling is None:
        return "ceiling: unavailable"
    flops = ceiling["flops_per_iteration"]
    shapes = ceiling["matmul_gflops_network_shapes"]
    lines = [
        "Ceiling (config A, this machine)",
        "  fp32 matmul GFLOP/s at the network's shapes (batch x in x out): "
        + ", ".join(f"{k} {v:.1f}" for k, v in shapes.items()),
        f"  fp32 matmul GFLOP/s, 2048^3: {ceiling['matmul_gflops_large']:.1f}",
        f"  network FLOPs per PPO iteration: {flops / 1e9:.3f} GFLOP "
        "(rollout forward + epochs x forward/backward, matmuls only)",
        f"  env-only steps/s (vmapped env.step, random actions, same n_envs): "
        f"{ceiling['env_only_steps_per_s']:,.0f}",
    ]
    steps = ceiling["steps_per_iteration"]
    env_s = steps / ceiling["env_only_steps_per_s"]
    ceilings = {
        "best network-shape matmul rate": max(shapes.values()),
        "2048^3 matmul rate": ceiling["matmul_gflops_large"],
    }
    ceiling_sps = {name: steps / (env_s + flops / rate / 1e9) for name, rate in ceilings.items()}
    lines += [
        f"  ceiling, env {env_s * 1e3:.1f} ms + network FLOPs at the {name} "
        f"({rate:.1f} GFLOP/s) {flops / rate / 1e6:.1f} ms per iteration: "
        f"{ceiling_sps[name]:,.0f} steps/s"
        for name, rate in ceilings.items()
    ]
    if ours is not None and ours.steady is not None:
        sps = ours.steady[0]
        achieved = flops * sps / ceiling["steps_per_iteration"] / 1e9
        best_shape = max(shapes.values())
        lines += [
            f"  this repo, config A: {sps:,.0f} steady steps/s = {achieved:.2f} network GFLOP/s",
            f"    = {achieved / best_shape:.1%} of the best network-shape matmul rate, "
            f"{achieved / ceiling['matmul_gflops_large']:.1%} of the large-matmul rate",
            f"    steps/s / env-only steps/s = {sps / ceiling['env_only_steps_per_s']:.1%}",
        ]
        lines += [
            f"    = {sps / rate:.1%} of the ceiling with the {name}"
            for name, rate in ceiling_sps.items()
        ]
    paired = ceiling.get("paired")
    if paired:
        lines += [
            f"  paired in one process, {paired['rounds']} rounds of this repo's iteration, "
            f"the env-only steps and {paired['product_shape']} products (medians [min-max]):",
            f"    env-only {_spread(paired['env_s'], 1e3)} ms, "
            f"products {_spread(paired['gflops'])} GFLOP/s",
            f"    one iteration per call (ppo_step) {_spread(paired['one_step_s'], 1e3)} ms: "
            f"{_spread(paired['fraction_one_step'], 100)}% of the ceiling",
            f"    {paired['fused_iterations']} iterations per call (ppo_steps), per iteration "
            f"{_spread(paired['fused_step_s'], 1e3)} ms: "
            f"{_spread(paired['fraction_fused_step'], 100)}% of the ceiling",
        ]
    return "\n".join(lines)


def _spread(values: list[float], scale: float = 1.0) -> str:
    """``median [min-max]`` of ``values`` times ``scale``, one decimal."""
    low, mid, high = (scale * v for v in (min(values), statistics.median(values), max(values)))
    return f"{mid:.1f} [{low:.1f}-{high:.1f}]"


def format_checks_paired(result: dict[str, Any] | None) -> str:
    """The step compiled with checks on and off in one process: program equality, call times."""
    if result is None:
        return "checks on vs off, one process: unavailable"
    calls = result["call_s"]
    on, off = calls["on"], calls["off"]
    equal = "equal" if result["programs_equal"] else f"{result['differing_lines']} lines differ"
    return "\n".join(
        [
            "Checks on vs off, one process (config A's step, one iteration per call)",
            f"  programs handed to XLA (StableHLO, no locations): {equal} "
            f"({result['program_lines'][0]:,} and {result['program_lines'][1]:,} lines)",
            f"  trace + compile s: on {result['compile_s']['on']:.1f}, "
            f"off {result['compile_s']['off']:.1f} (on first, so it also pays one-time set-up)",
            f"  ms per call, {result['calls']} calls each, alternating: on median "
            f"{on['median'] * 1e3:.1f} [{on['min'] * 1e3:.1f}-{on['max'] * 1e3:.1f}], off median "
            f"{off['median'] * 1e3:.1f} [{off['min'] * 1e3:.1f}-{off['max'] * 1e3:.1f}]",
            f"  off / on: median {off['median'] / on['median']:.3f}, "
            f"min {off['min'] / on['min']:.3f} (below 1: checks off faster)",
        ]
    )


def versions_line(name: str, record: InstallRecord | None) -> str:
    """``name: pkg==version, ...`` from the venv's ``pip freeze``."""
    if record is None or not record.ok:
        return f"{name}: not installed" + (f" ({record.reason.splitlines()[-1]})" if record else "")
    pins = ", ".join(f"{p}=={record.version_of(p)}" for p in VERSION_PACKAGES[name])
    if name == "ours":
        # An offline venv runs src/ from the path, unknown to pip: the version is the project's.
        project = tomllib.loads((HERE.parent / "pyproject.toml").read_text())["project"]
        pins = pins.replace("nnx-ppo==?", f"nnx-ppo=={project['version']} (src)")
        commit = subprocess.run(
            ["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        pins += f" at commit {commit or '?'}"
    return f"{name}: {pins}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_STEPS} steps, 1 repeat")
    parser.add_argument("--platform", choices=PLATFORMS, default="cpu", help="where JAX runs")
    parser.add_argument("--workloads", help="comma-separated (default: every one for the platform)")
    parser.add_argument("--repeats", type=int, help="runs per variant (default 3; 1 with --quick)")
    parser.add_argument("--total-steps", type=int, help="override every workload's budget")
    parser.add_argument("--peers", default=",".join(PEERS), help="peers to run (ours always)")
    parser.add_argument("--reinstall", action="store_true", help="rebuild the peer venvs")
    parser.add_argument(
        "--wheelhouse", type=Path, help="no registry: this Python's packages plus these wheels"
    )
    args = parser.parse_args()
    chosen = args.workloads or ",".join(DEFAULT_WORKLOADS[args.platform])
    workloads = [w.strip() for w in chosen.split(",") if w.strip()]
    for workload in workloads:
        try:
            variants_for(workload)  # fail fast on a typo
        except ValueError as error:
            parser.error(str(error))
    repeats = args.repeats or (1 if args.quick else 3)
    total_steps = args.total_steps or (QUICK_STEPS if args.quick else None)

    selected = {"ours", *(p.strip() for p in args.peers.split(","))}
    needed = {v.peer for w in workloads for v in variants_for(w) if v.peer in selected}
    peers = peers_for(args.platform, args.wheelhouse)
    records = {name: ensure(peers[name], args.reinstall) for name in peers if name in needed}
    print("\nPinned versions:")
    for name, record in records.items():
        print("  " + versions_line(name, record))

    all_runs: dict[str, list[Run]] = {}
    tables: list[str] = []
    ours_a: Row | None = None
    for workload in workloads:
        variants = [v for v in variants_for(workload) if v.peer in selected]
        runs: dict[Variant, list[Run]] = {v: [] for v in variants}
        if workload == "ceiling" and ours_a is None:
            # The trainer's rate the ceiling is compared with: one config-A run.
            variants = [Variant("nnx-ppo (this repo)", "ours", ("--workload", "A")), *variants]
            runs = {v: [] for v in variants}
        for repeat in range(1 if workload in SINGLE_RUN_WORKLOADS else repeats):
            for variant in variants:  # alternating: ours, peer, ours, peer, ...
                record = records[variant.peer]
                if not record.ok:
                    reason = record.reason.strip().splitlines()[-1:] or ["install failed"]
                    runs[variant].append(Run(variant, None, 0, 0, f"install failed: {reason[0]}"))
                    continue
                print(f"[run] {workload} {variant.label} ({repeat + 1}/{repeats})", flush=True)
                run = run_once(variant, peers[variant.peer], total_steps, args.platform)
                if run.error:
                    print(f"[run]   failed: {run.error[:300]}", flush=True)
                else:  # each run's figures as it ends, so a run cut short still shows them
                    done = summarise(variant.label, [run])
                    steady = f"{done.steady[0]:,.0f}" if done.steady else "?"
                    first = f"{done.first_s:.1f}" if done.first_s is not None else "?"
                    print(
                        f"[run]   steady {steady} steps/s, first iteration {first} s, "
                        f"wall {run.wall_s:.1f} s",
                        flush=True,
                    )
                runs[variant].append(run)
        all_runs[workload] = [run for rs in runs.values() for run in rs]
        budget = total_steps or WORKLOADS[_SETTINGS_OF.get(workload, workload)].total_steps
        title = f"\n== {workload}: {budget:,} env steps per run{_devices(all_runs[workload])}" + (
            " (QUICK SMOKE BUDGET: not results)" if args.quick else ""
        )
        if workload == "checks-paired":
            paired = runs[variants[0]]
            result = paired[0].result if paired and not paired[0].error else None
            tables.append(title + "\n" + format_checks_paired(result))
            continue
        if workload == "ceiling":
            ceiling_runs = runs[variants[-1]]
            ceiling = ceiling_runs[0].result if ceiling_runs and not ceiling_runs[0].error else None
            if ours_a is None and len(variants) > 1:
                ours_a = summarise("ours", runs[variants[0]])
            tables.append(title + "\n" + format_ceiling(ceiling, ours_a))
            continue
        rows = [summarise(v.label, runs[v]) for v in variants]
        if workload == "A":
            ours_a = rows[0]
        tables.append(format_table(title, rows))

    print("\n".join(tables))
    out_dir = CACHE / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = out_dir / f"{stamp}{'-quick' if args.quick else ''}.json"
    raw = {
        workload: [dataclasses.asdict(run) for run in runs] for workload, runs in all_runs.items()
    }
    path.write_text(json.dumps({"args": vars(args), "runs": raw}, indent=1, default=str))
    print(f"\nraw results: {path}")


if __name__ == "__main__":
    main()
