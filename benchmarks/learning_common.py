"""What the Playground sweep and learning benchmark share: running a training, reading its curve.

Standard library only; the trainings run in the cached venvs of ``peers.py``.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from peers import PEERS, ensure

DONE_FILE = "bench_done.json"
"""Written into a run directory once its training finished: the run's wall time and command."""


@dataclasses.dataclass(frozen=True)
class Curve:
    """Evaluation returns of one run: at each evaluated env step, and the seconds it took."""

    steps: tuple[int, ...]
    returns: tuple[float, ...]
    seconds: tuple[float, ...]
    wall_s: float

    def at(self, step: int) -> float | None:
        """The last evaluation return at or before ``step``; ``None`` before the first."""
        value = None
        for evaluated, ret in zip(self.steps, self.returns, strict=True):
            if evaluated > step:
                break
            value = ret
        return value

    def min_from(self, step: int) -> float | None:
        """The lowest evaluation return from ``step`` on."""
        after = [ret for s, ret in zip(self.steps, self.returns, strict=True) if s >= step]
        return min(after) if after else None


def run_nnx_ppo_train(
    run_dir: Path, env: str, steps: int, seed: int, overrides: Sequence[str]
) -> Curve:
    """Train with this repo's ``nnx-ppo train`` (``ours`` venv) unless ``run_dir`` is done."""
    if not (run_dir / DONE_FILE).is_file():
        ensure(PEERS["ours"], quiet=True)
        python = PEERS["ours"].python
        command = [str(python), "-m", "nnx_ppo", "train", "--env", env, "--quiet"]
        command += ["--steps", str(steps), "--seed", str(seed), "--run-dir", str(run_dir)]
        for assignment in overrides:
            command += ["--set", assignment]
        if run_dir.exists():
            raise RuntimeError(f"{run_dir} holds an unfinished run; delete it to run it again")
        run_and_record(command, run_dir)
    return read_curve(run_dir)


def run_and_record(command: list[str], run_dir: Path) -> None:
    """Run a training command; once it succeeds, record its start and wall time in ``run_dir``."""
    start = time.time()
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} failed ({completed.returncode}):\n{completed.stderr[-3000:]}"
        )
    record = {"start": start, "wall_s": time.time() - start, "command": command}
    record["stdout_tail"] = completed.stdout[-4000:]
    (run_dir / DONE_FILE).write_text(json.dumps(record, indent=1))


def read_curve(run_dir: Path) -> Curve:
    """The evaluation curve of a finished run: ``metrics.jsonl`` lines with an eval return.

    Each line's ``time`` (Unix seconds) less the process's start is the wall
    time a user waited for that point, start-up and compilation included.
    """
    done = json.loads((run_dir / DONE_FILE).read_text())
    steps, returns, seconds = [], [], []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("eval/episode_reward/mean") is not None:
            steps.append(int(record["step"]))
            returns.append(float(record["eval/episode_reward/mean"]))
            seconds.append(float(record["time"]) - float(done["start"]))
    return Curve(tuple(steps), tuple(returns), tuple(seconds), float(done["wall_s"]))


def columns(steps: int, hold_from: int) -> list[str]:
    """The headers of a results table: returns every 0.5M steps, at the end, the lowest
    from ``hold_from`` on, and the wall time."""
    marks = [f"{mark / 1e6:g}M" for mark in range(500_000, steps, 500_000)]
    return [*marks, "end", f"min from {hold_from / 1e6:g}M", "wall s"]


def cells(curves: Sequence[Curve], steps: int, hold_from: int) -> list[str]:
    """One table row under :func:`columns`: medians over the curves (seeds) of each figure.

    A mark's figure is the last evaluation at or before it; ``end`` is the final
    evaluation (the run ends on a whole PPO step, at or past ``steps``).
    """
    row = [fmt(median([c.at(mark) for c in curves])) for mark in range(500_000, steps, 500_000)]
    row.append(fmt(median([c.returns[-1] if c.returns else None for c in curves])))
    row.append(fmt(median([c.min_from(hold_from) for c in curves])))
    row.append(fmt(median([c.wall_s for c in curves])))
    return row


def markdown_row(label: str, values: Sequence[str]) -> str:
    """``| label | v1 | v2 | ... |``."""
    return "| " + " | ".join([label, *values]) + " |"


def median(values: Sequence[float | None]) -> float | None:
    """The median of the values that are known."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def fmt(value: float | None) -> str:
    """A return for a table: no decimals, or a dash when unknown."""
    return "-" if value is None else f"{value:.0f}"
