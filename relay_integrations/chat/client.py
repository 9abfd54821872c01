"""The relay as a framework adapter holds it: one switcher per event loop, sync calls on the
process's background loop, chat turns, token counts, and closing. Both adapters use this, so
neither re-implements the plumbing::

    client = RelayClient(settings.relay_config(), settings.load_cues())
    response = await client.respond(ChatRequest(messages))      # on the caller's loop
    response = client.run(client.respond(ChatRequest(messages)))  # from sync code, anywhere
    await client.aclose()   # or client.close(); also done when the client is dropped

Each switcher holds HTTP connections of its event loop, and a loop's connections can be closed
only while it runs: a loop closed with connections open leaves their sockets open (and aiohttp's
"Unclosed client session"), and many ways of running a loop end it without a word to the relay
(``run_until_complete`` then ``loop.close()``, LlamaIndex's ``run_async_tasks``, a thread's loop
closed by hand). So the connections of a caller's loop live only while the loop has work for the
relay: the call that leaves it idle (a turn, a stream, a token count that ends) closes them
before it returns, and the next call opens new ones. A generation's many requests (a switch is a
request) still share their connections; what is given up is reuse across calls that do not
overlap: a new connection per server and call (measured: a call to two scripted servers on
loopback took 10.4 ms instead of 9.3, median of 40; over https a TLS handshake too), against
seconds of a real generation. The process's background loop, which runs every
sync call, is the relay's own and never ends: its connections stay open for the next call, as
long as the servers keep them (``KEEPALIVE_SECONDS``).

:meth:`close` (and :meth:`aclose`, ``with``) closes what is still open: the background loop's
connections and those of calls in progress, on their loops; a client that is garbage-collected
has them closed by :meth:`close_later` (no thread waits), so models made and dropped by the
thousand (``configurable_fields``, a model per request) leave no connections behind. A loop that
``asyncio.run`` (or ``asyncio.Runner``) shuts down closes what a call it cancelled had open.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine, Generator
from contextlib import aclosing
from typing import Any, Literal, TypeVar, overload

from ..relay.config import RelayConfig, RequestHook
from ..relay.cues import CueSet
from ..relay.final_event import final_event
from ..relay.switcher import RelaySwitcher
from ..relay.sync import loop_running_here, shared_loop
from ..upstream.answers import Tokenized
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
        return self._stream(request, partial_calls)

    async def _stream(
        self, request: ChatRequest, partial_calls: bool
    ) -> AsyncGenerator[ChatEvent | ToolCallChunk, None]:
        async with self._using() as switcher:
            events = stream_chat(switcher, request, partial_calls=partial_calls)
            async with aclosing(events):
                async for event in events:
                    if isinstance(event, ChatResponse):
                        break
                    yield event
                else:
                    raise AssertionError("a chat stream always ends with its ChatResponse")
        # the turn's work is done: its loop's connections are closed before the last event,
        # which a caller may take without ever asking for more
        yield event

    async def respond(self, request: ChatRequest) -> ChatResponse:
        """One chat turn, to its end."""
        async with self._using() as switcher:
            return await final_event(stream_chat(switcher, request), ChatResponse)

    async def count_tokens(self, body: dict[str, Any]) -> int:
        """``POST /tokenize`` on the large model's server (a prompt, or messages and tools)."""
        async with self._using() as switcher:
            body = {"model": self.config.large.model, **body}
            tokenized = await switcher.endpoints["large"].post_json("/tokenize", body, Tokenized)
        return len(tokenized.tokens) if tokenized.count is None else tokenized.count

    async def context_window(self) -> int | None:
        """The large model's context window, as its server reports it (kept in
        :attr:`served_window`)."""
        async with self._using() as switcher:
            info = await switcher.endpoints["large"].model_info()
        self.served_window = info.max_model_len
        return self.served_window

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine from sync code, even inside a running event loop (which then waits:
        see :mod:`relay_integrations.relay.sync`)."""
        return self._background.run(coroutine)

    def iterate(self, stream: AsyncIterator[T]) -> Generator[T, None, None]:
        """Iterate an async stream from sync code; leaving early closes it."""
        return self._background.iterate(stream)

    @contextlib.asynccontextmanager
    async def _using(self) -> AsyncIterator[RelaySwitcher]:
        """The running loop's switcher, for one call; the call that leaves a caller's loop
        idle closes its connections (see the module)."""
        held = self._held()
        await held.enter()
        try:
            yield held.switcher
        finally:
            await held.leave()

    def _held(self) -> _LoopSwitcher:
        """The running loop's switcher, made on first use (also after a close)."""
        loop = asyncio.get_running_loop()
        held = self._switchers.get(loop)
        if held is None:
            switcher = RelaySwitcher(
                self.config, cues=self.cues, renderer=self.renderer, request_hook=self.request_hook
            )
            held = _LoopSwitcher(switcher, keeps_connections=self._background.runs(loop))
            with self._lock:
                self._forget_closed_loops()
                self._switchers[loop] = held
        return held

    # -- closing ----------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close every loop's connections: this loop's awaited here, others' on their loops."""
        current = asyncio.get_running_loop()
        for loop, held in self._take_switchers():
            if loop is current:
                await held.aclose()
            elif loop.is_running():
                await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(held.aclose(), loop))
            else:
                held.forget()

    def close(self) -> None:
        """Close every loop's connections from sync code: outside an event loop it waits for
        other loops' (up to ``CLOSE_TIMEOUT``); inside one it waits for none (that would stall
        the loop), and the caller's own loop closes its connections right after."""
        waits = not loop_running_here()
        current = asyncio.get_running_loop() if not waits else None
        for loop, held in self._take_switchers():
            if loop is current:
                loop.create_task(held.aclose())  # at shutdown, if cancelled: its closer's
            elif loop.is_running():
                future = asyncio.run_coroutine_threadsafe(held.aclose(), loop)
                if waits:
                    with contextlib.suppress(TimeoutError):
                        future.result(timeout=CLOSE_TIMEOUT)
            else:
                held.forget()

    def close_later(self) -> None:
        """Close every loop's connections without waiting (safe in a finalizer, any thread)."""
        for loop, held in self._take_switchers():
            if loop.is_running():
                closing = held.aclose()
                try:
                    asyncio.run_coroutine_threadsafe(closing, loop)
                except RuntimeError:  # the loop closed in the meantime
                    closing.close()
                    held.forget()
            else:
                held.forget()

    def _take_switchers(self) -> list[tuple[asyncio.AbstractEventLoop, _LoopSwitcher]]:
        """Every loop's switcher, forgotten here."""
        with self._lock:
            held, self._switchers = self._switchers, {}
        return list(held.items())

    def _forget_closed_loops(self) -> None:
        """Drop the switchers of loops closed without shutting down their async generators
        (``loop.close()`` by hand): nothing can run on such a loop, and their connections
        were closed when their last call ended."""
        for loop in [loop for loop in self._switchers if loop.is_closed()]:
            self._switchers.pop(loop).forget()


class _LoopSwitcher:
    """A loop's switcher, the calls using it, and the async generator that closes it when
    the loop shuts down."""

    def __init__(self, switcher: RelaySwitcher, *, keeps_connections: bool) -> None:
        self.switcher = switcher
        self.keeps_connections = keeps_connections
        """Whether connections stay open between calls (the relay's own background loop)."""
        self._users = 0
        self._closing: asyncio.Future[None] | None = None
        self._forgotten = False
        self._closer = self._closed_at_shutdown()  # the loop holds it weakly: this keeps it
        _start(self._closer)

    async def enter(self) -> None:
        """A call starts: after a close of this loop's connections under way, if any."""
        while self._closing is not None:
            await asyncio.shield(self._closing)
        self._users += 1

    async def leave(self) -> None:
        """A call ended: the last one of a caller's loop closes its connections."""
        self._users -= 1
        if self._users == 0 and not self.keeps_connections:
            closing = self._closing = asyncio.ensure_future(self.switcher.aclose())
            closing.add_done_callback(self._closed)
            await asyncio.shield(closing)  # cancelled here, the close still goes on

    def _closed(self, closing: asyncio.Future[None]) -> None:
        if self._closing is closing:
            self._closing = None

    async def aclose(self) -> None:
        """Close the switcher's connections (on its loop), and end the closer."""
        await self.switcher.aclose()
        self.forget()

    def forget(self) -> None:
        """End the closer without closing anything: its loop cannot run it any more, or the
        connections are closed already. Sync, on the loop's thread or on a loop that no
        longer runs: the closer's ``finally`` awaits nothing once forgotten."""
        if self._forgotten:
            return
        self._forgotten = True
        step = self._closer.aclose()
        try:
            step.send(None)
        except StopIteration:
            return
        except RuntimeError:  # already running its finally on the loop: it closes
            step.close()
            return
        raise AssertionError("unreachable: a forgotten closer awaits nothing")

    async def _closed_at_shutdown(self) -> AsyncGenerator[None, None]:
        """Waits at its ``yield`` until its loop shuts down its async generators (``asyncio.run``
        and ``asyncio.Runner`` do, before they close the loop), then closes the switcher, which
        a call cancelled at shutdown may have left open. There is no other hook at a loop's end
        while it can still run a coroutine."""
        try:
            yield
        finally:
            if not self._forgotten:
                self._forgotten = True
                await self.switcher.aclose()


def _start(generator: AsyncGenerator[None, None]) -> None:
    """Run `generator` to its first ``yield`` without awaiting: the running loop's async
    generator hooks register it (to be closed at shutdown) on its first step."""
    step = generator.asend(None)
    try:
        step.send(None)
    except StopIteration:
        return
    raise AssertionError("unreachable: the generator yields before it awaits anything")
