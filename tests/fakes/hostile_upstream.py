"""A hostile upstream: a loopback server on raw sockets whose every answer follows a plan (an
:class:`AnswerPlan`: status, headers, framing, the events of a body, pauses, where the
connection is cut), so that a test can send the relay any bytes a broken server, proxy or
gateway could, and know exactly what was sent. :func:`answer_plans` is the hypothesis
strategy of plans; :func:`completion_answer` and :func:`scripted_events` build vLLM-shaped
completion streams (the chunks of ``relay_integrations.testing.scripted_vllm``)::

    plan = AnswerPlan(events=(Chunk("Hel"), Chunk("lo")), framing="chunked")  # no finish
    async with HostileUpstream({"/v1/completions": [plan]}) as server:
        endpoint = Endpoint(EndpointConfig(base_url=server.base_url, model="m"), "large")
        ...                                 # stream_completion: it must not look complete
        server.posts()                      # POSTs to /v1/completions received
        server.served[-1].plan.streamed()   # the text and finish reason the client was sent

Requests without a plan of their own (or whose queued plan is None) get the `fallback`
plan, or, with scripted `models`
(:class:`~relay_integrations.testing.scripted_vllm.ScriptedModel`), what a fault-free vLLM
serving them would answer: ``GET /v1/models``, ``/tokenize`` (the chat rendered by the
model's template, or a text), ``/detokenize``, and the completion of the request's prompt
(a text, or token ids) by the model it names (its stop strings, ``max_tokens``, usage, the
ids of ``return_token_ids``). A queued plan may also be a :class:`Breakage` of that scripted
answer (a completion's first chunks, then a fault; a JSON answer cut, held, emptied), which
is how a test breaks one request in the middle of a whole generation. Plans are queued by
path, or by path and phase of the generation (:func:`request_phase`: ``("/v1/completions",
"answer")`` are the completions that write the answer), so that a test aims a fault at a
model's server (one server a model) and a phase; :class:`LocalChatTemplate` renders the
chat without ``/tokenize`` for a relay in front of it. :func:`steady_state_growth` measures
what repeated rounds (generations) leave in memory.

The hypothesis settings of the tests that use it are :func:`hostile_settings`: a bounded
``ci`` profile by default, ``HYPOTHESIS_PROFILE=long`` for a long search.

Every answer closes its connection (``Connection: close``), so that a POST the server received
is a POST the client sent on a connection of its own, never one the client could take for a
kept-alive connection closed while idle: the count of received POSTs is the count of tries.
Deterministic given the plans: nothing is random, pauses are ``asyncio.sleep``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import tracemalloc
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

import h11
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase

from relay_integrations.testing.qwen3_template import ASSISTANT, render_chat, tokenize
from relay_integrations.testing.scripted_vllm import ScriptedModel, decode, token_id
from relay_integrations.testing.vllm_stops import StopText
from relay_integrations.upstream import ChatInput, Endpoint, RenderedPrompt

# --- the events of a body -----------------------------------------------------------------


@dataclass(frozen=True)
class Chunk:
    """A completion chunk of vLLM's ``/v1/completions`` stream (`delay`: seconds before it
    is written)."""

    text: str = ""
    finish_reason: str | None = None
    stop_reason: str | None = None
    delay: float = 0.0
    token_ids: tuple[int, ...] | None = None
    """The ids of the tokens written since the last chunk (vLLM's ``return_token_ids``)."""


@dataclass(frozen=True)
class Usage:
    """vLLM's last chunk before ``[DONE]``: no choices, the usage."""

    prompt_tokens: int = 3
    completion_tokens: int = 1
    delay: float = 0.0


@dataclass(frozen=True)
class Done:
    """``data: [DONE]``."""

    delay: float = 0.0


@dataclass(frozen=True)
class Comment:
    """An SSE comment (``: ping``), which proxies send to keep a connection alive."""

    text: str = "ping"
    delay: float = 0.0


@dataclass(frozen=True)
class Raw:
    """An event whose data is these bytes as they are: an error object, something not JSON."""

    data: bytes
    delay: float = 0.0


Event = Chunk | Usage | Done | Comment | Raw
Framing = Literal["length", "chunked", "close"]
"""How the body's end is told: a Content-Length, chunked transfer encoding, or the connection's
close (HTTP/1.1's close-delimited body)."""
Ending = Literal[
    "whole", "mid_event", "mid_chunk_size", "hang_up", "stall", "heartbeats", "endless_line"
]
"""How the answer ends: its whole body; the connection closed half-way through the last
event's bytes, or half-way through its chunk's size line (chunked framing); closed after the
request was read, with no answer at all; held open after the events with nothing more sent;
held open with an SSE comment every ``HEARTBEAT`` seconds (bytes arrive, no event); or
followed by a ``data:`` line of ``ENDLESS_MIB`` MiB that never ends (no line break)."""

FRAMINGS: tuple[Framing, ...] = ("chunked", "length", "close")
HEARTBEAT = 0.1
ENDLESS_MIB = 128
"""MiB of the line that never ends (an ``endless_line`` ending)."""
"""Seconds between the comments of an answer that ends in heartbeats."""
MODEL = "m"
"""The model name of the answers built here (and what ``/v1/models`` serves by default)."""


def completion_chunk(
    text: str,
    finish_reason: str | None = None,
    stop_reason: str | None = None,
    usage: Mapping[str, int] | None = None,
    model: str = MODEL,
    token_ids: Sequence[int] | None = None,
) -> dict[str, Any]:
    """One chunk of vLLM's completions stream as a JSON object (no choices: a usage chunk)."""
    choice: dict[str, Any] = {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
    }
    if token_ids is not None:
        choice["token_ids"] = list(token_ids)
    choices = [choice]
    return {
        "id": "cmpl-hostile",
        "object": "text_completion",
        "created": 0,
        "model": model,
        "choices": [] if usage is not None else choices,
        "usage": dict(usage) if usage is not None else None,
    }


def event_bytes(event: Event, newline: bytes = b"\n") -> bytes:
    """The bytes of one event on the wire, its lines ended by `newline` (CR, LF or CR LF)."""
    if isinstance(event, Chunk):
        chunk = completion_chunk(
            event.text, event.finish_reason, event.stop_reason, token_ids=event.token_ids
        )
        data = json.dumps(chunk).encode()
    elif isinstance(event, Usage):
        usage = {
            "prompt_tokens": event.prompt_tokens,
            "completion_tokens": event.completion_tokens,
            "total_tokens": event.prompt_tokens + event.completion_tokens,
        }
        data = json.dumps(completion_chunk("", usage=usage)).encode()
    elif isinstance(event, Done):
        data = b"[DONE]"
    elif isinstance(event, Comment):
        return b":" + event.text.encode() + newline * 2
    else:
        data = event.data
    return b"data: " + data + newline * 2


# --- one answer ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Streamed:
    """What an answer's stream told a client that reads events as vLLM means them: the text
    of the completion chunks that arrived whole (up to a cut, or to an event that is not a
    chunk), their finish reason, and whether the stream said it was done (``[DONE]``)."""

    text: str
    finish_reason: str | None
    done: bool


@dataclass(frozen=True)
class AnswerPlan:
    """What the server answers one request: the bytes, their pauses and where they end.

    The body is `body` if given (a JSON error, an HTML page, gzip bytes: sent as they are),
    else `events` (:func:`event_bytes`, one write each, in two halves with `split`). Pauses:
    `head_delay` before the status line, each event's ``delay`` before it.
    """

    status: int = 200
    content_type: str | None = "text/event-stream"
    headers: tuple[tuple[str, str], ...] = ()
    events: tuple[Event, ...] = ()
    body: bytes | None = None
    framing: Framing = "chunked"
    ending: Ending = "whole"
    head_delay: float = 0.0
    newline: bytes = b"\n"
    split: bool = False

    def parts(self) -> list[tuple[float, bytes]]:
        """The body as (pause before it, bytes) writes, before framing."""
        if self.body is not None:
            return [(0.0, self.body)]
        parts: list[tuple[float, bytes]] = []
        for event in self.events:
            data = event_bytes(event, self.newline)
            if self.split and len(data) > 1:
                half = len(data) // 2
                parts += [(event.delay, data[:half]), (0.0, data[half:])]
            else:
                parts.append((event.delay, data))
        return parts

    @property
    def cut(self) -> bool:
        """Whether the connection is closed before the body's end (a part of it unsent)."""
        return self.ending in ("mid_event", "mid_chunk_size")

    def delivered(self) -> tuple[Event, ...]:
        """The events that arrive whole (the last one is cut by a cut ending)."""
        if self.ending == "hang_up" or self.body is not None:
            return ()
        return self.events[:-1] if self.cut else self.events

    def streamed(self) -> Streamed:
        """What the stream told (see :class:`Streamed`); empty for an answer that is not a
        200 event stream."""
        if self.status != 200 or not self.is_event_stream or self.ending == "hang_up":
            return Streamed("", None, False)
        text, finish = "", None
        for event in self.delivered():
            if isinstance(event, Done):
                return Streamed(text, finish, True)
            if isinstance(event, Raw):
                break
            if isinstance(event, Chunk):
                text += event.text
                finish = event.finish_reason or finish
        return Streamed(text, finish, False)

    @property
    def is_event_stream(self) -> bool:
        return (self.content_type or "").split(";")[0].strip() == "text/event-stream"

    def is_clean(self, read_timeout: float) -> bool:
        """Whether a fault-free vLLM could have sent this (a client must take it as the
        complete answer it is): a 200 event stream of chunks with a finish reason, usage and
        ``[DONE]``, whole, no pause as long as half the read timeout."""
        streamed = self.streamed()
        return (
            self.status == 200
            and self.is_event_stream
            and self.body is None
            and self.ending == "whole"
            and streamed.done
            and streamed.finish_reason is not None
            and not any(isinstance(e, Raw) for e in self.events)
            and max([self.head_delay, *(e.delay for e in self.events)]) < read_timeout / 2
        )

    def pauses(self) -> float:
        """Seconds of pauses the plan writes (its head's and its events')."""
        return self.head_delay + sum(e.delay for e in self.events)

    def head(self, body_length: int) -> bytes:
        """The status line and headers; a Content-Length of `body_length` (more, for an
        answer held open after its events: the client waits for the rest)."""
        reason = {200: "OK", 404: "Not Found", 429: "Too Many Requests", 503: "Unavailable"}
        lines = [f"HTTP/1.1 {self.status} {reason.get(self.status, 'Whatever')}"]
        if self.content_type is not None:
            lines.append(f"content-type: {self.content_type}")
        if self.framing == "length":
            held = self.ending in ("stall", "heartbeats", "endless_line")
            more = (ENDLESS_MIB + 1) << 20 if held else 0
            lines.append(f"content-length: {body_length + more}")
        elif self.framing == "chunked":
            lines.append("transfer-encoding: chunked")
        lines += [f"{name}: {value}" for name, value in self.headers]
        lines.append("connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def completion_answer(
    pieces: Iterable[str], finish_reason: str | None = "stop", **plan: Any
) -> AnswerPlan:
    """A 200 stream of one chunk a piece, the finish, usage and ``[DONE]`` (`plan`: the
    :class:`AnswerPlan` fields to change)."""
    events: list[Event] = [Chunk(piece) for piece in pieces]
    events += [Chunk("", finish_reason), Usage(completion_tokens=len(events)), Done()]
    return AnswerPlan(events=tuple(events), **plan)


def json_answer(value: Any, status: int = 200, **plan: Any) -> AnswerPlan:
    """A JSON body (``/v1/models``, an error) with a Content-Length."""
    return AnswerPlan(
        status=status,
        content_type="application/json",
        body=json.dumps(value).encode(),
        framing="length",
        **plan,
    )


def models_answer(*names: str) -> AnswerPlan:
    """``GET /v1/models`` as vLLM answers it."""
    data = [{"id": n, "object": "model", "root": n, "max_model_len": 4096} for n in names]
    return json_answer({"object": "list", "data": data})


def gzip_bomb(megabytes: int) -> AnswerPlan:
    """A ``/v1/models`` answer whose gzip body inflates to `megabytes` MiB (about a
    thousandth of that on the wire): a JSON object padded with spaces."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # gzip's container
    packed = [packer.compress(b'{"object": "list", "data": [')]
    packed += [packer.compress(b" " * (1 << 20)) for _ in range(megabytes)]  # 1 MiB at a time
    packed += [packer.compress(b"]}"), packer.flush()]
    return AnswerPlan(
        content_type="application/json",
        headers=(("content-encoding", "gzip"),),
        body=b"".join(packed),
        framing="length",
    )


def scripted_events(model: ScriptedModel, body: Mapping[str, Any]) -> tuple[Event, ...]:
    """The events a fault-free vLLM serving `model` streams for a completion request `body`:
    a chunk a token of the model's continuation of the prompt, vLLM's stop strings applied
    (:class:`~relay_integrations.testing.vllm_stops.StopText`), ``max_tokens``, then the
    finish, usage and ``[DONE]``; each chunk with its token's id when the request asks
    ``return_token_ids`` (the ids of
    :func:`~relay_integrations.testing.scripted_vllm.token_id`)."""
    include = bool(body.get("include_stop_str_in_output", False))
    text = StopText(body.get("stop") or [], include_in_output=include)
    with_ids = bool(body.get("return_token_ids"))
    events: list[Event] = []
    finish, stop_reason, written = "stop", None, 0
    for token in tokenize(model.continuation(body["prompt"], dict(body))):
        if written == body.get("max_tokens"):
            finish = "length"
            break
        written += 1
        stop_reason = text.update(token)
        ids = (token_id(token),) if with_ids else None
        events.append(Chunk(text.delta(finished=stop_reason is not None), token_ids=ids))
        if stop_reason is not None:
            break
    last = () if with_ids else None
    events.append(Chunk(text.delta(finished=True), finish, stop_reason, token_ids=last))
    return (*events, Usage(len(tokenize(body["prompt"])), written), Done())


Breaks = Literal[
    "cut", "hang_up", "stall", "heartbeats", "no_finish", "error_event", "status", "html"
]
BREAKS: tuple[Breaks, ...] = get_args(Breaks)
HTML_PAGE = b"<html><body>Sign in to continue</body></html>"
"""What a captive portal or a gateway's login answers in place of an API's answer."""


@dataclass(frozen=True)
class Breakage:
    """A scripted answer broken. A completion stream, after its first `after` chunks: cut
    mid-event, hung up on, stalled, kept alive by comments alone, ended without its finish,
    an error event instead of the next chunk. A JSON answer (``/v1/models``, ``/tokenize``,
    ``/detokenize``): its body cut half-way, hung up on, held open after the body, followed
    by comments that never end it, a 200 without the fields asked for (``no_finish``: ``{}``)
    or with vLLM's error object as its body (``error_event``). Either: an error `status`
    instead of the answer, or (``html``) a 200 HTML page."""

    breaks: Breaks
    after: int = 0
    status: int = 503
    framing: Framing = "chunked"

    def plan(self, scripted: AnswerPlan) -> AnswerPlan:
        """The plan that breaks the answer `scripted`."""
        if self.breaks == "status":
            return json_answer({"error": {"message": "broken on purpose"}}, self.status)
        if self.breaks == "hang_up":
            return AnswerPlan(ending="hang_up")
        if self.breaks == "html":
            return AnswerPlan(content_type="text/html", body=HTML_PAGE, framing="length")
        if scripted.body is not None:
            return self._json(scripted)
        chunks = [e for e in scripted.events if isinstance(e, Chunk)]
        head = tuple(chunks[: min(self.after, len(chunks) - 1)])  # never the finish
        plan = AnswerPlan(events=head, framing=self.framing)
        if self.breaks == "cut":
            return replace(plan, events=(*head, Chunk("next")), ending="mid_event")
        if self.breaks == "error_event":
            error = Raw(b'{"error": {"message": "broken on purpose", "code": 500}}')
            return replace(plan, events=(*head, error))
        if self.breaks == "no_finish":
            return plan
        return replace(plan, ending=self.breaks)

    def _json(self, scripted: AnswerPlan) -> AnswerPlan:
        """The breakage of a JSON answer (see the class)."""
        if self.breaks == "no_finish":
            return replace(scripted, body=b"{}")
        if self.breaks == "error_event":
            return replace(scripted, body=ERROR_BODIES[0])
        endings: dict[Breaks, Ending] = {
            "cut": "mid_event",
            "stall": "stall",
            "heartbeats": "heartbeats",
        }
        return replace(scripted, framing=self.framing, ending=endings[self.breaks])


Planned = AnswerPlan | Breakage | None
"""A queued answer: a plan, a breakage of the scripted answer, or None (the scripted answer)."""
Phase = Literal["reasoning", "answer"]
QueueKey = str | tuple[str, Phase]
"""What a queue of plans answers: the requests for a path, or those for a path in one phase
of a generation (:func:`request_phase`)."""
REASONING_END = "</think>"


def request_phase(request: Received) -> Phase:
    """The phase of a generation that `request` belongs to, told by the text it carries: the
    answer once the text it continues holds the end of the reasoning (the part of a
    completion's prompt after the rendered chat, its token ids decoded; a text sent to
    ``/tokenize``, but for the marker's own); the reasoning before (``/v1/models``, the chat's
    render, and everything else asked before any text)."""
    if request.method != "POST":
        return "reasoning"
    try:
        body = request.json()
        prompt = body.get("prompt") if isinstance(body, dict) else None
        if isinstance(prompt, list):
            prompt = decode(prompt)
    except (ValueError, TypeError, OverflowError):
        return "reasoning"
    if not isinstance(prompt, str):
        return "reasoning"
    if request.path.endswith("/completions"):
        prompt = prompt.split(ASSISTANT, 1)[1] if ASSISTANT in prompt else ""
    elif prompt.strip() == REASONING_END:
        return "reasoning"
    return "answer" if REASONING_END in prompt else "reasoning"


class LocalChatTemplate:
    """A relay's renderer (``RelaySwitcher(renderer=...)``) with the Qwen3 template of the
    scripted models, rendered here: no ``/tokenize`` reaches the hostile upstream."""

    async def render(self, endpoint: Endpoint, chat: ChatInput) -> RenderedPrompt:
        thinking = chat.chat_template_kwargs.get("enable_thinking", True)
        text = render_chat(chat.messages, bool(thinking), chat.tools)
        return RenderedPrompt(text, token_count=len(tokenize(text)))


def hostile_settings(examples: int = 40, **more: Any) -> settings:
    """The hypothesis settings of the hostile-upstream tests, by ``HYPOTHESIS_PROFILE``:
    ``ci`` (the default: `examples` a property, repeatable, no example database) or ``long``
    (25 times as many, a new search every run, failures kept in the database); `more`
    overrides a setting."""
    ci = settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        print_blob=True,
    )
    if os.environ.get("HYPOTHESIS_PROFILE", "ci") == "ci":
        return settings(ci, **more)
    long_search = DirectoryBasedExampleDatabase(".hypothesis/examples")
    return settings(ci, max_examples=25 * examples, derandomize=False, database=long_search, **more)


def steady_state_growth(run: Callable[[int], object], rounds: int) -> int:
    """Bytes Python holds after ``run(rounds)`` twice more than after it once (tracemalloc,
    a collection before each look): what `rounds` more rounds (generations, requests) leave
    held once the first ones have filled every cache that stays; near 0 when a round keeps
    nothing."""
    tracemalloc.start()
    try:
        run(rounds)
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        run(rounds)
        gc.collect()
        return int(tracemalloc.get_traced_memory()[0] - before)
    finally:
        tracemalloc.stop()


# --- the server ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Received:
    """One request as the server read it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True)
class Served:
    """A request, the plan it was answered by, what was queued for it (None: nothing, or a
    None: the scripted answer) and its phase (:func:`request_phase`)."""

    request: Received
    plan: AnswerPlan
    planned: Planned = None
    phase: Phase = "reasoning"


@dataclass
class HostileUpstream:
    """Answers each request by the next plan queued for its path and phase (`plans` keyed
    ``(path, phase)``), else for its path (keyed by the path), else by `fallback`, else as a
    fault-free vLLM serving `models` would; records every request (:attr:`requests`) and
    what answered it (:attr:`served`). Use as an async context manager; `base_url` ends in
    ``/v1``."""

    plans: Mapping[QueueKey, Sequence[Planned]] = field(default_factory=dict)
    models: Sequence[ScriptedModel] = ()
    fallback: AnswerPlan | None = None
    requests: list[Received] = field(default_factory=list)
    served: list[Served] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._queues: dict[QueueKey, deque[Planned]] = {k: deque(q) for k, q in self.plans.items()}
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def queue(self, key: QueueKey, *plans: Planned) -> None:
        """Answer the next requests for `key` (a path, or a path and a phase) by `plans`,
        after those already queued."""
        self._queues.setdefault(key, deque()).extend(plans)

    def replan(self, plans: Mapping[QueueKey, Sequence[Planned]]) -> None:
        """Drop every queued plan and what was recorded (requests, what served them, the
        scripted models' requests), and queue `plans`: one server for one generation after
        another."""
        self._queues = {key: deque(queue) for key, queue in plans.items()}
        self.requests.clear()
        self.served.clear()
        for model in self.models:
            model.forget()

    def posts(self, path: str = "/v1/completions") -> int:
        """How many POSTs for `path` arrived (whole: their body read)."""
        return sum(1 for r in self.requests if r.method == "POST" and r.path == path)

    async def __aenter__(self) -> HostileUpstream:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        try:
            request = await _read_request(reader)
            if request is not None:
                self.requests.append(request)
                phase = request_phase(request)
                planned = self._planned(request, phase)
                plan = self._plan(request, planned)
                self.served.append(Served(request, plan, planned, phase))
                await _answer(plan, reader, writer)
        except (ConnectionError, asyncio.CancelledError):
            pass  # the client left, or the server is closing
        finally:
            self._writers.discard(writer)
            self._tasks.discard(task)
            writer.transport.abort()

    def _planned(self, request: Received, phase: Phase) -> Planned:
        """What was queued for `request` (its path's and phase's queue first)."""
        for key in ((request.path, phase), request.path):
            queued = self._queues.get(key)
            if queued:
                return queued.popleft()
        return None

    def _plan(self, request: Received, planned: Planned) -> AnswerPlan:
        if isinstance(planned, AnswerPlan):
            return planned
        if planned is None and self.fallback is not None:
            return self.fallback
        scripted = self._scripted(request)
        return planned.plan(scripted) if planned is not None else scripted

    def _scripted(self, request: Received) -> AnswerPlan:
        """A fault-free vLLM's answer with the scripts of `models`: the model list, the
        completion, ``/tokenize`` (a chat rendered by the model's template, or a text) and
        ``/detokenize`` (ids of :func:`~relay_integrations.testing.scripted_vllm.token_id`);
        404 for what it does not serve."""
        models = {m.name: m for m in self.models}
        if models and request.path == "/v1/models":
            return models_answer(*models)
        body = request.json() if request.method == "POST" and request.body else {}
        model = models.get(str(body.get("model"))) if isinstance(body, dict) else None
        if model is None:
            return json_answer({"detail": "Not Found"}, 404)
        if request.path == "/v1/completions":
            if isinstance(body.get("prompt"), list):  # token ids: the text they stand for
                body["prompt"] = decode(body["prompt"])
            model.record(body, request.headers)
            return AnswerPlan(events=scripted_events(model, body))
        if request.path == "/tokenize":
            if "messages" in body:
                thinking = (body.get("chat_template_kwargs") or {}).get("enable_thinking", True)
                text = model.chat_template(body["messages"], bool(thinking), body.get("tools"))
                model.renders += 1
            else:
                text = body["prompt"]
            ids = [token_id(t) for t in tokenize(text)]
            tokens = {"count": len(ids), "max_model_len": model.max_model_len, "tokens": ids}
            return json_answer(tokens)
        if request.path == "/detokenize":
            return json_answer({"prompt": decode(body["tokens"])})
        return json_answer({"detail": "Not Found"}, 404)


async def _read_request(reader: asyncio.StreamReader) -> Received | None:
    """One request, parsed by h11; None if the client closed first."""
    parser = h11.Connection(h11.SERVER)
    head: h11.Request | None = None
    body = b""
    while True:
        try:
            event = parser.next_event()
        except h11.RemoteProtocolError:
            return None
        if event is h11.NEED_DATA:
            data = await reader.read(65536)
            if not data:
                return None
            parser.receive_data(data)
        elif isinstance(event, h11.Request):
            head = event
        elif isinstance(event, h11.Data):
            body += bytes(event.data)
        elif isinstance(event, h11.EndOfMessage) and head is not None:
            headers = {k.decode().lower(): v.decode() for k, v in head.headers}
            path = head.target.decode().split("?", 1)[0]
            return Received(head.method.decode(), path, headers, body)
        else:
            return None


async def _answer(
    plan: AnswerPlan, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """Write `plan`'s answer, then close the connection (or hold it, for a stalling plan)."""
    if plan.ending == "hang_up":
        return
    parts = plan.parts()
    await asyncio.sleep(plan.head_delay)
    writer.write(plan.head(sum(len(data) for _, data in parts)))
    await writer.drain()
    last = len(parts) - 1
    for index, (pause, data) in enumerate(parts):
        await asyncio.sleep(pause)
        if index == last and plan.cut:
            if plan.framing == "chunked" and plan.ending == "mid_chunk_size":
                writer.write(f"{len(data):x}".encode()[:1])  # the size line, unfinished
            else:
                framed = _framed(data[: len(data) // 2], plan.framing, announce=len(data))
                writer.write(framed)
            await writer.drain()
            return
        if data:  # an empty chunk would end a chunked body
            writer.write(_framed(data, plan.framing))
            await writer.drain()
    if plan.ending == "stall":
        await reader.read()  # until the client leaves (or the server closes)
        return
    if plan.ending == "endless_line":
        writer.write(_framed(b"data: ", plan.framing))
        mebibyte = _framed(b"x" * (1 << 20), plan.framing)  # one block, written again
        for _ in range(ENDLESS_MIB):
            writer.write(mebibyte)
            await writer.drain()
        return
    if plan.ending == "heartbeats":
        while not writer.transport.is_closing():  # until the client leaves
            await asyncio.sleep(HEARTBEAT)
            writer.write(_framed(event_bytes(Comment(), plan.newline), plan.framing))
            await writer.drain()
        return
    if plan.framing == "chunked":
        writer.write(b"0\r\n\r\n")
    await writer.drain()
    if writer.can_write_eof():
        writer.write_eof()
    with contextlib.suppress(ConnectionError):
        await reader.read()  # the client's close: every byte written is read first


def _framed(data: bytes, framing: Framing, announce: int | None = None) -> bytes:
    """`data` as the body's framing sends it (a chunk of `announce` bytes, only `data` of
    which follow: a chunk cut short)."""
    if framing != "chunked":
        return data
    size = len(data) if announce is None else announce
    return f"{size:x}\r\n".encode() + data + (b"\r\n" if announce is None else b"")


# --- the strategy -------------------------------------------------------------------------

TEXT = st.text(st.characters(codec="utf-8"), min_size=0, max_size=12)
STATUSES = (400, 401, 404, 408, 409, 429, 500, 502, 503, 504)
ERROR_BODIES: tuple[bytes, ...] = (
    b'{"error": {"message": "broken on purpose", "type": "InternalServerError", "code": 500}}',
    b'{"object": "error", "message": "broken on purpose", "type": "BadRequestError", "code": 400}',
    b"<html><body>502 Bad Gateway</body></html>",
    b"",
)
RETRY_AFTER = ("0", "0.1", "1", "soon", "nan", "-1", "Wed, 21 Oct 2015 07:28:00 GMT")
"""Retry-After values a plan may carry: seconds (short ones: the tests' budgets are short),
nonsense, a date in the past."""


@st.composite
def answer_plans(draw: st.DrawFn, read_timeout: float = 0.5) -> AnswerPlan:
    """Answers to a streamed completion, from vLLM's own to broken ones: an error status
    (with Retry-After, vLLM's JSON, an HTML page, nothing), a wrong content type, JSON under
    an event stream, events missing their finish or ``[DONE]``, comments, error events,
    CR / LF / CR LF line ends, each framing, cuts mid-event and mid-chunk-size, a hang-up,
    pauses (short ones, and stalls past `read_timeout`)."""
    framing = draw(st.sampled_from(FRAMINGS))
    newline = draw(st.sampled_from((b"\n", b"\r\n", b"\r")))
    if draw(st.integers(0, 5)) == 0:  # an error status
        status = draw(st.sampled_from(STATUSES))
        headers = (("retry-after", draw(st.sampled_from(RETRY_AFTER))),)
        error = draw(st.sampled_from(ERROR_BODIES))
        content_type = "text/html" if error.startswith(b"<") else "application/json"
        return AnswerPlan(
            status=status,
            content_type=content_type,
            headers=headers if draw(st.booleans()) else (),
            body=error,
            framing=draw(st.sampled_from(FRAMINGS[:2])),
        )
    pause = st.sampled_from((0.0, 0.0, 0.0, 0.01, read_timeout / 8))
    pieces = draw(st.lists(TEXT, max_size=5))
    events: list[Event] = [Chunk(p, delay=draw(pause)) for p in pieces]
    finish = draw(st.sampled_from(("stop", "stop", "length", None)))
    events.append(Chunk("", finish, delay=draw(pause)))
    if draw(st.booleans()):
        events.append(Usage(completion_tokens=len(pieces)))
    if draw(st.integers(0, 4)) > 0:
        events.append(Done())
    for _ in range(draw(st.integers(0, 2))):  # comments, anywhere
        events.insert(
            draw(st.integers(0, len(events))), Comment(draw(st.sampled_from(("", "ping"))))
        )
    if draw(st.integers(0, 5)) == 0:  # something that is not a chunk, instead of the rest
        cut_at = draw(st.integers(0, len(events)))
        raw = draw(st.sampled_from((*ERROR_BODIES[:2], b"not json", b"[1, 2]", b"\xff\xfe")))
        events = [*events[:cut_at], Raw(raw)]
    if draw(st.integers(0, 5)) == 0:  # a stall past the read timeout, somewhere
        at = draw(st.integers(0, len(events) - 1))
        events[at] = replace(events[at], delay=read_timeout * 2.5)
    ending = draw(
        st.sampled_from(("whole",) * 6 + ("mid_event", "mid_chunk_size", "hang_up", "stall"))
    )
    if ending == "mid_chunk_size" and framing != "chunked":
        ending = "mid_event"
    content_type = draw(
        st.sampled_from(
            ("text/event-stream",) * 6
            + ("text/event-stream; charset=utf-8", "application/json", "text/html", None)
        )
    )
    body: bytes | None = None
    if content_type == "text/event-stream" and draw(st.integers(0, 7)) == 0:
        body = draw(st.sampled_from(ERROR_BODIES[:2]))  # vLLM's error as the stream's body
    return AnswerPlan(
        content_type=content_type,
        events=tuple(events),
        body=body,
        framing=framing,
        ending=ending,
        newline=newline,
        split=draw(st.booleans()),
    )


def breakages(max_after: int = 8) -> st.SearchStrategy[Breakage]:
    """Breakages of a scripted answer (:class:`Breakage`)."""
    return st.builds(
        Breakage,
        breaks=st.sampled_from(BREAKS),
        after=st.integers(0, max_after),
        status=st.sampled_from((500, 502, 503, 429, 404)),
        framing=st.sampled_from(FRAMINGS),
    )
