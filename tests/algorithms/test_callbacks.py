"""The Weights & Biases callbacks, against a fake ``wandb`` module and run (no wandb needed)."""

import subprocess
import sys
import types

import numpy as np
import pytest

from nnx_ppo.algorithms.callbacks import wandb_log_fn, wandb_video_fn
from nnx_ppo.algorithms.config import VideoData


class FakeRun:
    def __init__(self) -> None:
        self.logged: list[tuple[dict, int]] = []

    def log(self, data: dict, step: int) -> None:
        self.logged.append((data, step))


class FakeVideo:
    def __init__(self, data: np.ndarray, fps: int, format: str) -> None:
        self.data, self.fps, self.format = data, fps, format


@pytest.fixture
def fake_wandb(monkeypatch):
    module = types.ModuleType("wandb")
    module.Video = FakeVideo  # type: ignore[attr-defined]
    module.active = FakeRun()  # type: ignore[attr-defined]
    module.log = module.active.log  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", module)
    return module


def test_importing_the_callbacks_does_not_import_wandb():
    code = "import sys, nnx_ppo.algorithms.callbacks; print('wandb' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


def test_video_fn_logs_channels_first_frames_at_the_recording_step(fake_wandb):
    run = FakeRun()
    frames = np.zeros((5, 8, 6, 3), np.uint8)
    wandb_video_fn("video", fps=12, run=run)(VideoData(frames, 300, 1.5, 5))
    [(data, step)] = run.logged
    assert step == 300
    assert data["video"].data.shape == (5, 3, 8, 6)
    assert (data["video"].fps, data["video"].format) == (12, "mp4")


def test_log_fn_prefixes_names_and_logs_to_the_active_run_by_default(fake_wandb):
    wandb_log_fn("distil/")({"losses/total/mean": 0.5}, 64)
    assert fake_wandb.active.logged == [({"distil/losses/total/mean": 0.5}, 64)]


def test_a_missing_wandb_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match=r"nnx-ppo\[wandb\]"):
        wandb_video_fn()
    with pytest.raises(ImportError, match="wandb_log_fn"):
        wandb_log_fn()
