"""The relay as a framework adapter holds it: one switcher per event loop, sync calls on the
process's background loop, chat turns, token counts, and closing. Both adapters use this, so
neither re-implements the plumbing::

    client = RelayClient(settings.relay_config(), settings.load_cues())
    response = await client.respond(ChatRequest(messages))      # on the caller's loop
    response = client.run(client.respond(ChatRequest(messages)))  # from sync code, anywhere
    await client.aclose()   # or client.close(); also done when the client is dropped

Each switcher holds HTTP connections of its event loop. :meth:`close` closes them all; a
client that is garbage-collected without it has them closed on their loops by
:meth:`close_later` (no thread waits), so models made and dropped by the thousand
(``configurable_fields``, a model per request) leave no connections behind. A loop that ends
takes its switcher with it: ``asyncio.run`` (and ``asyncio.Runner``) closes its connections as
it shuts down, so one model called as ``asyncio.run(model.ainvoke(...))`` again and again, in
a script, a notebook or a task queue's worker threads, keeps one loop's connections, not one
set per loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine, Generator
from typing import Any, Literal, TypeVar, overload

from ..relay.config import RelayConfig, RequestHook
from ..relay.cues import CueSet
from ..relay.final_event import final_event
from ..relay.switcher import RelaySwitcher
from ..relay.sync import shared_loop
from ..upstream.rendering import PromptRenderer
from .exchange import ChatEvent, ChatRequest, ChatResponse, ToolCallChunk, stream_chat

T = TypeVar("T")
CLOSE_TIMEOUT = 10.0
"""Seconds a sync :meth:`RelayClient.close` waits for another loop to close its connections."""


class RelayClient:
    """Switchers per event loop (HTTP clients belong to one loop) over one configuration."""

    def __init__(
        self,
        config: RelayConfig,
        cues: CueSet,
        renderer: PromptRenderer | None = None,
        request_hook: RequestHook | None = None,
    ) -> None:
        self.config = config
        self.cues = cues
        self.renderer = renderer
        self.request_hook = request_hook
        # Not weakly keyed: a switcher's connections hold its loop, so a weak key never died.
        self._switchers: dict[asyncio.AbstractEventLoop, _LoopSwitcher] = {}
        self._lock = threading.Lock()  # loops of several threads use one client
        self._background = shared_loop()
        self.served_window: int | None = None
        """The large model's context window once :meth:`context_window` has asked for it."""

    def switcher(self) -> RelaySwitcher:
        """The switcher of the running event loop, made on first use (also after a close)."""
        loop = asyncio.get_running_loop()
        held = self._switchers.get(loop)
        if held is None:
            switcher = RelaySwitcher(
                self.config, cues=self.cues, renderer=self.renderer, request_hook=self.request_hook
            )
            held = _LoopSwitcher(switcher, _closed_at_shutdown(self._switchers, loop))
            with self._lock:
                self._forget_closed_loops()
                self._switchers[loop] = held
        return held.switcher

    @overload
    def stream(
        self, request: ChatRequest, *, partial_calls: Literal[False] = False
    ) -> AsyncIterator[ChatEvent]: ...

    @overload
    def stream(
        self, request: ChatRequest, *, partial_calls: bool
    ) -> AsyncIterator[ChatEvent | ToolCallChunk]: ...

    def stream(
        self, request: ChatRequest, *, partial_calls: bool = False
    ) -> AsyncIterator[ChatEvent | ToolCallChunk]:
        """One chat turn, streamed (see :func:`~relay_integrations.chat.exchange.stream_chat`;
        ``partial_calls`` streams a forced call while it is written)."""
        return stream_chat(self.switcher(), request, partial_calls=partial_calls)

    async def respond(self, request: ChatRequest) -> ChatResponse:
        """One chat turn, to its end."""
        return await final_event(stream_chat(self.switcher(), request), ChatResponse)

    async def count_tokens(self, body: dict[str, Any]) -> int:
        """``POST /tokenize`` on the large model's server (a prompt, or messages and tools)."""
        endpoint = self.switcher().endpoints["large"]
        response = await endpoint.post_json("/tokenize", {"model": self.config.large.model, **body})
        return int(response["count"])

    async def context_window(self) -> int | None:
        """The large model's context window, as its server reports it (kept in
        :attr:`served_window`)."""
        self.served_window = (await self.switcher().endpoints["large"].model_info()).max_model_len
        return self.served_window

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine from sync code, even inside a running event loop."""
        return self._background.run(coroutine)

    def iterate(self, stream: AsyncIterator[T]) -> Generator[T, None, None]:
        """Iterate an async stream from sync code; leaving early closes it."""
        return self._background.iterate(stream)

    # -- closing ----------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close every loop's connections: this loop's awaited here, others' on their loops."""
        current = asyncio.get_running_loop()
        for loop, switcher in self._take_switchers():
            if loop is current:
                await switcher.aclose()
            elif loop.is_running():
                await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(switcher.aclose(), loop))

    def close(self) -> None:
        """Close every loop's connections from sync code (waits for other loops, up to
        ``CLOSE_TIMEOUT``; the caller's own running loop closes its connections right after)."""
        try:
            current: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        for loop, switcher in self._take_switchers():
            if loop is current:
                loop.create_task(switcher.aclose())  # a sync call cannot wait for its own loop
            elif loop.is_running():
                future = asyncio.run_coroutine_threadsafe(switcher.aclose(), loop)
                with contextlib.suppress(TimeoutError):
                    future.result(timeout=CLOSE_TIMEOUT)

    def close_later(self) -> None:
        """Close every loop's connections without waiting (safe in a finalizer, any thread)."""
        for loop, switcher in self._take_switchers():
            if loop.is_running():
                with contextlib.suppress(RuntimeError):  # the loop closed in the meantime
                    asyncio.run_coroutine_threadsafe(switcher.aclose(), loop)

    def _take_switchers(self) -> list[tuple[asyncio.AbstractEventLoop, RelaySwitcher]]:
        """The open loops' switchers, forgotten here."""
        with self._lock:
            held, self._switchers = self._switchers, {}
        return [(loop, h.switcher) for loop, h in held.items() if not loop.is_closed()]

    def _forget_closed_loops(self) -> None:
        """Drop the switchers of loops closed without shutting down their async generators
        (``loop.close()`` by hand): nothing can run on such a loop, and once forgotten, its
        sockets are closed when their transports are collected."""
        for loop in [loop for loop in self._switchers if loop.is_closed()]:
            del self._switchers[loop]


class _LoopSwitcher:
    """A loop's switcher, and the async generator that closes it when the loop shuts down."""

    def __init__(self, switcher: RelaySwitcher, closer: AsyncGenerator[None, None]) -> None:
        self.switcher = switcher
        self._closer = closer  # the loop holds its async generators weakly: this keeps it
        _start(closer)


async def _closed_at_shutdown(
    switchers: dict[asyncio.AbstractEventLoop, _LoopSwitcher], loop: asyncio.AbstractEventLoop
) -> AsyncGenerator[None, None]:
    """Waits at its ``yield`` until its loop shuts down its async generators (``asyncio.run``
    and ``asyncio.Runner`` do, before they close the loop), then closes the loop's switcher.
    There is no other hook at a loop's end while it can still run a coroutine."""
    try:
        yield
    finally:
        held = switchers.pop(loop, None)  # None: closed (and forgotten) by close() already
        if held is not None:
            await held.switcher.aclose()


def _start(generator: AsyncGenerator[None, None]) -> None:
    """Run `generator` to its first ``yield`` without awaiting: the running loop's async
    generator hooks register it (to be closed at shutdown) on its first step."""
    step = generator.asend(None)
    try:
        step.send(None)
    except StopIteration:
        return
    raise AssertionError("unreachable: the generator yields before it awaits anything")
