"""How long each compiled call ran on its devices, for ``throughput/...`` metrics.

JAX dispatches a compiled call and returns before it runs, and ``train_ppo``
dispatches the next call before it fetches this one's results. Host clock
readings around a fetch then bound nothing: a call that ran while the host
evaluated or logged is already done when its fetch starts (a rate far too
high), and a call whose program runs inside its dispatch (an env that calls
back to the host does) runs inside the window of the call before it.
"""

from __future__ import annotations

import concurrent.futures
import math
import time
from typing import Any

import jax

__all__ = ["ProgramClock"]


class ProgramClock:
    """Stamps when each watched call's outputs become ready, on a thread of its own.

    A device runs calls in the order they were dispatched, so a call ran from the
    later of its dispatch and the end of the call before it, to its own end.
    The stamps are the host's, so each is late by as long as the host's Python
    keeps the stamping thread from running (up to ``sys.getswitchinterval()``).
    """

    def __init__(self) -> None:
        self._stamper: concurrent.futures.ThreadPoolExecutor | None = None
        self._last: concurrent.futures.Future[float] | None = None
        self._end = -math.inf  # written by the stamping thread only

    def watch(self, outputs: Any, dispatched_at: float) -> concurrent.futures.Future[float]:
        """The seconds the call that computes ``outputs`` ran, once they are ready.

        ``dispatched_at`` is the host's ``time.perf_counter()`` just before the
        call was dispatched (so a call that runs inside its dispatch counts whole).
        """
        if self._stamper is None:
            self._stamper = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="nnx_ppo-program-clock"
            )

        def ran_for() -> float:
            # One thread runs these in the order they were submitted, so ``_end``
            # is the end of the call dispatched before this one.
            jax.block_until_ready(outputs)
            end = time.perf_counter()
            seconds = end - max(dispatched_at, self._end)
            self._end = end
            return seconds

        self._last = self._stamper.submit(ran_for)
        return self._last

    def idle_from(self, since: float) -> float:
        """The later of ``since`` and the end of the last watched call.

        Time work dispatched at ``since`` from here: a device runs it after the
        calls already dispatched, so until they end it waits, not works. Blocks
        until the last watched call has ended.
        """
        if self._last is None:
            return since
        concurrent.futures.wait([self._last])
        return max(since, self._end)

    def close(self) -> None:
        """Let the stamping thread end once the calls it waits for have (never blocks)."""
        if self._stamper is not None:
            self._stamper.shutdown(wait=False)
