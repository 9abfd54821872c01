"""Sync entry points over the async core, inside and outside a running event loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from relay_integrations.relay.sync import BackgroundLoop


async def numbers(closed: list[bool]) -> AsyncIterator[int]:
    try:
        for i in range(5):
            await asyncio.sleep(0)
            yield i
    finally:
        closed.append(True)


def test_run_and_iterate_outside_a_loop() -> None:
    loop = BackgroundLoop()
    assert loop.run(asyncio.sleep(0, result=42)) == 42
    closed: list[bool] = []
    assert list(loop.iterate(numbers(closed))) == [0, 1, 2, 3, 4]
    assert closed == [True]


async def test_sync_calls_work_inside_a_running_loop() -> None:
    loop = BackgroundLoop()
    assert loop.run(asyncio.sleep(0, result="ok")) == "ok"  # asyncio.run would refuse here
    assert loop.loop is not asyncio.get_running_loop()


def test_leaving_an_iteration_early_closes_the_stream() -> None:
    loop = BackgroundLoop()
    closed: list[bool] = []
    for item in loop.iterate(numbers(closed)):
        if item == 1:
            break
    assert closed == [True]


def test_errors_reach_the_caller() -> None:
    async def fails() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        BackgroundLoop().run(fails())


@pytest.mark.timeout(20)  # before the guard, this waited for itself forever
def test_a_sync_call_on_the_background_loop_s_own_thread_raises_instead_of_waiting_forever() -> (
    None
):
    loop = BackgroundLoop()

    async def calls_back_in() -> int:
        return loop.run(asyncio.sleep(0, result=1))

    async def iterates_in() -> list[int]:
        return list(loop.iterate(numbers([])))

    with pytest.raises(RuntimeError, match="wait for itself forever"):
        loop.run(calls_back_in())
    with pytest.raises(RuntimeError, match="wait for itself forever"):
        loop.run(iterates_in())
    assert loop.run(asyncio.sleep(0, result=2)) == 2  # the loop still serves other callers
