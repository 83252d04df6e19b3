"""Keep simulator warnings that native code prints out of the terminal, and count them.

MuJoCo Warp's kernels report solver and collision overflows with C ``printf``
(e.g. ``solver iterations limit reached - please increase iterations beyond
4``), straight to file descriptor 1, where no Python setting reaches them;
over a run they are tens of thousands of lines. :class:`SimulatorWarnings`
points descriptor 1 at a pipe for the duration of a ``with`` block and, where
``sys.stdout`` wrote to descriptor 1, gives it a copy of the terminal, so the
progress bar and every Python ``print`` are unaffected. A thread reads the pipe: each simulator
warning is counted and logged to the ``nnx_ppo.simulator`` logger at
``DEBUG`` (``nnx-ppo train`` writes that logger to ``simulator.log`` in the run
directory); any other native output is passed on to the terminal unchanged.

Example::

    with SimulatorWarnings() as warnings:
        train(...)
    print(f"{warnings.count} simulator warnings")
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import sys
import threading
from types import TracebackType
from typing import TextIO

__all__ = ["WARNING_PATTERN", "SimulatorWarnings"]

WARNING_PATTERN = re.compile(r"limit reached|overflow", re.IGNORECASE)
"""A native output line that is a simulator warning (MuJoCo Warp's overflow reports)."""

_ADVICE_PATTERN = re.compile(r"^To disable the print warning")
"""The line Warp prints after each warning: part of the warning, not counted again."""

_log = logging.getLogger("nnx_ppo.simulator")


def _flush_native_stdout() -> None:
    """Flush C's ``stdout`` buffer, where native ``printf`` output may wait."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).fflush(None)


def _writes_to_fd_1(stream: object) -> bool:
    """Whether a Python text stream writes to descriptor 1 (not, e.g., pytest's capture)."""
    try:
        return stream.fileno() == 1  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return False


class SimulatorWarnings:
    """A context that diverts native simulator warnings from the terminal into a count and a log.

    Attributes:
      count: the simulator warnings seen so far.
      passed_on: other lines of native output, passed on to the terminal.
    """

    def __init__(self) -> None:
        self.count = 0
        self.passed_on = 0
        self._terminal_fd: int | None = None
        self._saved_stdout: TextIO | None = None
        self._reader: threading.Thread | None = None

    def __enter__(self) -> SimulatorWarnings:
        sys.stdout.flush()
        _flush_native_stdout()
        self._terminal_fd = os.dup(1)
        read_end, write_end = os.pipe()
        os.dup2(write_end, 1)
        os.close(write_end)
        if _writes_to_fd_1(sys.stdout):
            self._saved_stdout = sys.stdout
            sys.stdout = open(
                os.dup(self._terminal_fd), "w", buffering=1, encoding="utf-8", errors="replace"
            )
        self._reader = threading.Thread(
            target=self._read, args=(read_end,), name="simulator-warnings", daemon=True
        )
        self._reader.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        assert self._terminal_fd is not None and self._reader is not None
        _flush_native_stdout()
        sys.stdout.flush()
        os.dup2(self._terminal_fd, 1)  # closes the pipe's last write end: the reader ends
        self._reader.join()
        if self._saved_stdout is not None:
            sys.stdout.close()
            sys.stdout = self._saved_stdout
            self._saved_stdout = None
        os.close(self._terminal_fd)

    def _read(self, read_end: int) -> None:
        assert self._terminal_fd is not None
        with open(read_end, "rb", buffering=0) as pipe:
            pending = b""
            while chunk := pipe.read(65536):
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    self._take(line + b"\n")
            if pending:
                self._take(pending)

    def _take(self, raw: bytes) -> None:
        assert self._terminal_fd is not None
        line = raw.decode("utf-8", errors="replace").rstrip("\n")
        if _ADVICE_PATTERN.match(line):
            _log.debug("%s", line)
        elif WARNING_PATTERN.search(line):
            self.count += 1
            _log.debug("%s", line)
        else:
            self.passed_on += 1
            os.write(self._terminal_fd, raw)
