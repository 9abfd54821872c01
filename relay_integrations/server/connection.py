"""The limits of client connections, as a production HTTP server has them (nginx's
``client_header_timeout``, ``send_timeout``, ``worker_connections`` and ``limit_conn``), on
uvicorn's own HTTP protocol::

    limits = ConnectionLimits(head_timeout=30, send_timeout=60, max_connections=2048,
                              max_connections_per_client=512, retry_after=1)
    uvicorn.Config(app, http=limited_protocol(limits, on_limit=count))

- **The request head**: a connection must send a whole request head within
  ``head_timeout`` seconds of opening (or, kept alive, of the first byte of its next request);
  otherwise it is answered 408 and closed. One header every ten seconds (slowloris) holds
  nothing for long.
- **Sending**, measured on progress: while the relay has bytes the client has not taken, the
  client must acknowledge some within ``send_timeout`` seconds, or the connection is dropped,
  which the app sees as a disconnect: its generation is cancelled, its upstream requests
  closed, its slot freed. Progress is what the client's TCP stack acknowledged (Linux's
  ``TCP_INFO``), checked four times per timeout from the moment a request arrives, so a
  client that stopped reading is dropped once its own receive buffer is full and the timeout
  has run, however little the relay wrote; the relay's send buffers (megabytes on a fast
  link) do not have to fill first. A slow reader keeps its stream as long as it takes some
  bytes within each timeout. (TCP acknowledges a slow reader's reads in steps of about half
  its receive buffer, so "some bytes" means that much.) Where ``TCP_INFO`` cannot say
  (another system, a Unix socket), the clock runs only while the transport's own buffer is
  full, as before: nginx's measure.
- **How many**: at most ``max_connections`` open at once, and ``max_connections_per_client``
  from one client address (0: no cap). A connection beyond either is answered 503 with
  ``Retry-After`` and closed, before anything of it is read; what it sent meanwhile is
  discarded for a moment (so that the close does not reset the answer away) and it holds no
  place among the open ones.

uvicorn has none of these (its ``limit_concurrency`` answers 503 only once a request is read,
and per process): its keep-alive timeout applies only between requests, and a send waits as
long as the client does. ``on_limit`` is told which limit closed a connection (for logs and
metrics).
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from uvicorn.protocols.http.auto import AutoHTTPProtocol

Limit = Literal["head", "send", "connections", "connections_per_client"]
CHECKS_PER_TIMEOUT = 4
"""How often progress is read within one ``send_timeout`` (a drop comes up to a quarter of it
late)."""
LINGER = 1.0
"""Seconds a refused connection is read (and what it sends discarded) before it is closed."""


def _error(status: int, reason: str, message: str, code: str, headers: bytes = b"") -> bytes:
    body = json.dumps(
        {
            "error": {
                "message": message,
                "type": "invalid_request_error" if status < 500 else "service_unavailable",
                "param": None,
                "code": code,
            }
        }
    ).encode()
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\nconnection: close\r\n%s"
        b"content-length: %d\r\n\r\n%s" % (status, reason.encode(), headers, len(body), body)
    )


REQUEST_TIMEOUT = _error(
    408, "Request Timeout", "the request head did not arrive in time", "request_timeout"
)
"""What a connection whose request head is late gets before it is closed."""


@dataclass(frozen=True)
class ConnectionLimits:
    """The limits of :func:`limited_protocol` (0 connections: no cap)."""

    head_timeout: float
    send_timeout: float
    max_connections: int = 0
    max_connections_per_client: int = 0
    retry_after: int = 1

    def refusal(self, limit: Limit) -> bytes:
        """The 503 a connection beyond `limit` gets."""
        if limit == "connections":
            cap = f"its limit of {self.max_connections} open connections"
        else:
            cap = f"its limit of {self.max_connections_per_client} connections from one client"
        message = (
            f"the relay has {cap}; retry in {self.retry_after} s on a connection of its own, "
            "or reuse the connections already open (HTTP keep-alive)"
        )
        headers = b"retry-after: %d\r\n" % self.retry_after
        return _error(503, "Service Unavailable", message, "too_many_connections", headers)


@dataclass
class OpenConnections:
    """The client connections open now, in all and per client address."""

    limits: ConnectionLimits
    total: int = 0
    per_client: Counter[str] = field(default_factory=Counter)

    def admit(self, client: str) -> Limit | None:
        """Count a new connection from `client`; or the cap it would pass (then not counted)."""
        limits = self.limits
        if limits.max_connections and self.total >= limits.max_connections:
            return "connections"
        per_client = limits.max_connections_per_client
        if per_client and self.per_client[client] >= per_client:
            return "connections_per_client"
        self.total += 1
        self.per_client[client] += 1
        return None

    def release(self, client: str) -> None:
        self.total -= 1
        self.per_client[client] -= 1
        if not self.per_client[client]:
            del self.per_client[client]


def limited_protocol(
    limits: ConnectionLimits, on_limit: Callable[[Limit], None]
) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (h11 or httptools, as uvicorn picks) with the limits; one
    count of open connections for every connection it serves (one per process)."""
    base: Any = AutoHTTPProtocol
    connections = OpenConnections(limits)
    check_every = limits.send_timeout / CHECKS_PER_TIMEOUT

    class LimitedProtocol(base):  # type: ignore[misc]
        def connection_made(self, transport: asyncio.Transport) -> None:
            peer = transport.get_extra_info("peername")
            self._client = str(peer[0]) if isinstance(peer, tuple) else "local"
            refused = connections.admit(self._client)
            self._refused = refused is not None
            if refused is not None:
                self._refuse(transport, refused)
                return
            super().connection_made(transport)
            self._head_timer: asyncio.TimerHandle | None = None
            self._send_timer: asyncio.TimerHandle | None = None
            self._waiting_cycle: object = self.cycle
            self._paused, self._resumes = False, 0
            self._progress = (-1, 0.0)  # (bytes acknowledged, when that was first seen)
            self._arm_head()

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return  # discarded: the 503 is on its way
            if self._head_timer is None and self._between_requests():
                self._arm_head()  # the first byte of the next request on a kept-alive one
            super().data_received(data)
            if self._head_timer is not None and self.cycle is not self._waiting_cycle:
                self._head_timer.cancel()  # a whole head: the app has the request
                self._head_timer = None
                self._watch_sending()

        def eof_received(self) -> bool | None:
            if self._refused:
                return None  # the transport closes (its 503 is written first)
            result: bool | None = super().eof_received()
            return result

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._waiting_cycle = self.cycle  # the next head starts with its first byte

        def pause_writing(self) -> None:
            super().pause_writing()
            self._paused = True

        def resume_writing(self) -> None:
            super().resume_writing()
            self._paused, self._resumes = False, self._resumes + 1

        def connection_lost(self, exc: Exception | None) -> None:
            if self._refused:
                return
            connections.release(self._client)
            for timer in (self._head_timer, self._send_timer):
                if timer is not None:
                    timer.cancel()
            super().connection_lost(exc)

        def _refuse(self, transport: asyncio.Transport, limit: Limit) -> None:
            """Answer 503 without reading the request, then close: half-closed at once (the
            client reads the answer, then the end), fully after `LINGER` seconds, so that
            what the client sent meanwhile, unread, does not make the close a reset."""
            on_limit(limit)
            transport.write(limits.refusal(limit))
            if transport.can_write_eof():
                transport.write_eof()
            asyncio.get_running_loop().call_later(LINGER, transport.close)

        def _between_requests(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm_head(self) -> None:
            self._waiting_cycle = self.cycle
            self._head_timer = self.loop.call_later(limits.head_timeout, self._head_late)

        def _head_late(self) -> None:
            self._head_timer = None
            if self.transport.is_closing() or self.cycle is not self._waiting_cycle:
                return
            on_limit("head")
            self.transport.write(REQUEST_TIMEOUT)
            self.transport.close()

        def _watch_sending(self) -> None:
            """Check the client's progress from now on, every `check_every` seconds, while a
            request is served or the client has bytes still to take."""
            if self._send_timer is None:
                self._progress = (-1, self.loop.time())
                self._send_timer = self.loop.call_later(check_every, self._check_sending)

        def _check_sending(self) -> None:
            self._send_timer = None
            acknowledged, waiting = self._delivery()
            now = self.loop.time()
            if acknowledged != self._progress[0] or not waiting:
                self._progress = (acknowledged, now)
            elif now - self._progress[1] >= limits.send_timeout:
                on_limit("send")
                self.transport.abort()  # close() would wait for the client to read
                return
            if waiting or not self._between_requests():
                self._send_timer = self.loop.call_later(check_every, self._check_sending)

        def _delivery(self) -> tuple[int, bool]:
            """A count that grows as the client takes bytes, and whether bytes wait for it."""
            buffered = self.transport.get_write_buffer_size()
            sock = self.transport.get_extra_info("socket")
            info = _tcp_delivery(sock) if sock is not None else None
            if info is None:  # the transport's flow control alone: progress is a resume
                return self._resumes, self._paused
            acknowledged, in_flight = info
            return acknowledged, in_flight or buffered > 0

    return LimitedProtocol


_TCP_INFO = getattr(socket, "TCP_INFO", None)  # Linux
_BYTES_ACKED, _UNACKED, _NOTSENT = struct.Struct("Q"), struct.Struct("I"), struct.Struct("I")


def _tcp_delivery(sock: Any) -> tuple[int, bool] | None:
    """From Linux's ``struct tcp_info``: the bytes the peer acknowledged (``tcpi_bytes_acked``,
    offset 120, Linux 4.1) and whether bytes are unacknowledged or unsent in the kernel
    (``tcpi_unacked``, offset 24; ``tcpi_notsent_bytes``, offset 144, Linux 4.6); None where
    that is not available."""
    if _TCP_INFO is None:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 152)
    except OSError:  # not a TCP socket
        return None
    if len(info) < 148:
        return None
    (acknowledged,) = _BYTES_ACKED.unpack_from(info, 120)
    (unacked,) = _UNACKED.unpack_from(info, 24)
    (notsent,) = _NOTSENT.unpack_from(info, 144)
    return acknowledged, unacked > 0 or notsent > 0
