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

A sync call waits, and so does the thread that makes it: made from a coroutine (a thread whose
event loop is running), it stalls that loop until the answer, as any blocking call would. For a
user's own sync call that is the user's choice (LangChain runs sync callbacks on the loop too);
the relay's own code never blocks a running loop: what it would have to ask a server for from
there, it takes from what it knows (:func:`loop_running_here` says when). A sync call made on
the background loop's own thread could only wait for itself, forever: it raises instead.
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
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop (started on first use)."""
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name=self._name, daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def runs(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Whether `loop` is this background loop (without starting it)."""
        return self._loop is loop

    def _forget(self) -> None:
        """In a forked child the thread is gone: start a new one on next use."""
        self._loop = self._thread = None
        self._lock = threading.Lock()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run `coroutine` on the background loop and wait for its result (from any thread
        but the loop's own: see the module)."""
        if self._thread is threading.current_thread():
            coroutine.close()
            raise self._waits_for_itself()
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        return _wait(future)

    def iterate(self, stream: AsyncIterator[T]) -> Generator[T, None, None]:
        """Iterate an async iterator from sync code, one item at a time."""
        if self._thread is threading.current_thread():
            raise self._waits_for_itself()
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

    def _waits_for_itself(self) -> RuntimeError:
        return RuntimeError(
            f"a sync relay call was made on the {self._name!r} thread, from a coroutine "
            "running on the relay's own background loop: it would wait for itself forever. "
            "Await the async method (ainvoke, achat, ...) there instead."
        )


_SHARED = BackgroundLoop()
os.register_at_fork(after_in_child=_SHARED._forget)


def shared_loop() -> BackgroundLoop:
    """The process's one background loop, shared by every relay model."""
    return _SHARED


def loop_running_here() -> bool:
    """Whether the calling thread is running an event loop: a blocking call made now (I/O,
    waiting for another thread) would stall it."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def _next(stream: AsyncIterator[T]) -> T:
    return await anext(stream)


def _wait(future: Future[T]) -> T:
    try:
        return future.result()
    except BaseException:
        future.cancel()  # e.g. KeyboardInterrupt while waiting: stop the work too
        raise
