"""One generation on the relay (a chat completion, a Responses API response), as an ASGI
response that owns it.

The response runs the generation in a task and listens to the client at the same time: a
client that disconnects cancels the task, which closes the upstream streams, and vLLM aborts
those requests. A slot of the concurrency limit is held exactly as long as the task runs. How
the answer is written is the API's :class:`Wire` (``ChatCompletionsWire``, ``ResponsesWire``)::

    return GenerationResponse(switcher, admission, request, wire, stream=True)

A stream that has written nothing for `keepalive` seconds (the relay waiting for an upstream
that is out, a long prefill) gets an SSE comment (``: keep-alive``), which clients skip, so
that proxies and load balancers that cut a silent connection keep it open.

Failures after the stream has started cannot change the status code; they arrive as the
API's error event (chat completions: an OpenAI-shaped ``{"error": ...}`` before ``[DONE]``;
Responses: ``response.failed``), which the ``openai`` SDKs raise, after all the text produced
before the failure, so nothing already written is lost.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable
from typing import Any, Literal, Protocol, TypeVar

import openai
from starlette.types import Receive, Scope, Send

from ..chat.exchange import ChatEvent, ChatRequest, ChatResponse, stream_chat
from ..relay.errors import ContextOverflowError, CueArtifactError, EndpointError
from ..relay.final_event import final_event
from ..relay.result import RelayResult
from ..relay.switcher import RelaySwitcher
from ..upstream.endpoint import UpstreamFailure
from ..upstream.errors import InvalidChatError
from .admission import Admission
from .errors import ApiError
from .logs import log, request_id
from .public import client_partial

T = TypeVar("T")
RETRY_SOON = {"retry-after": "1"}
"""A known-down upstream is probed every second or so (EndpointConfig.probe_interval)."""
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),  # nginx: pass events on as they come
]
KEEPALIVE = b": keep-alive\n\n"
"""An SSE comment: clients skip it (the standard, and the openai SDKs' decoders)."""


class Wire(Protocol):
    """How one API writes a generation: the whole object, or the stream's events (each a
    whole SSE event, ending in a blank line)."""

    def whole(self, response: ChatResponse) -> dict[str, Any]: ...
    def opening(self) -> list[bytes]: ...
    def event(self, event: ChatEvent) -> list[bytes]: ...
    def closing(self, response: ChatResponse) -> list[bytes]: ...
    def failure(self, error: ApiError) -> list[bytes]: ...


class GenerationResponse:
    """The ASGI response of one generation, streamed (SSE) or whole (JSON)."""

    def __init__(
        self,
        switcher: RelaySwitcher,
        admission: Admission,
        request: ChatRequest,
        wire: Wire,
        *,
        stream: bool,
        cut: asyncio.Event | None = None,
        keepalive: float = 0.0,
    ) -> None:
        """`keepalive`: seconds of silence on a stream before an SSE comment (0: never)."""
        self.switcher = switcher
        self.admission = admission
        self.request = request
        self.wire = wire
        self.stream = stream
        self.cut = cut if cut is not None else asyncio.Event()
        """Set when the server's shutdown ends the generations still running."""
        self.keepalive = keepalive
        self.result: RelayResult | None = None
        self._events: _EventWriter | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        admission = self.admission
        if not admission.admit():
            await admission.busy_error().response()(scope, receive, send)
            return
        try:
            work = self._stream(send) if self.stream else self._whole(send)
            ended = await _until_disconnect(work, receive, self.cut)
            if ended == "disconnected":
                admission.metrics.errors.labels("client_disconnected").inc()
                log.info("client disconnected: generation cancelled")
            elif ended == "cut":
                admission.metrics.errors.labels("shutdown").inc()
                log.warning("generation cut by the shutdown timeout")
                await self._send_cut(send)
        finally:
            admission.release(self.result)

    async def _send_cut(self, send: Send) -> None:
        """End a generation the shutdown cut: an error event and ``[DONE]`` on a stream
        already open, else a 503."""
        error = ApiError(
            503,
            "the relay shut down before the generation ended; retry on another replica",
            code="shutting_down",
        )
        if self._events is None:
            await self._send_error(send, error)
            return
        await self._events.write(self.wire.failure(error))
        await send({"type": "http.response.body", "body": b""})

    async def _whole(self, send: Send) -> None:
        try:
            response = await self._respond()
        except ApiError as error:
            await self._send_error(send, error)
            return
        await _send_json(send, 200, self.wire.whole(response))

    async def _send_error(self, send: Send, error: ApiError) -> None:
        await _send_json(send, error.status, error.body(), error.headers)

    async def _stream(self, send: Send) -> None:
        wire = self.wire
        chat_events = stream_chat(self.switcher, self.request)
        try:
            # The status waits for the first event: a chat the template refuses or an
            # upstream that cannot be reached gets its own status code, as from vLLM.
            first = await anext(chat_events)
        except Exception as failure:
            await self._send_error(send, self._api_error(failure))
            return
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        self._events = events = _EventWriter(send)
        keeping = asyncio.create_task(events.keep_alive(self.keepalive)) if self.keepalive else None
        try:
            await events.write(wire.opening())
            async for chat_event in _prepend(first, chat_events):
                if isinstance(chat_event, ChatResponse):
                    self.result = chat_event.result
                    await events.write(wire.closing(chat_event))
                else:
                    await events.write(wire.event(chat_event))
        except Exception as failure:  # after the 200: the error travels as an event
            await events.write(wire.failure(self._api_error(failure)))
        finally:
            if keeping is not None:
                keeping.cancel()
                await asyncio.gather(keeping, return_exceptions=True)
            await chat_events.aclose()
        await send({"type": "http.response.body", "body": b""})

    async def _respond(self) -> ChatResponse:
        try:
            response = await final_event(stream_chat(self.switcher, self.request), ChatResponse)
        except Exception as failure:
            raise self._api_error(failure) from failure
        self.result = response.result
        return response

    def _api_error(self, failure: Exception) -> ApiError:
        """The client's view of a failed generation; its partial result is kept and sent.
        The log gets the failure in full (the upstream's address and words), the client the
        relay's own words (:func:`upstream_error`)."""
        if isinstance(failure, ApiError):
            return failure
        if isinstance(failure, EndpointError) and failure.partial is not None:
            self.result = failure.partial
        error = upstream_error(failure)
        self.admission.metrics.errors.labels(error.code or error.kind).inc()
        fields: dict[str, Any] = {"status": error.status, "code": error.code}
        if isinstance(failure, EndpointError):
            fields["upstream"] = self.switcher.config.endpoint(failure.role).base_url
        if error.status >= 500 or isinstance(failure, EndpointError | InvalidChatError):
            log.warning("generation failed", exc_info=failure, extra={"fields": fields})
        if self.result is not None and isinstance(failure, EndpointError):
            error.extra["relay"] = {"partial": client_partial(self.result)}
        return error


def upstream_error(failure: Exception) -> ApiError:
    """The status and message a client gets for a failure of the relay or its upstreams.

    In the relay's own words: which model's server, what kind of failure (with the status it
    answered, a number), what the client can do, and the request id under which the server's
    log keeps the rest. Never the upstream's words or address: an error body can name hosts
    behind a proxy, or say anything at all::

        upstream_error(failure).body()
        # {"error": {"message": "the large model's server is unavailable: it answered 502 ...
    """
    where = f" (request id {request_id.get()}; the relay's log has the details)"
    if isinstance(failure, InvalidChatError):
        message = (
            "the model's chat template refused these messages or tools: check the order of "
            "the roles, that each tool call is answered by one tool message, and the tools' "
            f"schemas{where}"
        )
        return ApiError(400, message, param="messages", code="invalid_chat")
    if isinstance(failure, ContextOverflowError):  # the relay's words; as OpenAI and vLLM name it
        return ApiError(400, str(failure), param="messages", code="context_length_exceeded")
    if isinstance(failure, CueArtifactError):  # its path and the models' roots: the log's
        message = f"relay misconfigured: its cue set does not fit the models it serves{where}"
        return ApiError(500, message, code="relay_misconfigured")
    if isinstance(failure, EndpointError):
        return _endpoint_error(failure, where)
    return ApiError(500, f"internal error: {type(failure).__name__}", code="internal_error")


def _endpoint_error(failure: EndpointError, where: str) -> ApiError:
    server = f"the {failure.role} model's server"
    cause = failure.__cause__
    answered = ""
    if isinstance(cause, UpstreamFailure) and isinstance(cause.cause, openai.APIStatusError):
        answered = f" (it answered {cause.cause.status_code})"
    kept = " The text written before the failure is in relay.partial." if failure.partial else ""
    if failure.kind == "rejected":
        message = (
            f"{server} refused the request{answered}: a field of it (a sampling value, a stop "
            f"string, the token budget) may be beyond what that server allows{where}.{kept}"
        )
        return ApiError(400, message, code="upstream_rejected_request")
    if failure.kind == "timeout":
        message = f"{server} timed out: it sent nothing in time{where}; retry later.{kept}"
        return ApiError(504, message, code="upstream_timeout")
    if failure.kind == "unavailable":  # known down: a retry elsewhere, or soon, may pass
        message = (
            f"{server} is known down: requests found it out, so this one was not sent{where}; "
            f"retry in a few seconds or on another replica.{kept}"
        )
        return ApiError(503, message, code="upstream_unavailable", headers=RETRY_SOON)
    if answered:
        what = answered.strip(" ()")
    elif isinstance(cause, UpstreamFailure) and cause.outage:
        what = "no connection to it, or the connection was lost"
    else:
        what = "it failed the request (an error event, a broken stream, or an answer not vLLM's)"
    message = (
        f"{server} is unavailable: {what}{where}; retry in a few seconds or on another "
        f"replica.{kept}"
    )
    return ApiError(502, message, code="upstream_failed")


async def _send_json(
    send: Send, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json")]
            + [(k.encode(), v.encode()) for k, v in (headers or {}).items()],
        }
    )
    await send({"type": "http.response.body", "body": json.dumps(body).encode()})


class _EventWriter:
    """A stream's writes, one at a time, and when the last one ended."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._lock = asyncio.Lock()
        self._loop = asyncio.get_running_loop()
        self._last = self._loop.time()

    async def write(self, events: list[bytes]) -> None:
        """Write whole SSE events (never between two writes of another task)."""
        async with self._lock:
            for body in events:
                await self._send({"type": "http.response.body", "body": body, "more_body": True})
            self._last = self._loop.time()

    async def keep_alive(self, interval: float) -> None:
        """Write :data:`KEEPALIVE` whenever nothing was written for `interval` seconds; runs
        until cancelled."""
        while True:
            wait = self._last + interval - self._loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            else:
                await self.write([KEEPALIVE])


async def _prepend(first: T, rest: AsyncIterator[T]) -> AsyncIterator[T]:
    yield first
    async for item in rest:
        yield item


async def _until_disconnect(
    work: Awaitable[None], receive: Receive, cut: asyncio.Event
) -> Literal["done", "disconnected", "cut"]:
    """Run `work`; a client that disconnects first, or the shutdown's `cut`, cancels it (and
    its upstream requests). Returns how it ended."""
    task = asyncio.ensure_future(work)
    listener = asyncio.ensure_future(_disconnected(receive))
    cutting = asyncio.ensure_future(cut.wait())
    try:
        done, _ = await asyncio.wait({task, listener, cutting}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (task, listener, cutting):
            pending.cancel()
        await asyncio.gather(task, listener, cutting, return_exceptions=True)
    if task in done:
        if task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
        return "done"
    return "disconnected" if listener in done else "cut"


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
