"""The loop monitor catches a callback that blocks its loop, names where it blocked, and stays
quiet for loops that are busy but yield, idle, or slowed by a machine or a GIL that other
threads keep busy (the conditions of a shared CI machine)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from relay_integrations.testing.loop_monitor import LoopMonitor, LoopStalled, Stall

BLOCK = 0.3
"""How long the blocking callbacks block: well past the 50 ms threshold, so that a monitor
kept off the CPU for a while by a loaded machine still sees most of it."""


@pytest.fixture
def monitor() -> Iterator[LoopMonitor]:
    with LoopMonitor(threshold=0.05) as watching:
        yield watching


def caught(monitor: LoopMonitor, block: Callable[[], None], tries: int = 3) -> list[Stall]:
    """The stalls of `block`; tried again (up to `tries` times) only if none was seen: a
    monitor that the machine kept off the CPU for most of a stall misses it, and says so in
    its docs; one that sees a stall must see it where it is."""
    for _ in range(tries):
        block()
        stalls = monitor.take()
        if stalls:
            return stalls
    return []


async def sleeps_in_a_coroutine() -> None:
    await asyncio.sleep(0)
    time.sleep(BLOCK)  # noqa: ASYNC251  (the blocking call)


async def waits_for_a_thread() -> None:
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(time.sleep, BLOCK).result()  # a sync bridge's wait


@pytest.mark.parametrize(
    ("blocker", "line"),
    [
        (sleeps_in_a_coroutine, "time.sleep(BLOCK)"),
        (waits_for_a_thread, "pool.submit(time.sleep, BLOCK).result()"),
    ],
    ids=["time.sleep", "future.result"],
)
def test_a_blocking_call_in_a_coroutine_is_caught_where_it_blocks(
    monitor: LoopMonitor, blocker: Callable[[], object], line: str
) -> None:
    stalls = caught(monitor, lambda: asyncio.run(blocker()))  # type: ignore[arg-type]
    assert len(stalls) == 1, stalls
    stall = stalls[0]
    assert stall.seconds > 0.05
    assert stall.thread == threading.current_thread().name
    assert blocker.__name__ in stall.callback  # the task, named by its coroutine
    assert line in stall.where and blocker.__name__ in stall.where
    assert str(stall).startswith(f"the event loop of thread {stall.thread!r} was held")


def test_a_loop_in_another_thread_is_watched_too(monitor: LoopMonitor) -> None:
    def in_a_thread() -> None:
        worker = threading.Thread(target=asyncio.run, args=(sleeps_in_a_coroutine(),))
        worker.name = "worker-loop"
        worker.start()
        worker.join()

    stalls = caught(monitor, in_a_thread)
    assert [s.thread for s in stalls] == ["worker-loop"]


def test_check_raises_with_every_stall_then_forgets_them(monitor: LoopMonitor) -> None:
    assert caught(monitor, lambda: asyncio.run(sleeps_in_a_coroutine()))
    asyncio.run(sleeps_in_a_coroutine())
    if not monitor.stalls:  # missed on a loaded machine: nothing to check
        pytest.skip("the monitor was kept off the CPU through the stall")
    with pytest.raises(LoopStalled, match=r"time\.sleep"):
        monitor.check()
    monitor.check()  # forgotten


async def busy_but_yielding(seconds: float) -> int:
    """CPU work in slices of about a millisecond, yielding between them, in 20 tasks."""
    end = time.monotonic() + seconds

    async def worker() -> int:
        slices = 0
        while time.monotonic() < end:
            sum(range(5_000))
            slices += 1
            await asyncio.sleep(0)
        return slices

    return sum(await asyncio.gather(*(worker() for _ in range(20))))


def test_a_busy_loop_that_yields_is_no_stall(monitor: LoopMonitor) -> None:
    assert asyncio.run(busy_but_yielding(1.0)) > 100
    assert monitor.take() == []


def test_an_idle_loop_is_no_stall(monitor: LoopMonitor) -> None:
    asyncio.run(asyncio.sleep(BLOCK))
    assert monitor.take() == []


def test_threads_that_keep_the_gil_and_the_cpus_busy_make_no_stall(monitor: LoopMonitor) -> None:
    """Four threads spinning in Python (more than the cores of a CI machine): the loop's
    callbacks wait for the GIL and for a CPU, and neither is the callbacks' doing."""
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1_000))

    spinners = [threading.Thread(target=spin) for _ in range(4)]
    for spinner in spinners:
        spinner.start()
    try:
        asyncio.run(busy_but_yielding(1.0))
    finally:
        stop.set()
        for spinner in spinners:
            spinner.join()
    assert monitor.take() == []


def test_the_threshold_must_exceed_the_sampling_interval() -> None:
    with pytest.raises(ValueError, match="below threshold"):
        LoopMonitor(threshold=0.01, interval=0.02)
