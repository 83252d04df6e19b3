"""The callbacks: Weights & Biases against a fake ``wandb`` module and run, and GIF files."""

import subprocess
import sys
import types
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image, ImageSequence

from nnx_ppo.algorithms.callbacks import gif_video_fn, wandb_log_fn, wandb_video_fn
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


def _gif_frames(path: Path) -> tuple[list[np.ndarray], list[int]]:
    with Image.open(path) as gif:
        frames = [np.asarray(f.convert("RGB")) for f in ImageSequence.Iterator(gif)]
        durations = [f.info["duration"] for f in ImageSequence.Iterator(gif)]
    return frames, durations


def test_gif_video_fn_writes_each_recording_at_its_step_in_real_time(tmp_path: Path) -> None:
    frames = np.zeros((7, 4, 6, 3), np.uint8)
    frames[:, 0, 0, 0] = np.arange(7) * 40  # each frame tells which it is
    gif_video_fn(tmp_path / "videos", fps=25)(VideoData(frames, 1536, 2.0, 6))
    shown, durations = _gif_frames(tmp_path / "videos" / "step_0000001536.gif")
    assert [f[0, 0, 0] for f in shown] == list(np.arange(7) * 40)
    assert shown[0].shape == (4, 6, 3) and durations == [40] * 7

    # 100 frames per second: every second frame, each shown 20 ms, the same real time.
    grey = frames[..., :1]
    gif_video_fn(tmp_path, fps=100)(VideoData(grey, 0, 2.0, 6))
    shown, durations = _gif_frames(tmp_path / "step_0000000000.gif")
    assert [f[0, 0, 0] for f in shown] == [0, 80, 160, 240] and durations == [20] * 4


@pytest.mark.parametrize("fps", [40, 1 / 0.025, 30.0, np.float32(60.0), jnp.float32(1 / 0.03)])
def test_gif_video_fn_keeps_real_time_whatever_the_rate(fps: object, tmp_path: Path) -> None:
    frames = np.zeros((101, 2, 2, 3), np.uint8)
    frames[:, 0, 0, 0] = np.arange(101)
    gif_video_fn(tmp_path, fps=fps)(VideoData(frames, np.int64(7), 0.0, 100))  # type: ignore[arg-type]
    _, durations = _gif_frames(tmp_path / "step_0000000007.gif")
    stride = 1 if float(fps) <= 50 else 2
    kept = len(range(0, 101, stride))  # Pillow joins frames that look alike, adding delays
    assert abs(sum(durations) - 1000 * kept * stride / float(fps)) <= 10
    assert min(durations) >= 20


def test_gif_video_fn_names_frames_it_cannot_write(tmp_path: Path) -> None:
    write = gif_video_fn(tmp_path)
    with pytest.raises(TypeError, match="frames must be uint8, as VideoData's are, got float32"):
        write(VideoData(np.zeros((3, 2, 2, 3), np.float32), 0, 0.0, 2))
    with pytest.raises(ValueError, match="the recording at step 5 has no frames"):
        write(VideoData(np.zeros((0, 2, 2, 3), np.uint8), 5, 0.0, 0))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("fps", [0, -5.0, float("nan"), "30", True, 1e-6, None])
def test_gif_video_fn_refuses_a_frame_rate_that_is_no_positive_number(fps: object) -> None:
    with pytest.raises(ValueError, match="gif_video_fn: fps must be a number of frames per"):
        gif_video_fn("videos", fps=fps)  # type: ignore[arg-type]
