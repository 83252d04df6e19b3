"""Draw a learning benchmark's curves: ``python plot_learning.py ENV-STEPS.json`` writes ``.png``.

Two panels, evaluation return against env steps and against wall time; per
library, the median over seeds and the seeds' range. Run in a venv with
matplotlib (``playground_learning.py`` uses the ``ours`` venv).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np


def main() -> None:
    data_path = Path(sys.argv[1])
    data = json.loads(data_path.read_text())
    figure, (by_steps, by_time) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for library, runs in data["curves"].items():
        length = min(len(run["returns"]) for run in runs)
        returns = np.array([run["returns"][:length] for run in runs])
        steps = np.array(runs[0]["steps"][:length]) / 1e6
        seconds = np.median(np.array([run["seconds"][:length] for run in runs]), axis=0)
        for axis, x in ((by_steps, steps), (by_time, seconds)):
            (line,) = axis.plot(x, np.median(returns, axis=0), label=library)
            axis.fill_between(
                x, returns.min(axis=0), returns.max(axis=0), color=line.get_color(), alpha=0.2
            )
    by_steps.set_xlabel("env steps (millions)")
    by_time.set_xlabel("wall time (s), start-up and compilation included")
    by_steps.set_ylabel("evaluation return")
    by_steps.legend()
    for axis in (by_steps, by_time):
        axis.grid(alpha=0.3)
    figure.suptitle(f"{data['env']}: median and range over {len(runs)} seeds")
    figure.tight_layout()
    figure.savefig(data_path.with_suffix(".png"), dpi=110)


if __name__ == "__main__":
    main()
