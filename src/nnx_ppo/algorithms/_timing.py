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
import dataclasses
import math
import time
from typing import Any

import jax

__all__ = ["ProgramClock", "WatchedCall"]


def _ready_at(outputs: Any) -> float:
    jax.block_until_ready(outputs)
    return time.perf_counter()


@dataclasses.dataclass(eq=False)
class WatchedCall:
    """One call a :class:`ProgramClock` watches."""

    dispatched_at: float
    ready_at: concurrent.futures.Future[float]
    """The clock thread's reading once the outputs were ready."""
    previous: WatchedCall | None
    """The call dispatched before this one, until this one is timed."""
    fetched_at: float = math.inf
    """The host's reading once it had fetched the outputs."""

    def end(self) -> float:
        """When the call ended: its ready stamp, or its fetch where the stamp came later."""
        try:
            return min(self.ready_at.result(), self.fetched_at)
        except Exception:  # the call failed; its fetch raised that error already
            return min(self.dispatched_at, self.fetched_at)


class ProgramClock:
    """Stamps when each watched call's outputs become ready, on a thread of its own.

    A device runs calls in the order they were dispatched, so a call ran from the
    later of its dispatch and the end of the call before it, to its own end.
    The stamps are the host's: one can come late by as long as the host's Python
    keeps the stamping thread from running (up to ``sys.getswitchinterval()``),
    so a call fetched before its stamp ends at its fetch instead. The thread
    ends once the clock is dropped and the calls it waits for have ended.
    """

    def __init__(self) -> None:
        self._stamper: concurrent.futures.ThreadPoolExecutor | None = None
        self._last: WatchedCall | None = None

    def watch(self, outputs: Any, dispatched_at: float) -> WatchedCall:
        """Watch the call that computes ``outputs``, in the order calls were dispatched.

        ``dispatched_at`` is the host's ``time.perf_counter()`` just before the
        call was dispatched (so a call that runs inside its dispatch counts whole).
        """
        if self._stamper is None:
            self._stamper = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="nnx_ppo-program-clock"
            )
        ready_at = self._stamper.submit(_ready_at, outputs)
        self._last = WatchedCall(dispatched_at, ready_at, self._last)
        return self._last

    def seconds(self, call: WatchedCall) -> float:
        """The seconds ``call`` ran; ask once its outputs have been fetched."""
        call.fetched_at = min(call.fetched_at, time.perf_counter())
        started = call.dispatched_at
        if call.previous is not None:
            started = max(started, call.previous.end())
            call.previous = None  # the chain of calls ends at the last one not yet timed
        return call.end() - started

    def idle_from(self, since: float) -> float:
        """The later of ``since`` and the end of the last watched call.

        Time work dispatched at ``since`` from here: a device runs it after the
        calls already dispatched, so until they end it waits, not works. Blocks
        until the last watched call has ended.
        """
        return since if self._last is None else max(since, self._last.end())
