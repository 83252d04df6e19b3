"""Callbacks for ``train_ppo`` and ``train_distillation``: Weights & Biases, and GIF files.

The Weights & Biases callbacks need the extra, ``pip install "nnx-ppo[wandb]"``.
``wandb`` is imported only when one of them is called, never by importing this
module. Each logs to ``run`` when given (a ``wandb`` run, e.g. from
``wandb.init()``), else to the active run through ``wandb.log``.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
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
# A GIF frame's delay is 16 bits of hundredths of a second.
_GIF_MIN_FPS = 100 / 65535


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
    at ``fps``: a GIF counts time in hundredths of a second, so each frame's delay
    is rounded with the error carried to the next, and the video keeps real time.
    Above 50 frames per second (the fastest a GIF plays everywhere) every n-th
    frame is kept. Needs Pillow, which nnx-ppo installs.

    Args:
      directory: where the files go; created at the first recording.
      fps: frames per second of the env (``1 / env.dt`` plays it in real time); a
        Python, NumPy or JAX scalar, at least one frame per 655 s (a GIF's
        longest delay).

    Raises:
      ValueError: ``fps`` is not a number in that range. At a recording, a
        ``TypeError`` for frames that are not ``uint8`` and a ``ValueError`` for
        a recording without frames.

    Example::

        train_ppo(env, networks, config, video_fn=gif_video_fn("videos", fps=1 / env.dt))
    """
    rate = _frame_rate(fps)
    target = Path(directory)
    stride = max(1, math.ceil(rate * _GIF_MIN_FRAME_MS / 1000))
    centiseconds_per_frame = 100 * stride / rate

    def video_fn(data: VideoData) -> None:
        from PIL import Image

        frames = np.asarray(data.frames)
        if frames.dtype != np.uint8:
            raise TypeError(
                f"gif_video_fn: frames must be uint8, as VideoData's are, got {frames.dtype} "
                "(scale floats in [0, 1] by 255 and cast them in the env's render)"
            )
        if not len(frames):
            raise ValueError(f"gif_video_fn: the recording at step {data.step} has no frames")
        frames = frames[::stride]
        if frames.shape[-1] == 1:  # one channel: a greyscale image
            frames = frames[..., 0]
        images = [_paletted(Image.fromarray(frame)) for frame in frames]
        ends = [math.floor(centiseconds_per_frame * i + 0.5) for i in range(len(images) + 1)]
        delays_ms = [10 * (end - start) for start, end in itertools.pairwise(ends)]
        target.mkdir(parents=True, exist_ok=True)
        path = target / f"step_{int(data.step):010d}.gif"
        # Written whole, then renamed: a crash leaves no half GIF under the final name.
        partial = path.with_name(path.name + ".partial")
        images[0].save(
            partial,
            format="GIF",
            save_all=True,
            append_images=images[1:],
            duration=delays_ms,
            loop=0,
        )
        os.replace(partial, path)

    return video_fn


def _paletted(image: Any) -> Any:
    """A colour frame reduced to a GIF's 256 colours by the fast octree: about ten times
    faster than Pillow's default for the GIF, whose writing would hold up training."""
    from PIL import Image

    if image.mode not in ("RGB", "RGBA"):
        return image
    return image.quantize(colors=256, method=Image.Quantize.FASTOCTREE)


def _frame_rate(fps: object) -> float:
    """``fps`` as a float, or a ``ValueError`` naming it."""
    rate = math.nan
    if not isinstance(fps, bool | str):
        with contextlib.suppress(TypeError, ValueError):
            rate = float(fps)  # type: ignore[arg-type]  # NumPy and JAX scalars too
    if not (math.isfinite(rate) and rate >= _GIF_MIN_FPS):
        raise ValueError(
            f"gif_video_fn: fps must be a number of frames per second of at least "
            f"{_GIF_MIN_FPS:.4f} (one per 655.35 s, a GIF's longest delay), got {fps!r}"
        )
    return rate
