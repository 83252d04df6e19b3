"""The run directory: resolved config, metrics log, TensorBoard events and the learning curve.

Layout of a run directory::

    config.json          the resolved configuration (env, seed, network preset, TrainConfig)
    metrics.jsonl        one JSON object per logged iteration: {"step": s, "<name>": value, ...}
    events.out.tfevents.*  the same scalars for TensorBoard
    learning_curve.png   evaluation (and training) return against environment steps
    checkpoints/         Orbax checkpoints, see nnx_ppo.algorithms.checkpointing
"""

import json
import math
from pathlib import Path
from typing import Any

__all__ = ["EVAL_RETURN_KEY", "TRAIN_RETURN_KEY", "RunLogger", "plot_learning_curve"]

EVAL_RETURN_KEY = "eval/episode_reward/mean"
TRAIN_RETURN_KEY = "rollout_batch/episode_reward/mean"


class RunLogger:
    """Appends each iteration's flat metrics to ``metrics.jsonl`` and to TensorBoard.

    Use it as the ``log_fn`` of :func:`nnx_ppo.algorithms.ppo.train_ppo`.
    """

    def __init__(self, run_dir: Path) -> None:
        from tensorboardX import SummaryWriter

        self.run_dir = run_dir
        self.metrics_path = run_dir / "metrics.jsonl"
        self._writer = SummaryWriter(logdir=str(run_dir))

    def __call__(self, metrics: dict[str, float], step: int) -> None:
        record = {"step": int(step), **{k: _json_number(v) for k, v in metrics.items()}}
        with self.metrics_path.open("a") as stream:
            stream.write(json.dumps(record) + "\n")
        for name, value in metrics.items():
            if math.isfinite(float(value)):
                self._writer.add_scalar(name, float(value), int(step))

    def close(self) -> None:
        self._writer.close()


def _json_number(value: Any) -> float | None:
    number = float(value)
    return number if math.isfinite(number) else None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` file, in order."""
    with path.open() as stream:
        return [json.loads(line) for line in stream if line.strip()]


def plot_learning_curve(metrics_path: Path, out_path: Path, title: str = "") -> None:
    """Plot evaluation and training return against environment steps into a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path) if metrics_path.exists() else []
    figure, axes = plt.subplots(figsize=(7, 4), dpi=100)
    for key, label, marker in (
        (TRAIN_RETURN_KEY, "training episodes", ""),
        (EVAL_RETURN_KEY, "evaluation (deterministic policy)", "o"),
    ):
        points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        if points:
            steps, returns = zip(*points, strict=True)
            axes.plot(steps, returns, label=label, marker=marker)
    axes.set_xlabel("environment steps")
    axes.set_ylabel("episode return")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    if axes.get_legend_handles_labels()[0]:
        axes.legend()
    figure.tight_layout()
    figure.savefig(out_path)
    plt.close(figure)
