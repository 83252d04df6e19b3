"""Weights & Biases callbacks for ``train_ppo`` and ``train_distillation``.

Install the extra with ``pip install "nnx-ppo[wandb]"``. ``wandb`` is imported
only when one of these functions is called, never by importing this module.
Each callback logs to ``run`` when given (a ``wandb`` run, e.g. from
``wandb.init()``), else to the active run through ``wandb.log``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from nnx_ppo.algorithms.config import VideoData

__all__ = ["wandb_log_fn", "wandb_video_fn"]


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
