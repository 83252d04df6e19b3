"""Learning benchmark: each Playground preset over several seeds, beside nnx-ppo 0.3.0.

For each env, this repo's ``nnx-ppo train --env ENV`` (its preset, unchanged
but for the evaluation cadence) and nnx-ppo 0.3.0 (``learn_nnx_ppo_030.py``)
train for ``--steps`` env steps per seed, in their cached venvs (``peers.py``);
runs alternate between the libraries. nnx-ppo 0.3.0 has no presets: by default
it gets Playground's published settings for these tasks scaled to 256 envs
(:data:`PLAYGROUND_SETTINGS`, the settings its users take), with
``--peer-settings preset`` this repo's preset instead; both use the preset's
network and evaluation. Finished
runs under ``--out`` are reused, so an interrupted benchmark resumes. It writes
``ENV.md`` (a table: median over seeds of the evaluation return at fixed env
steps, its lowest value from ``--hold-from`` on, the wall time) and ``ENV.png``
(return against env steps and against wall time; the median line and the
seeds' range) per env.

    python benchmarks/playground_learning.py --envs CartpoleBalance --steps 5000000
    python benchmarks/playground_learning.py --envs CartpoleSwingup --steps 3000000
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

from learning_common import (
    DONE_FILE,
    Curve,
    cells,
    columns,
    markdown_row,
    read_curve,
    run_and_record,
    run_nnx_ppo_train,
)
from peers import PEERS, ensure

HERE = Path(__file__).resolve().parent
OURS = "nnx-ppo (this repo)"
OLD = "nnx-ppo 0.3.0"
PLAYGROUND_SETTINGS = (
    "ppo.n_envs=256",
    "ppo.rollout_length=30",
    "ppo.discounting_factor=0.995",
    "ppo.n_epochs=16",
    "ppo.n_minibatches=8",
    "ppo.clip_range=0.3",
    "ppo.reward_scaling=10",
    "ppo.learning_rate=0.001",
    "ppo.learning_rate_schedule=constant",
    "network.entropy_weight=0.01",
)
"""Playground's published PPO settings for its dm_control tasks, scaled to 256 envs:
what a 0.3.0 user, who has no presets, would take (``--peer-settings playground``)."""
PEER_SETTINGS = {
    "playground": ("Playground's settings", PLAYGROUND_SETTINGS),
    "preset": ("this repo's preset", ()),
}
"""The settings nnx-ppo 0.3.0 may run with: a row label and ``--set`` overrides of the preset."""


def resolved_config(
    env: str, steps: int, seed: int, eval_every: int, overrides: tuple[str, ...] = ()
) -> dict:
    """The run configuration ``nnx-ppo train`` resolves for these options (ours venv)."""
    code = (
        "import json, sys; from nnx_ppo.cli.main import _build_parser, _resolve_config; "
        "args = _build_parser().parse_args(sys.argv[1:]); "
        "print(json.dumps(_resolve_config(args)))"
    )
    command = [str(PEERS["ours"].python), "-c", code, "train", "--env", env]
    command += ["--steps", str(steps), "--seed", str(seed)]
    for assignment in (f"eval.every_steps={eval_every}", *overrides):
        command += ["--set", assignment]
    return json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)


def run_old(run_dir: Path, config: dict) -> Curve:
    """nnx-ppo 0.3.0 with the same run configuration, unless ``run_dir`` is done."""
    if not (run_dir / DONE_FILE).is_file():
        if run_dir.exists():
            raise RuntimeError(f"{run_dir} holds an unfinished run; delete it to run it again")
        ensure(PEERS["nnx-ppo-0.3.0"], quiet=True)
        run_dir.mkdir(parents=True)
        config_path = run_dir / "run_config.json"
        config_path.write_text(json.dumps(config, indent=1))
        command = [str(PEERS["nnx-ppo-0.3.0"].python), str(HERE / "learn_nnx_ppo_030.py")]
        command += ["--config-json", str(config_path), "--run-dir", str(run_dir)]
        run_and_record(command, run_dir)
    return read_curve(run_dir)


def table(env: str, steps: int, curves: dict[str, list[Curve]], hold_from: int) -> str:
    """The markdown table of one env's runs."""
    header = columns(steps, hold_from)
    lines = [markdown_row("library", header), markdown_row("---", ["---:" for _ in header])]
    lines += [
        markdown_row(library, cells(runs, steps, hold_from)) for library, runs in curves.items()
    ]
    seeds = len(next(iter(curves.values())))
    title = f"{env}: evaluation return, median over {seeds} seeds, at env steps"
    return title + "\n\n" + "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description="learning curves of the Playground presets")
    parser.add_argument("--envs", default="CartpoleBalance,CartpoleSwingup")
    parser.add_argument("--steps", type=int, default=5_000_000)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--eval-every", type=int, default=100_000)
    parser.add_argument("--hold-from", type=int, default=1_500_000)
    parser.add_argument(
        "--libraries", default="ours,0.3.0", help="comma-separated, of ours and 0.3.0"
    )
    parser.add_argument(
        "--peer-settings",
        default="playground",
        help="comma-separated, of playground (nnx-ppo 0.3.0 with Playground's published "
        "settings) and preset (with this repo's preset): one row each",
    )
    parser.add_argument("--out", type=Path, default=HERE / "results" / "learning")
    args = parser.parse_args()
    ensure(PEERS["ours"], quiet=True)
    seeds = [int(seed) for seed in args.seeds.split(",")]
    for env in args.envs.split(","):
        libraries = args.libraries.split(",")
        peer_rows = {
            f"{OLD} ({PEER_SETTINGS[name][0]})": name
            for name in args.peer_settings.split(",")
            if "0.3.0" in libraries
        }
        curves: dict[str, list[Curve]] = {OURS: []} if "ours" in libraries else {}
        curves |= {row: [] for row in peer_rows}
        for seed in seeds:
            where = args.out / env / f"{args.steps}"
            eval_set = [f"eval.every_steps={args.eval_every}"]
            if OURS in curves:
                ours_dir = where / f"ours-seed{seed}"
                curves[OURS].append(run_nnx_ppo_train(ours_dir, env, args.steps, seed, eval_set))
                print(f"{env} {OURS} seed {seed}: {[round(r) for r in curves[OURS][-1].returns]}")
            for row, name in peer_rows.items():
                settings = PEER_SETTINGS[name][1]
                config = resolved_config(env, args.steps, seed, args.eval_every, settings)
                curves[row].append(run_old(where / f"0.3.0-{name}-seed{seed}", config))
                print(f"{env} {row} seed {seed}: {[round(r) for r in curves[row][-1].returns]}")
        report = table(env, args.steps, curves, args.hold_from)
        print(report)
        (args.out / f"{env}-{args.steps}.md").write_text(report)
        plot_data = {
            library: [
                {"steps": run.steps, "returns": run.returns, "seconds": run.seconds} for run in runs
            ]
            for library, runs in curves.items()
        }
        data_path = args.out / f"{env}-{args.steps}.json"
        data_path.write_text(json.dumps({"env": env, "curves": plot_data}))
        plot = [str(PEERS["ours"].python), str(HERE / "plot_learning.py"), str(data_path)]
        subprocess.run(plot, check=True)


if __name__ == "__main__":
    main()
