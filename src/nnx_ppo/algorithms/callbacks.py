"""Callbacks for ``train_ppo`` and ``train_distillation``: Weights & Biases, and GIF files.

The Weights & Biases callbacks need the extra, ``pip install "nnx-ppo[wandb]"``.
``wandb`` is imported only when one of them is called, never by importing this
module. Each logs to ``run`` when given (a ``wandb`` run, e.g. from
``wandb.init()``), else to the active run through ``wandb.log``.
"""

from __future__ import annotations

import importlib
import math
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from nnx_ppo.algorithms.config import VideoData

__all__ = ["gif_video_fn", "wandb_log_fn", "wandb_video_fn"]

# Browsers and most viewers show a GIF frame shorter than 20 ms for 100 ms.
_GIF_MIN_FRAME_MS = 20


def _wandb(caller: str) -> ModuleType:
    try:
        # By name: wandb is optional, so neither this module nor a type checker needs it.
        wandb = importlib.import_module("wandb")
    except ImportError as error:
        raise ImportError(
            f"{caller} logs to Weights & Biases, which is not installed; "
            'install it with pip install "nnx-ppo[wandb]"'
        ) from error
    return wandb


def wandb_video_fn(
    key: str = "eval_video", fps: int = 30, *, run: Any = None
) -> Callable[[VideoData], None]:
    """A ``video_fn`` logging each recording as a ``wandb.Video`` at its env step.

    Args:
      key: the name the video is logged under.
      fps: frames per second of the video.
      run: the ``wandb`` run to log to; the active run when ``None``.

    Raises:
      ImportError: ``wandb`` is not installed (the message says how to install it).

    Example::

        train_ppo(env, networks, config, video_fn=wandb_video_fn(fps=50))
    """
    wandb = _wandb("wandb_video_fn")
    target = wandb if run is None else run

    def video_fn(data: VideoData) -> None:
        # VideoData frames are (T, H, W, C); wandb.Video takes (T, C, H, W).
        frames = np.transpose(np.asarray(data.frames), (0, 3, 1, 2))
        target.log({key: wandb.Video(frames, fps=fps, format="mp4")}, step=data.step)

    return video_fn


def wandb_log_fn(prefix: str = "", *, run: Any = None) -> Callable[[dict[str, float], int], None]:
    """A ``log_fn`` logging each metrics dict at its env step, names prefixed by ``prefix``.

    Args:
      prefix: prepended to every metric name (e.g. ``"teacher/"``).
      run: the ``wandb`` run to log to; the active run when ``None``.

    Raises:
      ImportError: ``wandb`` is not installed (the message says how to install it).

    Example::

        train_ppo(env, networks, config, log_fn=wandb_log_fn())
    """
    target = _wandb("wandb_log_fn") if run is None else run

    def log_fn(metrics: dict[str, float], step: int) -> None:
        target.log({f"{prefix}{name}": value for name, value in metrics.items()}, step=int(step))

    return log_fn


def gif_video_fn(directory: str | Path, fps: float = 30.0) -> Callable[[VideoData], None]:
    """A ``video_fn`` writing each recording to ``directory/step_0000000000.gif``.

    The file is named by the env step of the recording, in ten digits as checkpoints
    are, and appears whole (written under another name, then renamed). Frames play
    at ``fps``; above 50 frames per second (the fastest a GIF plays everywhere)
    every n-th frame is kept, so the video still plays in real time. Needs Pillow,
    which matplotlib (a dependency of nnx-ppo) installs.

    Args:
      directory: where the files go; created at the first recording.
      fps: frames per second of the env (``1 / env.dt`` plays it in real time).

    Raises:
      ValueError: ``fps`` is not a positive finite number.

    Example::

        train_ppo(env, networks, config, video_fn=gif_video_fn("videos", fps=1 / env.dt))
    """
    if not (isinstance(fps, int | float) and math.isfinite(fps) and fps > 0):
        raise ValueError(f"gif_video_fn: fps must be a positive number, got {fps!r}")
    target = Path(directory)
    stride = max(1, math.ceil(fps * _GIF_MIN_FRAME_MS / 1000))
    frame_ms = max(_GIF_MIN_FRAME_MS, round(1000 * stride / fps / 10) * 10)  # GIF counts in cs

    def video_fn(data: VideoData) -> None:
        from PIL import Image

        frames = np.asarray(data.frames)[::stride]
        if frames.shape[-1] == 1:  # one channel: a greyscale image
            frames = frames[..., 0]
        images = [Image.fromarray(frame) for frame in frames]
        target.mkdir(parents=True, exist_ok=True)
        path = target / f"step_{data.step:010d}.gif"
        # Written whole, then renamed: a crash leaves no half GIF under the final name.
        partial = path.with_name(path.name + ".partial")
        images[0].save(
            partial,
            format="GIF",
            save_all=True,
            append_images=images[1:],
            duration=frame_ms,
            loop=0,
        )
        os.replace(partial, path)

    return video_fn
