"""Live training progress on a terminal, and the summary table at the end."""

import sys
import time
from collections.abc import Iterable
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from nnx_ppo.cli.run_dir import EVAL_RETURN_KEY, TRAIN_RETURN_KEY

__all__ = ["TrainingProgress"]


class TrainingProgress:
    """A progress bar of environment steps with steps/s, ETA and the latest returns.

    Shown only when the console is a terminal; otherwise it stays quiet and only
    the final summary is printed. Feed it every logged iteration with
    :meth:`update` (it has the ``log_fn`` signature).
    """

    def __init__(
        self, total_steps: int, console: Console | None = None, start_step: int = 0
    ) -> None:
        self.console = console or Console(file=sys.stdout, emoji=False)
        self.total_steps = total_steps
        self.latest: dict[str, float] = {}
        self.latest_step: dict[str, int] = {}
        self.start_step = start_step
        self.step = start_step
        self._start = time.monotonic()
        self._progress = Progress(
            TextColumn("[bold]training"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[returns]}"),
            console=self.console,
            disable=not self.console.is_terminal,
        )
        self._task = self._progress.add_task(
            "train", total=total_steps, completed=start_step, rate="", returns=""
        )

    def __enter__(self) -> "TrainingProgress":
        self._start = time.monotonic()
        self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._progress.stop()

    @property
    def steps_per_second(self) -> float:
        return (self.step - self.start_step) / max(time.monotonic() - self._start, 1e-9)

    def update(self, metrics: dict[str, float], step: int) -> None:
        self.step = int(step)
        self.latest.update(metrics)
        self.latest_step.update(dict.fromkeys(metrics, self.step))
        returns = []
        if TRAIN_RETURN_KEY in self.latest:
            returns.append(f"train {self.latest[TRAIN_RETURN_KEY]:.1f}")
        if EVAL_RETURN_KEY in self.latest:
            returns.append(f"eval {self.latest[EVAL_RETURN_KEY]:.1f}")
        self._progress.update(
            self._task,
            completed=min(self.step, self.total_steps),
            rate=f"{self.steps_per_second:,.0f} steps/s",
            returns=" | ".join(returns),
        )

    def remember(self, records: Iterable[dict[str, Any]]) -> None:
        """Take the latest returns (and their steps) from records an earlier session logged."""
        for record in records:
            for key in (EVAL_RETURN_KEY, TRAIN_RETURN_KEY):
                if record.get(key) is not None:
                    self.latest[key] = record[key]
                    self.latest_step[key] = int(record["step"])

    def summary(self, extra: dict[str, Any]) -> Table:
        """A table of the run's final figures, to print once training ends."""
        table = Table(title="nnx-ppo training summary", show_header=False)
        rows: dict[str, Any] = {
            "environment steps": f"{self.step:,}",
            "wall time": f"{time.monotonic() - self._start:.1f} s",
            "steps / second": f"{self.steps_per_second:,.0f}",
        }
        for key, label in (
            (EVAL_RETURN_KEY, "final eval return"),
            (TRAIN_RETURN_KEY, "final training return"),
        ):
            if key in self.latest:
                rows[label] = f"{self.latest[key]:.2f} (step {self.latest_step[key]:,})"
        rows.update(extra)
        for label, value in rows.items():
            table.add_row(label, Text(str(value)))  # a path's brackets are not markup
        return table
