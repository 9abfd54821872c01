"""Synchronous entry points over the async relay, safe inside a running event loop.

A sync call made from a thread that already runs an event loop (Jupyter, a FastAPI handler)
cannot use ``asyncio.run``. :class:`BackgroundLoop` runs coroutines on one event loop of its
own, in a daemon thread, so sync callers work everywhere and the loop's HTTP connections are
reused across calls. Every relay model of a process shares one (:func:`shared_loop`), so a
thousand models cost one thread, not a thousand::

    loop = shared_loop()
    result = loop.run(switcher.generate(messages))
    for event in loop.iterate(switcher.stream(messages)):
        ...

Leaving :meth:`iterate` early (``break``, an exception) closes the async generator on its
loop, which cancels its upstream requests.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Coroutine, Generator
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class BackgroundLoop:
    """An event loop in a daemon thread, started on first use."""

    def __init__(self, name: str = "relay-sync") -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop (started on first use)."""
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name=self._name, daemon=True)
                thread.start()
                self._loop = loop
            return self._loop

    def _forget(self) -> None:
        """In a forked child the thread is gone: start a new one on next use."""
        self._loop = None
        self._lock = threading.Lock()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run `coroutine` on the background loop and wait for its result."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        return _wait(future)

    def iterate(self, stream: AsyncIterator[T]) -> Generator[T, None, None]:
        """Iterate an async iterator from sync code, one item at a time."""
        try:
            while True:
                try:
                    yield self.run(_next(stream))
                except StopAsyncIteration:
                    return
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                self.run(aclose())


_SHARED = BackgroundLoop()
os.register_at_fork(after_in_child=_SHARED._forget)


def shared_loop() -> BackgroundLoop:
    """The process's one background loop, shared by every relay model."""
    return _SHARED


async def _next(stream: AsyncIterator[T]) -> T:
    return await anext(stream)


def _wait(future: Future[T]) -> T:
    try:
        return future.result()
    except BaseException:
        future.cancel()  # e.g. KeyboardInterrupt while waiting: stop the work too
        raise
