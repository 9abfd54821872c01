"""HTTP to one vLLM server, on aiohttp: the requests of every generation, and nothing taken for
vLLM's answer that is not one.

aiohttp parses HTTP (its C parser), keeps connections alive, speaks TLS, follows proxies
(``proxy=``, and ``HTTP_PROXY``/``HTTPS_PROXY``/``NO_PROXY`` with ``trust_env``: only HTTP
proxies, a ``socks5://`` one is refused, never taken for one), bounds
what a response head may hold, decompresses bodies, refuses header values with line breaks
and lets OpenTelemetry's aiohttp instrumentation see every request. This module adds what is
the relay's: the answer a request expects, checked before it is read, and failures as the
openai SDK's own errors, which the relay's retries and messages (and users' ``except
openai.APIError``) expect::

    client = HttpClient(EndpointConfig(base_url="http://127.0.0.1:8000/v1", model="m"))
    response = await client.request("POST", "/v1/completions", body, expect="events")
    async for data in response.events():   # each event's data (upstream.sse)
        ...
    await response.close()
    await client.aclose()

- An error status raises the SDK's ``APIStatusError`` subclass with the server's body; a
  redirect (3xx) raises ``APIStatusError`` too, never followed: a base URL that redirects is
  a base URL to change, and the error says to which.
- A 2xx that is not what the request expects (a stream that is not ``text/event-stream``, a
  body that is not JSON, a body that does not decode) raises ``APIResponseValidationError``
  naming the URL, the status and the content type: a gateway's login page is never read as
  an empty generation.
- No connection: ``APIConnectionError`` caused by the ``OSError`` (refused, host not found);
  no connection within ``connect_timeout``: ``APITimeoutError`` caused by
  :class:`ConnectTimeout`; nothing read for ``read_timeout``: ``APITimeoutError`` caused by
  :class:`ReadTimeout`.
- A request is written once per :meth:`HttpClient.request`: a connection closed before any
  answer (most often a kept-alive one the server closed while it was idle) raises
  ``APIConnectionError``, and the endpoint's retries (``max_retries``) decide whether it is
  written again; aiohttp repeats only idempotent methods itself.
- A server that requires a client certificate (mutual TLS) and got none it accepts refuses
  under TLS 1.3 only after the handshake, on the first read, often with no more than a reset
  or a close. That is ``APIConnectionError`` caused by :class:`ClientCertificateRefused`,
  not a connection closed before an answer: told by the TLS alert when one arrived, else by
  one more connection that sends no request and sees the server close it right after the
  handshake (:meth:`HttpClient.refuses_client_certificate`).
- An event stream makes progress only by events: bytes that complete none (comments,
  keep-alives) do not hold off ``read_timeout``.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import typing
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from typing import Any, Literal

import aiohttp
import openai
import yarl
from multidict import CIMultiDict, CIMultiDictProxy

from . import sse
from .config import EndpointConfig, load_ca, load_client_certificate
from .errors import RelayError
from .headers import HIDDEN, environment_proxy, shown_url

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
KEEPALIVE_SECONDS = 4.0
"""How long an idle connection is kept for the next request: under the 5 s after which vLLM's
server (uvicorn) closes one, so that a request rarely meets a connection closed under it."""
SHOWN_BODY = 200
"""Characters of an unexpected body quoted in an error."""
TURN_EVERY = 64
"""Events a stream hands on before the event loop gets a turn: a read of bytes already
received does not suspend, so a backlog (a reader that fell behind, a server that sent many
events at once) would otherwise be handed on in one callback, holding every other task of
the loop for as long as the reader takes over all of it (tens of milliseconds)."""
CERTIFICATE_LOOK_SECONDS = 1.0
"""How long :meth:`HttpClient.refuses_client_certificate` waits, past the TLS handshake, for
the server's session ticket (it took the connection) or its close (it wants a certificate):
either comes a round trip after the handshake."""
_CERTIFICATE_ALERTS = ("CERTIFICATE", "UNKNOWN_CA", "ACCESS_DENIED")
"""Words of the TLS alerts a server ends a connection with over the client's certificate
(``TLSV13_ALERT_CERTIFICATE_REQUIRED``, ``SSLV3_ALERT_BAD_CERTIFICATE``, ...)."""
MAX_BODY_BYTES = 32 * 2**20
"""Most bytes of a whole body read (JSON, or an error's), once decompressed: far above what
vLLM answers (``/tokenize`` of a million-token prompt is about 8 MB), far below what a small
compressed body can grow to (a 255 KiB gzip body is 256 MiB)."""

Expect = Literal["events", "json"]
_CONTENT_TYPES: dict[Expect, tuple[str, str]] = {
    "events": ("text/event-stream", "an event stream"),
    "json": ("application/json", "JSON"),
}


class ConnectTimeout(Exception):
    """No connection within the connect timeout (the cause of an ``APITimeoutError``)."""


class ReadTimeout(Exception):
    """Nothing arrived within the read timeout (the cause of an ``APITimeoutError``)."""


class IncompleteStream(RelayError):
    """An event stream that ended before it was whole: its body cut, or (a completion's)
    without a finish reason, or without ``[DONE]`` after it (the cause of a
    ``StreamInterrupted``, or of the ``APIConnectionError`` of a stream that ended before
    its first piece). The message names the URL and what was missing; ``lost`` says whether
    the connection was lost mid-body (a server that died, an outage) rather than a body
    that ended cleanly short of whole, or held what is not vLLM's (the server answered)."""

    def __init__(self, message: str, *, lost: bool) -> None:
        super().__init__(message)
        self.lost = lost


class ClosedBeforeAnswer(Exception):
    """The connection closed (or was reset) after the request was written and before the
    head of an answer: the cause of an ``APIConnectionError``. Often a kept-alive connection
    the server closed while it was idle, which a new connection mends at once."""


class ClientCertificateRefused(Exception):
    """The server ended the TLS connection after its handshake for want of a client
    certificate it accepts (mutual TLS): the cause of an ``APIConnectionError``. ``sent``
    says whether one was sent (``cert``); ``sign`` is what showed it: the TLS alert, or a
    close right after the handshake of a connection that sent nothing."""

    def __init__(self, *, sent: bool, sign: str) -> None:
        refused = "refused the client certificate" if sent else "wants a client certificate"
        super().__init__(f"the server {refused} ({sign})")
        self.sent = sent
        self.sign = sign


class HttpClient:
    """One endpoint's connections (one event loop's): an aiohttp session, made on the first
    request, or the endpoint's own ``session_factory``'s."""

    def __init__(self, config: EndpointConfig) -> None:
        self.config = config
        parts = urllib.parse.urlsplit(config.base_url)
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self._headers = _default_headers(config)
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=config.connect_timeout, sock_read=config.read_timeout
        )
        self._session: aiohttp.ClientSession | None = None
        self._proxy = config.proxy
        if self._proxy is None and config.trust_env and config.session_factory is None:
            self._proxy = environment_proxy(config.base_url)
        # TLS to the server or to an https:// proxy: its context is made with the first
        # session that needs one (:func:`_tls`)
        self._speaks_tls = parts.scheme == "https" or (self._proxy or "").startswith("https:")
        # whether the server's TLS is the relay's to look at (refuses_client_certificate)
        self._looks_at_tls = (
            parts.scheme == "https" and self._proxy is None and config.session_factory is None
        )

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        *,
        expect: Expect = "json",
    ) -> HttpResponse:
        """Send a request for `path` (``/v1/completions``); its response once its head has
        arrived and shows the answer the request expects (``events`` or ``json``). Close the
        response when done."""
        url = self.origin + path
        sent = _Sent(method, url)
        session = await self._session_now()  # a TLS setting that cannot be honoured raises here
        try:
            response = await self._send(session, method, url, body, headers)
        except (TimeoutError, aiohttp.ClientError, OSError) as failed:
            error, cause = _sdk_error(failed, sent.sdk(), self.config)
            if isinstance(cause, ClosedBeforeAnswer):
                refused = await self._certificate_refusal(failed)
                if refused is not None:
                    refused.__cause__ = failed
                    error = openai.APIConnectionError(message=str(refused), request=sent.sdk())
                    cause = refused
            raise error from cause
        checked = HttpResponse(response, sent, self.config.read_timeout)
        try:
            if response.status >= 300:
                await checked.raise_status()
            checked.check(expect)
        except BaseException:
            await checked.close()
            raise
        return checked

    async def aclose(self) -> None:
        """Close every connection (a response still open with it), and the session, which
        the relay made (or had ``session_factory`` make) for itself."""
        if self._session is not None:
            await self._session.close()

    async def refuses_client_certificate(self) -> bool:
        """Whether the server closes a TLS connection right after its handshake, as one that
        requires a client certificate does when it got none it accepts (TLS 1.3 says so only
        then): a connection of its own, with the endpoint's TLS (its ``cert``, if set), that
        sends nothing, and waits at most ``connect_timeout`` for the handshake and
        :data:`CERTIFICATE_LOOK_SECONDS` past it for what comes. Any other end (a session
        ticket, the server's first bytes, no connection, a handshake that fails, nothing at
        all) is False, as is a server behind a proxy or reached by a session of one's own::

            if await client.refuses_client_certificate():
                ...  # set cert, to a certificate the server accepts
        """
        url = yarl.URL(self.config.base_url)
        if not self._looks_at_tls or url.host is None:
            return False
        tls = await _tls(self.config)
        context = tls if isinstance(tls, ssl.SSLContext) else _unchecked_tls()
        try:
            return await _closed_after_handshake(
                context, url.host, url.port, self.config.connect_timeout
            )
        except (OSError, TimeoutError, ValueError):  # no connection, or no handshake
            return False

    async def _certificate_refusal(self, failed: BaseException) -> ClientCertificateRefused | None:
        """The refusal over the client certificate that ended `failed` (a connection closed
        before an answer), if it was one: by its TLS alert, or else by
        :meth:`refuses_client_certificate`."""
        sent = self.config.cert is not None
        alert = _certificate_alert(failed)
        if alert is not None:
            return ClientCertificateRefused(sent=sent, sign=alert)
        if not await self.refuses_client_certificate():
            return None
        return ClientCertificateRefused(
            sent=sent, sign="it closed the connection right after the TLS handshake"
        )

    async def _send(
        self,
        session: aiohttp.ClientSession,
        method: str,
        url: str,
        body: Any,
        headers: Mapping[str, str] | None,
    ) -> aiohttp.ClientResponse:
        options: dict[str, Any] = {
            "data": None if body is None else json.dumps(body, ensure_ascii=False).encode(),
            "headers": {**self._headers, **headers} if headers else self._headers,
            "allow_redirects": False,
        }
        if self.config.session_factory is not None:
            options["timeout"] = self._timeout  # the relay's own sessions have it already
        if self._proxy is not None:
            options["proxy"] = self._proxy
        # written once: a connection closed before an answer is the caller's to retry, as
        # one of its attempts (aiohttp cannot tell a kept-alive connection the server closed
        # while idle from a server that closed it on reading the request)
        return await session.request(method, url, **options)

    async def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            factory = self.config.session_factory
            tls = await _tls(self.config) if factory is None and self._speaks_tls else True
            if self._session is None or self._session.closed:  # none made while tls was
                self._session = factory() if factory is not None else _session(tls, self._timeout)
        return self._session


class HttpResponse:
    """A response whose head has arrived: ``status``, ``headers``, then its body, read as
    events (:meth:`events`) or whole (:meth:`json`). :meth:`close` keeps a fully read
    connection for the next request and closes any other (so the server aborts the
    request)."""

    def __init__(self, response: aiohttp.ClientResponse, sent: _Sent, read_timeout: float) -> None:
        self._response = response
        self._read_timeout = read_timeout
        self._sent = sent
        self.status = response.status
        self.headers = response.headers
        self.decoder = sse.EventDecoder()
        """The decoder of :meth:`events`; once they have ended, whether the body ended in
        the middle of an event (``cut``) and what it held that is not events (``stray()``)."""

    @property
    def request(self) -> Any:
        """The request as the SDK's errors carry it (made only for them)."""
        return self._sent.sdk()

    def check(self, expect: Expect) -> None:
        """Raise ``APIResponseValidationError`` unless the body is what `expect` names."""
        wanted, name = _CONTENT_TYPES[expect]
        if self._response.content_type != wanted:
            raise self._invalid(
                f"{self._sent.method} {self._sent.url} answered {self.status} with "
                f"{self._response.content_type or 'no content type'}, not {name}"
            )

    async def events(self) -> AsyncIterator[bytes]:
        """The data of each event of the stream, as they arrive; :class:`ReadTimeout` once
        no event has arrived for the read timeout (comments are not events). They end with
        the body, whole or cut (:attr:`decoder` tells)."""
        decoder, content = self.decoder, self._response.content
        connection = self._response.connection
        if connection is not None and connection.protocol is not None:
            connection.protocol.read_timeout = None  # the stream's is _QuietStream:
            connection.protocol.start_timeout()  # this drops aiohttp's timer
        sent = f"{self._sent.method} {self._sent.url}"
        quiet = _QuietStream(content, decoder, self._read_timeout, sent)
        cut: aiohttp.ClientPayloadError | sse.EventTooLarge | None = None
        read = 0  # events handed on since the loop last had a turn here
        try:
            while chunk := await content.readany():
                batch = decoder.feed(chunk)
                if len(batch) > TURN_EVERY:  # a backlog read at once: a turn every slice
                    for start in range(0, len(batch), TURN_EVERY):
                        for data in batch[start : start + TURN_EVERY]:
                            yield data
                        await asyncio.sleep(0)
                    continue
                for data in batch:
                    yield data
                read += len(batch)
                if read >= TURN_EVERY:
                    read = 0
                    await asyncio.sleep(0)
        except TimeoutError as stalled:  # aiohttp's, should a session of one's own set one
            raise ReadTimeout(
                f"no event from {sent} for read_timeout={self._read_timeout:g} s"
            ) from stalled
        except aiohttp.ClientPayloadError as payload:  # a chunked or sized body cut short
            cut = payload
        except sse.EventTooLarge as large:
            cut = large
        finally:
            quiet.close()
        if isinstance(cut, sse.EventTooLarge):  # raised out of the except clause: the
            # innermost cause, that explanations of a failure read, is this, naming the URL
            raise IncompleteStream(f"the event stream from {sent} {cut}", lost=False)
        if cut is not None:
            raise IncompleteStream(f"the event stream from {sent} was cut: {cut}", lost=True)

    async def json(self) -> Any:
        """The whole body, decoded: whole within ``read_timeout`` (a body that keeps
        trickling never ends otherwise, each read being in time)."""
        try:
            raw = await self._whole_body()
        except TimeoutError:
            raise openai.APITimeoutError(request=self.request) from ReadTimeout(
                f"the body of {self._sent.method} {self._sent.url} was not whole within "
                f"read_timeout={self._read_timeout:g} s"
            )
        except aiohttp.ClientError as failed:
            raise openai.APIConnectionError(message=str(failed), request=self.request) from failed
        if raw is None:
            raise self._invalid(
                f"{self._sent.method} {self._sent.url} answered {self.status} with a body of "
                f"more than {MAX_BODY_BYTES // 2**20} MiB"
                + _encoded(self._response)
                + ", which is not an answer of vLLM's: the rest was not read"
            )
        try:
            return json.loads(raw)
        except ValueError:  # also a body that is not UTF-8
            raise self._invalid(
                f"{self._sent.method} {self._sent.url} answered {self.status} with a "
                f"body that is not JSON: {shown(raw)}"
            ) from None

    async def _whole_body(self) -> bytes | None:
        """The body (None past :data:`MAX_BODY_BYTES`), within ``read_timeout`` in all."""
        async with asyncio.timeout(self._read_timeout):
            return await _read_at_most(self._response, MAX_BODY_BYTES)

    async def close(self) -> None:
        if self._response.content.at_eof():
            self._response.release()
        else:
            self._response.close()

    async def raise_status(self) -> typing.NoReturn:
        """Raise the SDK's error for this status (an error, or a redirect), with the body."""
        try:
            content = await self._whole_body() or b""
        except Exception:  # the body of an error is best effort (and a bounded one)
            content = b""
        try:
            body: Any = json.loads(content)
        except ValueError:
            body = content.decode(errors="replace") or None
        raise self.status_error(self.status, content, body, f"Error code: {self.status} - {body}")

    def status_error(
        self, status: int, content: bytes, body: Any, message: str
    ) -> openai.APIStatusError:
        """The SDK's error for `status` (its class: ``BadRequestError`` for 400, ...), with
        the body as the server sent it (`content`) and decoded (`body`)."""
        response = _RESPONSE(
            status, headers=list(self.headers.items()), content=content, request=self.request
        )
        data = body.get("error", body) if isinstance(body, dict) else body
        error = _STATUS_ERRORS.get(status)
        if error is None:
            error = openai.InternalServerError if status >= 500 else openai.APIStatusError
        return error(message, response=response, body=data)

    def _invalid(self, message: str) -> openai.APIResponseValidationError:
        response = _RESPONSE(self.status, headers=list(self.headers.items()), request=self.request)
        return openai.APIResponseValidationError(response, None, message=message)


class _QuietStream:
    """Fails a stream's reads with :class:`ReadTimeout` once no event has arrived for
    `seconds` (within a quarter more). aiohttp's own read timeout makes and cancels a timer
    for every chunk that arrives, which at thousands of streamed tokens a second is a tenth
    of the relay's CPU (docs/benchmarks.md); this one looks every quarter of the timeout at
    whether bytes of events arrived: the bytes received (whoever reads them and when: a
    reader behind is not a quiet server) less those the decoder found completed no event
    (comments, keep-alives), which it counts only off its fast path of one event a chunk."""

    def __init__(
        self, content: aiohttp.StreamReader, decoder: sse.EventDecoder, seconds: float, sent: str
    ) -> None:
        self._content = content
        self._decoder = decoder
        self._seconds = seconds
        self._sent = sent
        self._loop = asyncio.get_running_loop()
        self._seen, self._since = self._progress(), self._loop.time()
        self._handle = self._loop.call_later(seconds / 4, self._look)

    def _progress(self) -> int:
        return self._content.total_bytes - self._decoder.idle_bytes

    def _look(self) -> None:
        if self._content.is_eof():  # the whole body has arrived: nothing more to wait for
            return
        now, seen = self._loop.time(), self._progress()
        # more than last time: the bytes of a comment not yet read count until it is read,
        # so the count may fall back; only a rise past the last look is news of an event
        progressed, self._seen = seen > self._seen, seen
        if progressed:
            self._since = now
        elif now - self._since >= self._seconds:
            failure = ReadTimeout(
                f"no event from {self._sent} for read_timeout={self._seconds:g} s"
            )
            self._content.set_exception(failure)
            return
        self._handle = self._loop.call_later(self._seconds / 4, self._look)

    def close(self) -> None:
        self._handle.cancel()


class _Sent:
    """What was asked, for the SDK's errors, whose request object is made only for them."""

    def __init__(self, method: str, url: str) -> None:
        self.method = method
        self.url = url

    def sdk(self) -> Any:
        return sdk_request(self.method, self.url)


def sdk_request(method: str, url: str) -> Any:
    """A request object of the class the openai SDK's errors carry."""
    return _REQUEST(method, url)


def _session(tls: ssl.SSLContext | bool, timeout: aiohttp.ClientTimeout) -> aiohttp.ClientSession:
    """The endpoint's session: no cookies (a cookie-affinity router would pin every later
    generation of the process to the replica that set one; the session header routes
    instead), idle connections kept :data:`KEEPALIVE_SECONDS`, the endpoint's slots as the
    only limit on connections, `tls` for the server and an ``https://`` proxy."""
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_SECONDS, ssl=tls)
    # trust_env is applied in HttpClient (environment_proxy), which refuses what aiohttp would
    # ignore (an https:// proxy: a direct connection) or misread (a socks5:// one)
    return aiohttp.ClientSession(
        connector=connector, cookie_jar=aiohttp.DummyCookieJar(), timeout=timeout
    )


def _default_headers(config: EndpointConfig) -> dict[str, str]:
    headers = {"user-agent": "relay-integrations", "content-type": "application/json"}
    if config.api_key is not None:
        headers["authorization"] = f"Bearer {config.api_key.get_secret_value()}"
    return {**headers, **config.extra_headers}


_TLS_CONTEXTS: dict[tuple[Any, ...], ssl.SSLContext] = {}
"""TLS contexts by what they are made of; one of each per process: aiohttp pools connections
by their context, and making one reads and parses every certificate of the system's store
(tens of milliseconds of CPU)."""


async def _tls(config: EndpointConfig) -> ssl.SSLContext | bool:
    """The TLS of ``https://`` requests (:func:`_tls_context`), made on a worker thread the
    first time, so that the event loop is not held while the certificates are parsed."""
    if config.verify is False and config.cert is None:
        return False
    made_of = (
        config.verify,
        config.cert,
        os.environ.get("SSL_CERT_FILE"),
        os.environ.get("SSL_CERT_DIR"),
    )
    context = _TLS_CONTEXTS.get(made_of)
    if context is None:
        context = _TLS_CONTEXTS.setdefault(made_of, await asyncio.to_thread(_tls_context, config))
    return context


def _tls_context(config: EndpointConfig) -> ssl.SSLContext:
    """The TLS of ``https://`` requests: the system's certificates (``SSL_CERT_FILE`` and
    ``SSL_CERT_DIR`` too), or ``verify``'s CA bundle or directory, or none checked
    (``verify=False``); ``cert`` as the client certificate (both checked as the configuration
    was: a file changed since is a ``ValueError`` saying what is wrong with it)."""
    if config.verify is False:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif isinstance(config.verify, str):
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # checks, trusting no CA yet
        load_ca(context, config.verify)
    else:
        context = ssl.create_default_context()
    if config.cert is not None:
        load_client_certificate(context, config.cert)
    return context


def _unchecked_tls() -> ssl.SSLContext:
    """TLS that checks no certificate (``verify=False``), without the system's store."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def _certificate_alert(failed: BaseException) -> str | None:
    """The TLS alert over the client's certificate under `failed`, in words
    (``tlsv13 alert certificate required``), if one ended its connection."""
    error: BaseException | None = failed
    seen: list[BaseException] = []
    while error is not None and error not in seen:
        reason = getattr(error, "reason", None) if isinstance(error, ssl.SSLError) else None
        if reason and "ALERT" in reason and any(word in reason for word in _CERTIFICATE_ALERTS):
            return str(reason).replace("_", " ").lower()
        seen.append(error)
        error = error.__cause__ or error.__context__
    return None


async def _closed_after_handshake(
    context: ssl.SSLContext, host: str, port: int | None, connect_timeout: float
) -> bool:
    """Whether the server at `host`:`port` closes a TLS 1.3 connection right after its
    handshake, which the client does with `context` (within `connect_timeout`, as the
    connection) and then sends nothing: a close, a reset or a certificate alert before any
    session ticket or byte of data. TLS is done here in memory, not by the stream, so that a
    session ticket, which a server sends once it took the connection, is seen as it arrives."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    session = context.wrap_bio(incoming, outgoing, server_hostname=host)
    handshaken = False
    async with asyncio.timeout(connect_timeout) as bound:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while True:
                try:
                    if not handshaken:
                        session.do_handshake()
                        handshaken = True
                        if session.version() != "TLSv1.3":  # earlier ones refuse in it
                            return False
                        bound.reschedule(
                            asyncio.get_running_loop().time() + CERTIFICATE_LOOK_SECONDS
                        )
                    session.read(1)
                    return False  # data: the server speaks first, and took the connection
                except ssl.SSLWantReadError:
                    if handshaken and session.session is not None and session.session.has_ticket:
                        return False
                except (ssl.SSLEOFError, ssl.SSLZeroReturnError):
                    return handshaken
                except ssl.SSLError as refused:
                    return handshaken and _certificate_alert(refused) is not None
                writer.write(outgoing.read())
                try:
                    received = await reader.read(65536)
                except ConnectionResetError:
                    return handshaken
                if received:
                    incoming.write(received)
                else:
                    incoming.write_eof()
        finally:
            writer.close()


def _sdk_error(
    failed: BaseException, sent: Any, config: EndpointConfig
) -> tuple[openai.APIError, BaseException]:
    """A failure before the response head as the SDK's error, and the cause to raise it from
    (what :mod:`._failures` reads to say why)."""
    _forget_secrets(failed)
    if isinstance(failed, aiohttp.ClientConnectorError):  # no connection was made
        return openai.APIConnectionError(message=_said(failed), request=sent), failed
    cause: BaseException
    if isinstance(failed, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError):
        cause = ClosedBeforeAnswer(f"the server closed the connection before answering: {failed}")
        error: openai.APIError = openai.APIConnectionError(message=str(cause), request=sent)
    elif isinstance(failed, aiohttp.ConnectionTimeoutError):
        cause = ConnectTimeout(f"no connection within connect_timeout={config.connect_timeout:g} s")
        error = openai.APITimeoutError(request=sent)
    elif isinstance(failed, TimeoutError):
        cause = ReadTimeout(f"nothing arrived for read_timeout={config.read_timeout:g} s")
        error = openai.APITimeoutError(request=sent)
    else:
        return openai.APIConnectionError(message=_said(failed), request=sent), failed
    cause.__cause__ = failed
    return error, cause


async def _read_at_most(response: aiohttp.ClientResponse, limit: int) -> bytes | None:
    """The body of `response`, decompressed, or None as soon as it is past `limit` bytes
    (aiohttp's ``read()`` has no bound, and decompresses whatever arrives)."""
    body = bytearray()
    async for chunk in response.content.iter_chunked(2**16):
        body += chunk
        if len(body) > limit:
            return None
        if len(body) % 2**20 < len(chunk):
            # a compressed body is decompressed as it is read, without a wait for the
            # network: a few MiB would hold the event loop in one go
            await asyncio.sleep(0)
    return bytes(body)


def _encoded(response: aiohttp.ClientResponse) -> str:
    encoding = response.headers.get("content-encoding")
    return f" once decompressed ({encoding})" if encoding else ""


def _forget_secrets(failed: BaseException) -> None:
    """Take out of aiohttp's error what it keeps of the request's secrets, since the error is
    chained under the SDK's and shown with it (``repr``; a traceback shows ``str``): the
    request's header values (the key) and a proxy URL's password. Its class, status and
    message stay: they say what went wrong (:mod:`._failures` reads them)."""
    if isinstance(failed, aiohttp.ClientResponseError):
        info = failed.request_info
        failed.request_info = aiohttp.RequestInfo(
            yarl.URL(shown_url(str(info.url))),
            info.method,
            CIMultiDictProxy(CIMultiDict((name, HIDDEN) for name in info.headers)),
            yarl.URL(shown_url(str(info.real_url))),
        )
        failed.args = (failed.request_info, failed.history)
    elif isinstance(failed, aiohttp.ClientConnectorError):
        failed.args = (failed.os_error,)  # not its connection key: the proxy URL is in it


def _said(failed: BaseException) -> str:
    if isinstance(failed, aiohttp.ClientConnectorError):
        return str(failed.os_error) or type(failed.os_error).__name__
    if isinstance(failed, aiohttp.ClientHttpProxyError):  # the proxy's answer to CONNECT
        return f"the proxy refused the tunnel: {failed.status} {failed.message}"
    if isinstance(failed, aiohttp.ClientResponseError):  # a head aiohttp could not parse
        return f"the server's response broke HTTP: {failed.message[:SHOWN_BODY]}"
    return str(failed) or type(failed).__name__


def shown(raw: bytes) -> str:
    """The start of `raw`, quoted in an error."""
    text = raw[:SHOWN_BODY].decode(errors="replace")
    return repr(text) + ("..." if len(raw) > SHOWN_BODY else "")
