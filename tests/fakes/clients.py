"""HTTP clients that tests make inside a running event loop, made off it.

Making an ``openai.AsyncOpenAI`` or an ``httpx.AsyncClient`` reads the system's CA certificates
(about 50 ms of CPU) on the calling thread, even for ``http://`` URLs; made in a coroutine,
that holds the loop, and the loop monitor (``tests/fakes/loop_stalls.py``) rightly reports it.
An application on a loop makes its clients once, at start-up; a test makes them here::

    async with await off_loop(openai.AsyncOpenAI, base_url=url, api_key="x") as client:
        ...
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def off_loop(make: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``make(*args, **kwargs)`` on a worker thread."""
    return await asyncio.to_thread(make, *args, **kwargs)
