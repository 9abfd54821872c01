"""A loopback HTTP server that answers each request with scripted raw bytes and timing, for
tests of what a client makes of exactly those bytes (framings, cuts, stalls, connections
closed before an answer). It records every request it read, so a test can count the POSTs
a client wrote::

    def script(request: Seen) -> Answer:
        if request.path == "/v1/models":
            return json_answer({"data": [{"id": "m"}]})
        return Answer(stream_head("chunked"), chunked(event({"choices": []})))  # and closes

    async with RawHttp(script) as server:
        ...  # requests to server.base_url ("http://127.0.0.1:PORT/v1")
    assert server.posts == 1
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Framing = Literal["chunked", "length", "close"]
"""How a body's end is told: chunked transfer coding, a content-length, or the connection's
close."""


@dataclass(frozen=True)
class Seen:
    """A request as the server read it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class Answer:
    """What the server does with a request: write each ``bytes`` step (and drain it), wait
    each ``float`` step's seconds; then close the connection, or read the next request on it
    (`keep_alive`)."""

    def __init__(self, *steps: bytes | float, keep_alive: bool = False) -> None:
        self.steps = steps
        self.keep_alive = keep_alive


Script = Callable[[Seen], Answer]


class RawHttp:
    """The server (an ``async with`` block); `script` answers each request."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[Seen] = []
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def posts(self) -> int:
        """The POST requests the server read."""
        return sum(request.method == "POST" for request in self.requests)

    async def __aenter__(self) -> RawHttp:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        try:
            with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
                while True:
                    request = await _read_request(reader)
                    self.requests.append(request)
                    answer = self.script(request)
                    for step in answer.steps:
                        if isinstance(step, bytes):
                            writer.write(step)
                            await writer.drain()
                        else:
                            await asyncio.sleep(step)
                    if not answer.keep_alive:
                        break
        finally:
            self._writers.discard(writer)
            writer.close()


async def _read_request(reader: asyncio.StreamReader) -> Seen:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    line, *header_lines = head.strip().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    method, path, _ = line.split(" ", 2)
    return Seen(method, path, headers, body)


def stream_head(framing: Framing, length: int = 0, status: int = 200) -> bytes:
    """The head of an event stream: `framing` says how its body's end is told (`length`: the
    content-length, for "length")."""
    head = b"HTTP/1.1 %d OK\r\ncontent-type: text/event-stream\r\n" % status
    if framing == "chunked":
        head += b"transfer-encoding: chunked\r\n"
    elif framing == "length":
        head += b"content-length: %d\r\n" % length
    else:
        head += b"connection: close\r\n"
    return head + b"\r\n"


def chunk(part: bytes) -> bytes:
    """One chunk of a chunked body."""
    return b"%x\r\n%s\r\n" % (len(part), part)


LAST_CHUNK = b"0\r\n\r\n"


def chunked(*parts: bytes) -> bytes:
    """A whole chunked body of `parts`."""
    return b"".join(chunk(part) for part in parts if part) + LAST_CHUNK


def framed(parts: list[bytes], framing: Framing, *, whole: bool = True) -> tuple[bytes, ...]:
    """The steps that send a body of `parts` (one write each) in `framing`, head first; not
    `whole`: the body is cut where the parts end (no last chunk; fewer bytes than the
    content-length says, the whole length being twice theirs)."""
    size = sum(map(len, parts))
    head = stream_head(framing, length=size if whole else 2 * size + 1)
    if framing == "chunked":
        return (head, *(chunk(part) for part in parts if part), *([LAST_CHUNK] if whole else []))
    return (head, *parts)


def event(data: Any) -> bytes:
    """An event whose data is `data` as JSON (bytes as they are)."""
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    return b"data: " + raw + b"\n\n"


def text_chunk(text: str, finish: str | None = None, tokens: int | None = None) -> bytes:
    """A ``/v1/completions`` stream's chunk event (with the usage so far: `tokens`)."""
    data: dict[str, Any] = {"choices": [{"index": 0, "text": text, "finish_reason": finish}]}
    if tokens is not None:
        data["usage"] = {
            "prompt_tokens": 3,
            "completion_tokens": tokens,
            "total_tokens": 3 + tokens,
        }
    return event(data)


def usage_chunk(tokens: int) -> bytes:
    """The final usage chunk event of a ``/v1/completions`` stream."""
    usage = {"prompt_tokens": 3, "completion_tokens": tokens, "total_tokens": 3 + tokens}
    return event({"choices": [], "usage": usage})


DONE = b"data: [DONE]\n\n"


def json_answer(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Answer:
    """A JSON answer, the connection kept for the next request."""
    raw = json.dumps(body).encode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items()).encode()
    head = b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n" % (
        status,
        len(raw),
        extra,
    )
    return Answer(head + raw, keep_alive=True)
