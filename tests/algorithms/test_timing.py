"""ProgramClock: a call ran from the later of its dispatch and the last call's end."""

import gc
import sys
import threading
import time

import jax
import jax.numpy as jnp
import pytest

from nnx_ppo.algorithms import _timing
from nnx_ppo.algorithms._timing import ProgramClock


@jax.jit
def busy(x: jax.Array) -> jax.Array:
    """Some tens of milliseconds of products on the CPU, dispatched asynchronously."""
    return jax.lax.fori_loop(0, 60, lambda _, y: jnp.tanh(y @ y), x)


@pytest.fixture(scope="module")
def operands() -> tuple[jax.Array, jax.Array]:
    # Made ahead: an eager op dispatched behind a running call would wait for it.
    x, y = jnp.full((256, 256), 0.01), jnp.full((256, 256), 0.02)
    jax.block_until_ready((busy(x), busy(y)))  # compiled
    return x, y


def test_calls_queued_together_are_each_timed_alone(operands) -> None:
    clock = ProgramClock()
    dispatched = time.perf_counter()
    first = clock.watch(busy(operands[0]), dispatched)
    second_dispatched = time.perf_counter()
    second = busy(operands[1])
    second_watch = clock.watch(second, second_dispatched)
    jax.block_until_ready(second)
    # The second waited behind the first from its dispatch: that wait is not its own.
    first_seconds, second_seconds = clock.seconds(first), clock.seconds(second_watch)
    both = time.perf_counter() - dispatched  # after both fetches, which end the calls
    assert first_seconds > 0 and second_seconds > 0
    assert first_seconds + second_seconds <= both
    # Each did half the work. Timed from its dispatch, the second would get nearly all
    # of both (0.98 or more); the bounds leave room for one call slowed by a busy machine
    # (the first took 75% of both once, on CI's two cores).
    assert second_seconds < 0.9 * both
    assert first_seconds < 0.9 * both


def test_a_call_ends_when_fetched_if_its_stamp_comes_later(operands, monkeypatch) -> None:
    # A stamp a second late: as if the host's Python kept the clock's thread waiting.
    def late(outputs):
        jax.block_until_ready(outputs)
        return time.perf_counter() + 1.0

    monkeypatch.setattr(_timing, "_ready_at", late)
    clock = ProgramClock()
    dispatched = time.perf_counter()
    first = clock.watch(busy(operands[0]), dispatched)
    second_outputs = busy(operands[1])
    second = clock.watch(second_outputs, time.perf_counter())
    jax.block_until_ready(second_outputs)
    first_seconds, second_seconds = clock.seconds(first), clock.seconds(second)
    both = time.perf_counter() - dispatched
    assert first_seconds + second_seconds <= both < 0.5
    since = time.perf_counter()
    assert clock.idle_from(since) == since  # fetched before: no wait behind it


def test_work_dispatched_behind_a_call_is_timed_from_the_calls_end(operands) -> None:
    clock = ProgramClock()
    dispatched = time.perf_counter()
    running = busy(operands[0])
    clock.watch(running, dispatched)
    since = time.perf_counter()  # the call has barely begun: dispatch is asynchronous
    jax.block_until_ready(running)
    ended = time.perf_counter()
    idle = clock.idle_from(since)
    # The clock's stamp comes from its own thread, which a busy machine may run some
    # switch intervals after this thread's reading (7 ms late once on CI's two cores).
    assert ended - 0.5 * (ended - since) < idle <= ended + 10 * sys.getswitchinterval()


def test_a_clock_that_watched_nothing_waits_for_nothing() -> None:
    clock = ProgramClock()
    assert clock.idle_from(12.5) == 12.5


def test_a_dropped_clock_leaves_no_thread_behind(operands) -> None:
    # Clocks of earlier tests may still be collected meanwhile: follow this one's thread.
    def clock_threads() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name.startswith("nnx_ppo-program-clock")}

    before = clock_threads()
    clock = ProgramClock()
    clock.seconds(clock.watch(busy(operands[0]), time.perf_counter()))
    (ours,) = clock_threads() - before
    del clock
    gc.collect()
    ours.join(timeout=5.0)
    assert not ours.is_alive()
