"""ProgramClock: a call's seconds run from the later of its dispatch and the last call's end."""

import sys
import time

import jax
import jax.numpy as jnp
import pytest

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
    try:
        dispatched = time.perf_counter()
        first = busy(operands[0])
        first_seconds = clock.watch(first, dispatched)
        second_dispatched = time.perf_counter()
        second = busy(operands[1])
        second_seconds = clock.watch(second, second_dispatched)
        jax.block_until_ready(second)
        both = time.perf_counter() - dispatched
        # The second waited behind the first from its dispatch: that wait is not its own.
        # (The clock's stamps may come a thread switch after this thread's.)
        late = sys.getswitchinterval()
        assert first_seconds.result() + second_seconds.result() <= both + late
        assert second_seconds.result() < 0.75 * both
        assert first_seconds.result() < 0.75 * both
    finally:
        clock.close()


def test_work_dispatched_behind_a_call_is_timed_from_the_calls_end(operands) -> None:
    clock = ProgramClock()
    try:
        dispatched = time.perf_counter()
        running = busy(operands[0])
        clock.watch(running, dispatched)
        since = time.perf_counter()  # the call has barely begun: dispatch is asynchronous
        jax.block_until_ready(running)
        ended = time.perf_counter()
        idle = clock.idle_from(since)
        assert ended - 0.5 * (ended - since) < idle <= ended + sys.getswitchinterval()
        later = time.perf_counter()
        assert clock.idle_from(later) == later  # nothing is running any more
    finally:
        clock.close()


def test_a_clock_that_watched_nothing_waits_for_nothing() -> None:
    clock = ProgramClock()
    assert clock.idle_from(12.5) == 12.5
    clock.close()
