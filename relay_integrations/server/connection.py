"""The time limits of a client connection, as a production HTTP server has them (nginx's
``client_header_timeout`` and ``send_timeout``), on uvicorn's own HTTP protocol::

    protocol = limited_protocol(head_timeout=30, send_timeout=60, on_limit=count)
    uvicorn.Config(app, http=protocol)

- **The request head**: a connection must send a whole request head within
  ``head_timeout`` seconds of opening (or, kept alive, of the first byte of its next request);
  otherwise it is answered 408 and closed. One header every ten seconds (slowloris) holds
  nothing for long.
- **Sending**: while the connection's write buffer is full (the client reads nothing), it has
  ``send_timeout`` seconds to accept some of it; then the connection is dropped, which the
  app sees as a disconnect: its generation is cancelled, its upstream requests closed, its
  slot freed. The operating system's socket buffers take what the client does not read first,
  so a stream whose client stopped reading ends once those are full and the timeout has run.

uvicorn has neither: its keep-alive timeout applies only between requests, and a send waits as
long as the client does. ``on_limit`` is told which limit closed a connection (for logs and
metrics).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any, Literal

from uvicorn.protocols.http.auto import AutoHTTPProtocol

Limit = Literal["head", "send"]
_BODY = json.dumps(
    {
        "error": {
            "message": "the request head did not arrive in time",
            "type": "invalid_request_error",
            "param": None,
            "code": "request_timeout",
        }
    }
).encode()
REQUEST_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_BODY), _BODY)
)
"""What a connection whose request head is late gets before it is closed."""


def limited_protocol(
    head_timeout: float, send_timeout: float, on_limit: Callable[[Limit], None]
) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (h11 or httptools, as uvicorn picks) with the two limits."""
    base: Any = AutoHTTPProtocol

    class LimitedProtocol(base):  # type: ignore[misc]
        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            self._head_timer: asyncio.TimerHandle | None = None
            self._send_timer: asyncio.TimerHandle | None = None
            self._waiting_cycle: object = self.cycle
            self._arm_head()

        def data_received(self, data: bytes) -> None:
            if self._head_timer is None and self._between_requests():
                self._arm_head()  # the first byte of the next request on a kept-alive one
            super().data_received(data)
            if self._head_timer is not None and self.cycle is not self._waiting_cycle:
                self._head_timer.cancel()  # a whole head: the app has the request
                self._head_timer = None

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._waiting_cycle = self.cycle  # the next head starts with its first byte

        def pause_writing(self) -> None:
            super().pause_writing()
            if self._send_timer is None:
                self._send_timer = self.loop.call_later(send_timeout, self._send_stalled)

        def resume_writing(self) -> None:
            super().resume_writing()
            if self._send_timer is not None:
                self._send_timer.cancel()
                self._send_timer = None

        def connection_lost(self, exc: Exception | None) -> None:
            for timer in (self._head_timer, self._send_timer):
                if timer is not None:
                    timer.cancel()
            super().connection_lost(exc)

        def _between_requests(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm_head(self) -> None:
            self._waiting_cycle = self.cycle
            self._head_timer = self.loop.call_later(head_timeout, self._head_late)

        def _head_late(self) -> None:
            self._head_timer = None
            if self.transport.is_closing() or self.cycle is not self._waiting_cycle:
                return
            on_limit("head")
            self.transport.write(REQUEST_TIMEOUT)
            self.transport.close()

        def _send_stalled(self) -> None:
            self._send_timer = None
            if not self.transport.is_closing():
                on_limit("send")
                self.transport.abort()  # close() would wait for the client to read

    return LimitedProtocol
