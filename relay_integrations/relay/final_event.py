"""Read an event stream to the event that ends it::

    result = (await final_event(switcher.stream(messages), RelayDone)).result
    response = await final_event(stream_chat(switcher, request), ChatResponse)

The stream is closed once its final event is read, so what it holds open (an upstream request
opened ahead) is released at once rather than when the garbage collector finds it.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any, TypeVar

Final = TypeVar("Final")


async def final_event(stream: AsyncGenerator[Any, None], kind: type[Final]) -> Final:
    """The first event of type `kind`, the stream's last by contract."""
    async with aclosing(stream) as events:
        async for event in events:
            if isinstance(event, kind):
                return event
    raise AssertionError(f"the stream ended without its {kind.__name__}")
