"""HTTP/1.1 to a vLLM server on asyncio's own transports: every request of a generation.

Each streamed token is a chunk of the server's event stream, and a GPU server sends them one
at a time, a few milliseconds apart. Through httpx (under the openai SDK) such a chunk cost
70-80 us of CPU: an anyio cancel scope, and a pause and a resume of the socket's reader (two
``epoll_ctl`` calls), for every read. Here the protocol parses the chunked body and the event
lines as the bytes arrive and wakes the reader once per arrival: under 10 us a chunk. It does
what the relay asks of a server and no more: a JSON request, its answer read as server-sent
events or as one body, over kept-alive connections::

    client = WireClient("http://127.0.0.1:8000", {"authorization": "Bearer k"}, 10.0, 600.0)
    response = await client.request("POST", "/v1/completions", {"model": "m", "prompt": "Hi"})
    async for data in response.events():   # each event's `data:` payload, as bytes
        ...
    await client.aclose()

Failures are the openai SDK's own errors, as the relay's retries and messages expect them:
``APIConnectionError`` (its cause the ``OSError``: refused, host not found),
``APITimeoutError`` (caused by :class:`ConnectTimeout` or :class:`ReadTimeout`), and an
``APIStatusError`` subclass for an HTTP error status, with the server's body. A reused
connection the server had closed meanwhile is replaced once, at no cost to the caller.
``https://`` URLs use the system's certificates (``SSL_CERT_FILE`` and ``SSL_CERT_DIR`` too);
``HTTP_PROXY``, ``HTTPS_PROXY`` and ``NO_PROXY`` are honoured as by httpx: a plain HTTP
server through its proxy by absolute URL, an HTTPS one through a ``CONNECT`` tunnel.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import ssl
import typing
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import Any

import openai

_REQUEST = typing.get_type_hints(openai.APIConnectionError.__init__)["request"]
_RESPONSE = typing.get_type_hints(openai.APIStatusError.__init__)["response"]
"""The request and response classes the installed openai SDK builds its errors on (httpx's
for openai 1, httpx2's for later versions)."""

_STATUS_ERRORS: dict[int, type[openai.APIStatusError]] = {
    400: openai.BadRequestError,
    401: openai.AuthenticationError,
    403: openai.PermissionDeniedError,
    404: openai.NotFoundError,
    409: openai.ConflictError,
    422: openai.UnprocessableEntityError,
    429: openai.RateLimitError,
}
PAUSE_AT = 256
"""Events a response holds unread before it stops reading its socket (resumed below half)."""


class ConnectTimeout(Exception):
    """No connection within the connect timeout (the cause of an ``APITimeoutError``)."""


class ReadTimeout(Exception):
    """Nothing arrived within the read timeout (the cause of an ``APITimeoutError``)."""


class RemoteProtocolError(Exception):
    """The server closed the connection before the end of its answer, or broke HTTP."""


class WireClient:
    """Kept-alive connections to the server of `url` (its scheme, host and port; one event
    loop's), and the requests sent on them. `headers` go with every request (a request's own
    headers win; names are case-insensitive)."""

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str],
        connect_timeout: float,
        read_timeout: float,
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.tls = ssl.create_default_context() if parts.scheme == "https" else None
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self._proxy = _proxy_for(parts)
        self._absolute = self._proxy is not None and self.tls is None  # no tunnel: full URLs
        authority = self.host if parts.port is None else f"{self.host}:{parts.port}"
        self._headers = {"host": authority, "content-type": "application/json", "accept": "*/*"}
        self._headers |= {name.lower(): value for name, value in headers.items()}
        if self._absolute and self._proxy is not None and self._proxy.authorization:
            self._headers["proxy-authorization"] = self._proxy.authorization
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> WireResponse:
        """Send a request for `path` (``/v1/completions``); its response once its head has
        arrived. An error status raises the SDK's ``APIStatusError`` (the body read); close
        the response when done."""
        url = self.origin + path
        target = url if self._absolute else path
        content = b"" if body is None else json.dumps(body, ensure_ascii=False).encode()
        fields = (
            self._headers | {k.lower(): v for k, v in headers.items()} if headers else self._headers
        )
        lines = "".join(f"{name}: {value}\r\n" for name, value in fields.items())
        head = f"{method} {target} HTTP/1.1\r\n{lines}content-length: "
        message = head.encode() + b"%d\r\n\r\n" % len(content) + content
        response = await self._exchange(message, _Sent(method, url))
        if response.status >= 400:
            await response.raise_status()
        return response

    async def aclose(self) -> None:
        """Close every connection (a response still open with it)."""
        for connection in list(self._open):
            connection.abort()
        self._idle.clear()

    async def _exchange(self, message: bytes, request: _Sent) -> WireResponse:
        while self._idle:
            connection = self._idle.pop()
            if connection.reusable:
                try:
                    return await self._send(connection, message, request)
                except _StaleConnection:
                    continue  # closed by the server while idle: a new connection
        return await self._send(await self._connect(request), message, request)

    async def _send(self, connection: _Connection, message: bytes, request: _Sent) -> WireResponse:
        connection.begin(self.read_timeout)
        connection.transport.write(message)
        try:
            await connection.head_arrived()
        except RemoteProtocolError as lost:
            connection.abort()
            if connection.reused and not connection.received:
                raise _StaleConnection from lost
            raise openai.APIConnectionError(message=str(lost), request=request.sdk()) from lost
        except ReadTimeout as timeout:
            connection.abort()
            raise openai.APITimeoutError(request=request.sdk()) from timeout
        except BaseException:
            connection.abort()
            raise
        return WireResponse(self, connection, request)

    async def _connect(self, request: _Sent) -> _Connection:
        loop = asyncio.get_running_loop()
        host, port = (self._proxy.host, self._proxy.port) if self._proxy else (self.host, self.port)
        try:
            async with asyncio.timeout(self.connect_timeout):
                if self._proxy is not None and self.tls is not None:
                    _, connection = await self._tunnel(loop)
                else:
                    _, connection = await loop.create_connection(
                        lambda: _Connection(self), host, port, ssl=self.tls
                    )
        except TimeoutError:
            raise openai.APITimeoutError(request=request.sdk()) from ConnectTimeout(
                f"no connection to {host}:{port} within {self.connect_timeout:g} s"
            )
        except OSError as failed:
            message = str(failed)
            raise openai.APIConnectionError(message=message, request=request.sdk()) from failed
        self._open.add(connection)
        return connection

    async def _tunnel(self, loop: asyncio.AbstractEventLoop) -> tuple[Any, _Connection]:
        """A connection through the proxy's ``CONNECT`` tunnel, then TLS to the server."""
        assert self._proxy is not None and self.tls is not None
        opened = loop.create_future()
        transport, _ = await loop.create_connection(
            lambda: _TunnelOpening(opened), self._proxy.host, self._proxy.port
        )
        authority = f"{self.host}:{self.port}"
        lines = [f"CONNECT {authority} HTTP/1.1", f"host: {authority}"]
        if self._proxy.authorization:
            lines.append(f"proxy-authorization: {self._proxy.authorization}")
        transport.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        try:
            status = await opened
        except BaseException:
            transport.close()
            raise
        if status != 200:
            transport.close()
            raise OSError(f"the proxy refused the tunnel to {authority} with status {status}")
        connection = _Connection(self)
        tls = await loop.start_tls(transport, connection, self.tls, server_hostname=self.host)
        if tls is None:
            raise OSError("the TLS handshake through the proxy did not complete")
        connection.connection_made(tls)
        return tls, connection

    def _release(self, connection: _Connection) -> None:
        if connection.reusable:
            connection.reused = True
            self._idle.append(connection)
        else:
            connection.abort()

    def _forget(self, connection: _Connection) -> None:
        self._open.discard(connection)


class WireResponse:
    """A response whose head has arrived: ``status``, ``headers``, then its body, read as
    events (:meth:`events`) or whole (:meth:`read`). :meth:`close` returns a fully read
    connection to the pool and closes any other (so the server aborts the request)."""

    def __init__(self, client: WireClient, connection: _Connection, sent: _Sent) -> None:
        self._client = client
        self._connection = connection
        self._sent = sent
        self.status = connection.status
        self.reason = connection.reason
        self.headers = connection.headers

    @property
    def request(self) -> Any:
        """The request as the SDK's errors carry it (an ``httpx.Request``)."""
        return self._sent.sdk()

    async def events(self) -> AsyncIterator[bytes]:
        """The ``data:`` payloads of the event stream, as they arrive."""
        connection = self._connection
        connection.as_events()
        events = connection.events
        while True:
            while events:
                yield events.popleft()
                if connection.paused and len(events) < PAUSE_AT // 2:
                    connection.resume()
            if connection.failure is not None:
                raise connection.failure
            if connection.complete:
                return
            await connection.more()

    async def read(self) -> bytes:
        """The whole body."""
        connection = self._connection
        while not connection.complete:
            if connection.failure is not None:
                raise connection.failure
            await connection.more()
        return bytes(connection.body)

    async def json(self) -> Any:
        return json.loads(await self.read())

    async def close(self) -> None:
        if self._connection.complete and self._connection.failure is None:
            self._client._release(self._connection)
        else:
            self._connection.abort()

    async def raise_status(self) -> typing.NoReturn:
        """Raise the SDK's error for this error status, with the server's body."""
        try:
            content = await self.read()
        except Exception:  # the body of an error is best effort
            content = b""
        finally:
            await self.close()
        response = _RESPONSE(
            self.status, headers=list(self.headers.items()), content=content, request=self.request
        )
        try:
            body: Any = json.loads(content)
        except ValueError:
            body = content.decode(errors="replace") or None
        data = body.get("error", body) if isinstance(body, dict) else body
        error = _STATUS_ERRORS.get(self.status)
        if error is None:
            error = openai.InternalServerError if self.status >= 500 else openai.APIStatusError
        raise error(f"Error code: {self.status} - {body}", response=response, body=data)


class _Sent:
    """What was asked, for the SDK's errors (whose request object is built only for them)."""

    def __init__(self, method: str, url: str) -> None:
        self.method = method
        self.url = url

    def sdk(self) -> Any:
        return _REQUEST(self.method, self.url)


class _StaleConnection(Exception):
    """A kept-alive connection the server had closed: the request goes on a new one."""


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: parses each response as its bytes arrive."""

    def __init__(self, client: WireClient) -> None:
        self.client = client
        self.loop = asyncio.get_running_loop()
        self.transport: Any = None
        self.reused = False
        self.closed = False
        self.paused = False
        self._buffer = bytearray()
        self._timer: asyncio.TimerHandle | None = None
        self.begin(client.read_timeout)

    # -- the reader's side -------------------------------------------------------------------

    def begin(self, read_timeout: float) -> None:
        """Expect a new response."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.read_timeout = read_timeout
        self.status = 0
        self.reason = ""
        self.headers: dict[str, str] = {}
        self.received = False  # any byte of this response
        self.complete = False
        self.failure: BaseException | None = None
        self.body = bytearray()
        self.events: deque[bytes] = deque()
        self._streaming = False
        self._framing = "head"  # head, chunk-size, chunk, chunk-end, trailer, length, close
        self._left = 0
        self._keep_alive = True
        self._waiter: asyncio.Future[None] | None = None
        self._last_data = self.loop.time()

    @property
    def reusable(self) -> bool:
        return not self.closed and self._keep_alive and self.transport is not None

    def as_events(self) -> None:
        """Read the body as server-sent events (what arrived already included)."""
        self._streaming = True
        self._split_events()

    async def head_arrived(self) -> None:
        while self._framing == "head":
            if self.failure is not None:
                raise self.failure
            await self.more()

    async def more(self) -> None:
        """Wait until something arrives (or fails), at most the read timeout apart."""
        if self.failure is not None or self.complete:
            return
        self._waiter = self.loop.create_future()
        if self._timer is None:
            self._timer = self.loop.call_at(self._last_data + self.read_timeout, self._watch)
        try:
            await self._waiter
        finally:
            self._waiter = None
        if self.failure is not None and not self.events:
            raise self.failure

    def _watch(self) -> None:
        """The read timeout: fails the response if nothing arrived for that long."""
        self._timer = None
        if self.complete or self.failure is not None:
            return
        due = self._last_data + self.read_timeout
        if self.loop.time() >= due:
            self._fail(ReadTimeout(f"nothing arrived for {self.read_timeout:g} s"))
        elif self._waiter is not None:
            self._timer = self.loop.call_at(due, self._watch)

    def resume(self) -> None:
        self.paused = False
        if self.transport is not None:
            self.transport.resume_reading()

    def abort(self) -> None:
        """Drop the connection at once. A FIN goes out first where the transport can send one,
        then the reset: vLLM's server (uvicorn) aborts a streaming request on the end of its
        input (46 of 46 measured, see docs/relay-core.md)."""
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.transport is not None:
            if self.transport.can_write_eof() and not self.transport.is_closing():
                with contextlib.suppress(OSError, RuntimeError):
                    self.transport.write_eof()
            self.transport.abort()
        self.client._forget(self)

    # -- the protocol's side -----------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._last_data = self.loop.time()
        self.received = True
        self._buffer += data
        try:
            self._parse()
        except (ValueError, IndexError) as broken:
            self._fail(RemoteProtocolError(f"the server broke HTTP/1.1: {broken}"))
            return
        if self._streaming and len(self.events) >= PAUSE_AT and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._framing == "close":
            self._finish()
        elif not self.complete:
            reason = "peer closed connection without sending complete message body"
            if self._framing == "head":
                reason = "server disconnected without sending a response"
            self._fail(RemoteProtocolError(f"{reason}: {exc}" if exc else reason))
        self.client._forget(self)
        self._wake()

    # -- parsing -----------------------------------------------------------------------------

    def _parse(self) -> None:
        buffer = self._buffer
        while buffer:
            framing = self._framing
            if framing == "head":
                end = buffer.find(b"\r\n\r\n")
                if end < 0:
                    return
                self._head(bytes(buffer[:end]).decode("latin-1"))
                del buffer[: end + 4]
            elif framing == "chunk-size":
                end = buffer.find(b"\r\n")
                if end < 0:
                    return
                size = int(bytes(buffer[:end]).split(b";", 1)[0], 16)
                del buffer[: end + 2]
                self._framing, self._left = ("chunk", size) if size else ("trailer", 0)
            elif framing in ("chunk", "length"):
                take = min(self._left, len(buffer))
                self._feed(bytes(buffer[:take]))
                del buffer[:take]
                self._left -= take
                if self._left == 0:
                    if framing == "length":
                        self._finish()
                        return
                    self._framing = "chunk-end"
            elif framing == "chunk-end":
                if len(buffer) < 2:
                    return
                del buffer[:2]
                self._framing = "chunk-size"
            elif framing == "trailer":
                end = buffer.find(b"\r\n")
                if end < 0:
                    return
                del buffer[: end + 2]
                if end == 0:
                    self._finish()
                    return
            elif framing == "close":
                self._feed(bytes(buffer))
                buffer.clear()
            else:  # "done": bytes after a complete response
                self._keep_alive = False
                buffer.clear()

    def _head(self, head: str) -> None:
        status_line, *lines = head.split("\r\n")
        _, status, *reason = status_line.split(" ", 2)
        self.status, self.reason = int(status), reason[0] if reason else ""
        for line in lines:
            name, _, value = line.partition(":")
            self.headers[name.strip().lower()] = value.strip()
        if self.status < 200:
            return  # an informational head (100 Continue): the real one follows
        headers = self.headers
        self._keep_alive = headers.get("connection", "").lower() != "close"
        if self.status in (204, 304):
            self._finish()  # no body, whatever the head says
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            self._framing = "chunk-size"
        elif "content-length" in headers:
            self._framing, self._left = "length", int(headers["content-length"])
            if self._left == 0:
                self._finish()
        else:
            self._framing, self._keep_alive = "close", False

    def _feed(self, data: bytes) -> None:
        self.body += data
        if self._streaming:
            self._split_events()

    def _split_events(self) -> None:
        body = self.body
        start = 0
        while (end := body.find(b"\n", start)) >= 0:
            line = body[start:end]
            if line.startswith(b"data:"):
                self.events.append(bytes(line[5:]).strip())
            start = end + 1
        if start:
            del body[:start]

    def _finish(self) -> None:
        self._framing = "done"
        if self._streaming and self.body:
            self.body += b"\n"
            self._split_events()
        self.complete = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fail(self, failure: BaseException) -> None:
        if self.failure is None and not self.complete:
            self.failure = failure
            self._keep_alive = False
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _TunnelOpening(asyncio.Protocol):
    """Reads the proxy's answer to ``CONNECT``: its status, once its head has arrived."""

    def __init__(self, opened: asyncio.Future[int]) -> None:
        self.opened = opened
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if b"\r\n\r\n" in self.buffer and not self.opened.done():
            self.opened.set_result(int(self.buffer.split(b" ", 2)[1]))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.opened.done():
            self.opened.set_exception(exc or OSError("the proxy closed the connection"))


class _Proxy:
    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
        self.host = parts.hostname or ""
        self.port = parts.port or 80
        self.authorization = ""
        if parts.username:
            password = urllib.parse.unquote(parts.password or "")
            user = f"{urllib.parse.unquote(parts.username)}:{password}".encode()
            self.authorization = "Basic " + base64.b64encode(user).decode()


def _proxy_for(url: urllib.parse.SplitResult) -> _Proxy | None:
    """The proxy the environment names for `url` (``HTTP_PROXY``/``HTTPS_PROXY``/
    ``ALL_PROXY``, unless ``NO_PROXY`` covers its host), or None."""
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(url.scheme) or proxies.get("all")
    bypass = urllib.request.proxy_bypass_environment  # type: ignore[attr-defined]
    if not proxy or bypass(url.hostname or "", proxies):
        return None
    return _Proxy(proxy)
