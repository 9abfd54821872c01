"""Running many requests with a bound on how many are in flight."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


async def run_bounded(call: Callable[[T], Awaitable[R]], items: Sequence[T], limit: int) -> list[R]:
    """``call(item)`` for every item, at most `limit` at once; results in item order.

    The first failure cancels the calls still running and is raised as itself (not wrapped
    in an ``ExceptionGroup``), so callers and the command line see the real error.
    """
    slots = asyncio.Semaphore(limit)

    async def bounded(item: T) -> R:
        async with slots:
            return await call(item)

    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(bounded(item)) for item in items]
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return [task.result() for task in tasks]
