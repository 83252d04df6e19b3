"""A small, recorded hyperparameter sweep of ``nnx-ppo train`` on MuJoCo Playground envs.

Each candidate of ``playground_sweep.toml`` is a list of ``--set`` overrides on
top of the env's preset; every candidate runs for each seed with this repo's
``nnx-ppo train`` in the benchmark's ``ours`` venv (``peers.py`` installs it,
with the ``playground`` extra). Finished runs are kept under ``--out`` and not
run again, so an interrupted sweep resumes where it stopped. The table gives
the median over seeds of the evaluation return at fixed env steps, the lowest
return from ``--hold-from`` on, and the median wall time of a run.

    python benchmarks/playground_sweep.py --env CartpoleBalance --steps 1500000
    python benchmarks/playground_sweep.py --env CartpoleSwingup --candidates base,fast
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

from learning_common import cells, columns, markdown_row, run_nnx_ppo_train

HERE = Path(__file__).resolve().parent
CANDIDATES = HERE / "playground_sweep.toml"


def main() -> None:
    parser = argparse.ArgumentParser(description="sweep nnx-ppo train settings on one env")
    parser.add_argument("--env", required=True, help="a table of playground_sweep.toml")
    parser.add_argument("--steps", type=int, default=1_500_000)
    parser.add_argument("--seeds", default="0", help="comma-separated seeds")
    parser.add_argument("--candidates", help="comma-separated names (default: all of the env)")
    parser.add_argument("--eval-every", type=int, default=100_000, help="env steps")
    parser.add_argument("--hold-from", type=int, help="report the lowest return from here on")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "sweep")
    args = parser.parse_args()

    table = tomllib.loads(CANDIDATES.read_text())
    if args.env not in table:
        parser.error(f"{CANDIDATES.name} has no [{args.env}] table; it has {sorted(table)}")
    candidates: dict[str, list[str]] = table[args.env]
    names = args.candidates.split(",") if args.candidates else list(candidates)
    unknown = [name for name in names if name not in candidates]
    if unknown:
        parser.error(f"unknown candidates {unknown}; [{args.env}] has {sorted(candidates)}")
    seeds = [int(seed) for seed in args.seeds.split(",")]
    hold_from = args.hold_from or 500_000
    header = columns(args.steps, hold_from)
    lines = [
        f"{args.env}, {args.steps:,} steps, seeds {args.seeds}: median eval return over seeds",
        "",
        markdown_row("candidate", [*header, "overrides"]),
        markdown_row("---", [*("---:" for _ in header), "---"]),
    ]
    for name in names:
        overrides = [f"eval.every_steps={args.eval_every}", *candidates[name]]
        curves = []
        for seed in seeds:
            run_dir = args.out / args.env / f"{name}-{args.steps}" / f"seed{seed}"
            curves.append(run_nnx_ppo_train(run_dir, args.env, args.steps, seed, overrides))
            print(f"{name} seed {seed}: {[round(r) for r in curves[-1].returns]}", flush=True)
        row = cells(curves, args.steps, hold_from)
        lines.append(markdown_row(name, [*row, " ".join(candidates[name])]))
    report = "\n".join(lines)
    print(report)
    out = args.out / f"{args.env}-{args.steps}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report + "\n")


if __name__ == "__main__":
    main()
