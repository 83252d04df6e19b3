"""The run directory: resolved config, metrics log, TensorBoard events and the learning curve.

Layout of a run directory::

    config.json          the resolved configuration (env, seed, network preset, TrainConfig)
    metrics.jsonl        one JSON object per logged iteration:
                         {"step": s, "time": unix seconds, "<name>": value, ...}
    events.out.tfevents.*  the same scalars for TensorBoard (one file per session)
    learning_curve.png   evaluation (and training) return against environment steps
    checkpoints/         Orbax checkpoints, step_0000000512/ etc. (nnx_ppo.algorithms.checkpointing)
    videos/              with video.enabled, one recorded episode per recording: step_0000000000.gif
    .lock                held by the process training the run

``config.json``, ``learning_curve.png`` and a trimmed ``metrics.jsonl`` are written
to a temporary file and renamed over the old one, so a crash leaves either the old
file or the new one, never half of one. ``metrics.jsonl`` grows one line at a time;
a line cut short by a crash is dropped when the run is read or resumed.
"""

import contextlib
import fcntl
import json
import math
import os
import shlex
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO


def resume_command(run_dir: Path) -> str:
    """The command that continues the run in ``run_dir``, its path quoted for a shell
    where it needs quoting (a space, brackets)."""
    return f"nnx-ppo train --resume {shlex.quote(str(run_dir))}"


__all__ = [
    "EVAL_RETURN_KEY",
    "TRAIN_RETURN_KEY",
    "RunLockedError",
    "RunLogger",
    "hold_run_lock",
    "iter_metrics",
    "plot_learning_curve",
    "read_metrics",
    "resume_command",
    "trim_metrics",
    "write_atomically",
]

EVAL_RETURN_KEY = "eval/episode_reward/mean"
TRAIN_RETURN_KEY = "rollout_batch/episode_reward/mean"
LOCK_FILE = ".lock"


class RunLockedError(RuntimeError):
    """Another process is training this run directory."""


def write_atomically(path: Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file renamed over it.

    Readers see the old content or the new one, never a part of it.
    """
    with _replacing(path) as stream:
        stream.write(data.encode() if isinstance(data, str) else data)


@contextlib.contextmanager
def _replacing(path: Path) -> Iterator[BinaryIO]:
    """A stream to a temporary file that replaces ``path`` when the block ends without an
    error (synced to disk first); after an error ``path`` is left as it was."""
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with temporary.open("wb") as stream:
            yield stream
            stream.flush()
            os.fsync(stream.fileno())
        temporary.replace(path)
    finally:
        temporary.unlink(missing_ok=True)


@contextlib.contextmanager
def hold_run_lock(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir/.lock`` for the block; a second process is refused, not queued.

    The lock is the operating system's (``flock``): it goes with the process, so a
    run killed with ``kill -9`` leaves no stale lock behind.

    Raises:
      RunLockedError: another process holds the lock (its pid is named when known).
      OSError: the lock file could not be written (a full disk); a lock file this call
        created is removed again.
    """
    path = run_dir / LOCK_FILE
    created = not path.exists()
    # Unbuffered: a pid that cannot be written fails here, not again when the file closes.
    with path.open("a+b", buffering=0) as stream:
        try:
            fcntl.flock(stream.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as error:
            stream.seek(0)
            holder = stream.read().decode(errors="replace").strip() or "another process"
            raise RunLockedError(
                f"{run_dir} is being trained by process {holder} (it holds {path}); wait for "
                "it to finish or stop it, or choose another --run-dir"
            ) from error
        try:
            stream.truncate(0)
            stream.write(str(os.getpid()).encode())
        except OSError:
            if created:  # removed while still held: no process finds an empty lock file
                path.unlink(missing_ok=True)
            raise
        try:
            yield
        finally:
            fcntl.flock(stream.fileno(), fcntl.LOCK_UN)


class RunLogger:
    """Appends each iteration's flat metrics to ``metrics.jsonl`` and to TensorBoard.

    Use it as the ``log_fn`` of :func:`nnx_ppo.algorithms.ppo.train_ppo`.
    ``metrics.jsonl`` is the run's record: written a line per step, it holds every
    step logged up to a kill. TensorBoard's writer holds its events in memory for up
    to two minutes, so a kill loses some of them; each logger (each session of a run)
    therefore opens its TensorBoard file by discarding what earlier sessions wrote
    (TensorBoard's purge from step 0) and writing ``metrics.jsonl``'s records again.
    TensorBoard then shows what ``metrics.jsonl`` holds, each step once.
    """

    def __init__(self, run_dir: Path) -> None:
        from tensorboardX import SummaryWriter

        self.run_dir = run_dir
        self.metrics_path = run_dir / "metrics.jsonl"
        # tensorboardX names the file by the whole second it opens it in, and truncates a
        # file of that name: the time in nanoseconds keeps two sessions' files apart, and
        # in the order TensorBoard must read them, for purge_step (the nanoseconds within
        # the second alone put a session after a second's turn first).
        # An unbounded queue: tensorboardX's thread writes the events, and where it died
        # (a full disk, a file size limit) a bounded one would block the run for good
        # once full, before the next step could say why.
        self._writer = SummaryWriter(
            logdir=str(run_dir),
            purge_step=0,
            filename_suffix=f".{time.time_ns()}",
            max_queue=0,
        )
        for _, record in iter_metrics(self.metrics_path):
            scalars = {k: v for k, v in record.items() if k not in ("step", "time")}
            self._to_tensorboard(scalars, record["step"], record.get("time"))

    def __call__(self, metrics: dict[str, float], step: int) -> None:
        record = {"step": int(step), "time": time.time()}
        record |= {k: _json_number(v) for k, v in metrics.items()}
        try:
            with self.metrics_path.open("a") as stream:
                stream.write(json.dumps(record) + "\n")
        except OSError as error:
            raise OSError(
                f"could not log step {step} in {self.metrics_path}: "
                f"{error.strerror or error}; the checkpoints already written are intact, "
                f"and {resume_command(self.run_dir)} continues from the newest "
                "(dropping what it logged after it)"
            ) from error
        if _stopped_workers(self._writer):
            raise OSError(
                f"could not log step {step} to TensorBoard in {self.run_dir}: its event "
                "writer stopped (its error is printed above: a full disk or a file size "
                f"limit); {self.metrics_path} holds every step logged, the checkpoints "
                f"already written are intact, and {resume_command(self.run_dir)} "
                "continues from the newest"
            )
        self._to_tensorboard(metrics, step, record["time"])

    def _to_tensorboard(self, metrics: dict[str, Any], step: int, walltime: float | None) -> None:
        for name, value in metrics.items():
            if value is not None and math.isfinite(float(value)):  # None: a NaN in the file
                self._writer.add_scalar(name, float(value), int(step), walltime=walltime)

    def close(self) -> None:
        """Flush and close the TensorBoard file.

        Raises:
          OSError: the flush failed (a full disk). The writer is then given up:
            tensorboardX's exit handler and worker thread would each retry it and
            print a traceback after the run's own error.
        """
        if _stopped_workers(self._writer):
            _abandon(self._writer)
            raise OSError(
                f"the TensorBoard events in {self.run_dir} were not all written: the "
                "writer stopped (its error is printed above: a full disk or a file size "
                "limit)"
            )
        try:
            self._writer.close()
        except OSError:
            _abandon(self._writer)
            raise


def _event_writers(writer: Any) -> list[Any]:
    """A tensorboardX ``SummaryWriter``'s event file writers (each with its thread)."""
    file_writers = (getattr(writer, "all_writers", None) or {}).values()
    found = (getattr(file_writer, "event_writer", None) for file_writer in file_writers)
    return [events for events in found if events is not None]


def _stopped_workers(writer: Any) -> bool:
    """Whether a thread of ``writer`` that writes its events ended while still open (an
    error it raised ends it)."""
    return any(
        not events._closed and events._worker is not None and not events._worker.is_alive()
        for events in _event_writers(writer)
    )


def _abandon(writer: Any) -> None:
    """Stop a tensorboardX writer whose flush failed, without its later tracebacks."""
    previous = threading.excepthook
    threading.excepthook = lambda args: None  # the worker's last write fails the same way
    try:
        for events in _event_writers(writer):
            worker = getattr(events, "_worker", None)
            if worker is not None and worker.is_alive():  # a stopped one takes no signal
                worker.stop()
            events._closed = True  # what its exit handler checks before flushing again
    finally:
        threading.excepthook = previous


def _json_number(value: Any) -> float | None:
    number = float(value)
    return number if math.isfinite(number) else None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` file, in order; none if it does not exist yet.

    A last line cut short (the process was killed while writing it) is dropped;
    a broken line before the last is an error naming the file and the line. A long
    run's file holds a record per PPO step: :func:`iter_metrics` reads one at a time.
    """
    return [record for _, record in iter_metrics(path)]


def iter_metrics(path: Path) -> Iterator[tuple[bytes, dict[str, Any]]]:
    """Each record of a ``metrics.jsonl`` file with its line, read one line at a time.

    The same records as :func:`read_metrics`, without holding the file in memory.
    """
    if not path.exists():
        return
    with path.open("rb") as stream:
        lines = ((number, line) for number, line in enumerate(stream, start=1) if line.strip())
        pending = next(lines, None)
        while pending is not None:
            number, line = pending
            pending = next(lines, None)
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                if pending is None:
                    return  # the last line, cut short
                raise ValueError(f"{path} line {number} is not valid JSON: {error}") from error
            step = record.get("step") if isinstance(record, dict) else None
            if isinstance(step, bool) or not isinstance(step, int):
                raise ValueError(
                    f"{path} line {number} is not a metrics record: it has no int 'step'"
                )
            yield line if line.endswith(b"\n") else line + b"\n", record


def trim_metrics(path: Path, last_step: int) -> None:
    """Keep the records of steps up to ``last_step``: a resumed run logs the later ones again.

    With ``last_step < 0`` nothing is kept and the file is not read (what a run
    that failed before its first checkpoint logged is of no use, even if broken).
    The kept lines are copied one at a time, as they were written.
    """
    if not path.exists():
        return  # nothing logged yet
    with _replacing(path) as stream:
        if last_step >= 0:
            for line, record in iter_metrics(path):
                if record["step"] <= last_step:
                    stream.write(line)


def plot_learning_curve(metrics_path: Path, out_path: Path, title: str = "") -> None:
    """Plot evaluation and training return against environment steps into a PNG.

    Evaluations are marked as points, not joined: a line between two distant
    evaluations would draw a trend that was never measured.
    """
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = (
        (TRAIN_RETURN_KEY, "training episodes", "", "-"),
        (EVAL_RETURN_KEY, "evaluation (deterministic policy)", "o", ""),
    )
    points: dict[str, tuple[list[int], list[float]]] = {key: ([], []) for key, *_ in curves}
    for _, record in iter_metrics(metrics_path):
        for key, (steps, returns) in points.items():
            if record.get(key) is not None:
                steps.append(record["step"])
                returns.append(record[key])
    figure, axes = plt.subplots(figsize=(7, 4), dpi=100)
    for key, label, marker, line in curves:
        steps, returns = points[key]
        if steps:
            axes.plot(steps, returns, label=label, marker=marker, linestyle=line)
    axes.set_xlabel("environment steps")
    axes.set_ylabel("episode return")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    if axes.get_legend_handles_labels()[0]:
        axes.legend()
    figure.tight_layout()
    image = io.BytesIO()
    figure.savefig(image, format="png")
    plt.close(figure)
    write_atomically(out_path, image.getvalue())
