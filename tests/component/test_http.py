"""The relay's HTTP client (aiohttp, and the relay's checks on it) against raw servers that send
exactly the bytes each test needs: events split anywhere and in every line-end style, kept-alive
connections the server closed, stalls, error statuses, redirects and pages that are not
vLLM's, compressed bodies, an endless header, IPv6, header values that must not be sent,
proxies (plain, through the environment, authenticating CONNECT tunnels, TLS to the proxy,
SOCKS and malformed ones refused), TLS with a CA made here (verify by path, mutual TLS) and
idle connections that expire."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import json
import socket
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from relay_integrations.relay import EndpointError, RelayConfig, RelaySwitcher
from relay_integrations.upstream import InvalidProxyError, _http
from relay_integrations.upstream._http import HttpClient, ReadTimeout
from relay_integrations.upstream.config import EndpointConfig
from relay_integrations.upstream.endpoint import Endpoint, UpstreamFailure
from relay_integrations.upstream.errors import RelayError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def serving(
    handler: Handler, tls: ssl.SSLContext | None = None, host: str = "127.0.0.1"
) -> AsyncIterator[str]:
    """A raw server on a loopback port; yields its origin (``http://127.0.0.1:PORT``)."""
    connections: list[asyncio.StreamWriter] = []

    async def tracked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            await handler(reader, writer)

    server = await asyncio.start_server(tracked, host, 0, ssl=tls)
    port = server.sockets[0].getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    try:
        yield f"{'https' if tls else 'http'}://{shown}:{port}"
    finally:
        server.close()
        for writer in connections:
            writer.close()


async def read_request(reader: asyncio.StreamReader) -> tuple[str, dict[str, str], bytes]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode()
    line, *header_lines = head.strip().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return line, headers, body


def answering(response: bytes) -> Handler:
    """A server that answers one request with `response`, byte for byte."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(response)
        await writer.drain()

    return handler


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


EVENTS = chunked(b'data: {"a": 1}\n\n', b'data: {"a": 2}\n\ndata: [DO', b"NE]\n\n")
STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)
JSON_OK = (
    b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 12\r\n\r\n{"ok": true}'
)


def client(origin: str, **fields: Any) -> HttpClient:
    settings: dict[str, Any] = {"api_key": "k", "connect_timeout": 2.0, "read_timeout": 5.0}
    return HttpClient(EndpointConfig(base_url=origin + "/v1", model="m", **(settings | fields)))


async def events_of(http: HttpClient) -> list[bytes]:
    response = await http.request("POST", "/v1/completions", {"prompt": "Hi"}, expect="events")
    try:
        return [data async for data in response.events()]
    finally:
        await response.close()


# --- the event stream -------------------------------------------------------------------------


async def test_events_split_at_every_byte_arrive_whole_and_the_connection_is_kept() -> None:
    peers: list[object] = []
    seen: list[tuple[str, dict[str, str], bytes]] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peers.append(writer.get_extra_info("peername"))
        for _ in range(2):
            seen.append(await read_request(reader))
            for byte in STREAM_HEAD + EVENTS:
                writer.write(bytes([byte]))
                await writer.drain()

    async with serving(handler) as origin:
        http = client(origin)
        for _ in range(2):
            assert await events_of(http) == [b'{"a": 1}', b'{"a": 2}', b"[DONE]"]
        await http.aclose()
    assert len(peers) == 1  # the second request went on the kept-alive connection
    line, headers, body = seen[0]
    assert line == "POST /v1/completions HTTP/1.1"
    assert headers["authorization"] == "Bearer k"
    assert json.loads(body) == {"prompt": "Hi"}


@pytest.mark.parametrize(
    ("stream", "expected"),
    [
        (b"data: first\ndata: second\n\n", [b"first\nsecond"]),
        (b"data: a\r\rdata: b\r\r", [b"a", b"b"]),
        (b"data: a\r\n\r\ndata:b\r\n\r\n", [b"a", b"b"]),
        (b": a comment\nevent: x\nid: 1\nretry: 5\ndata: a\n\n", [b"a"]),
        (b"data\n\ndata:  two spaces\n\n", [b"", b" two spaces"]),
        (b"data: complete\n\ndata: cut at the end", [b"complete"]),
    ],
    ids=["multi-line data", "CR only", "CRLF", "other fields", "empty and spaced", "cut event"],
)
@pytest.mark.parametrize("split", ["whole", "every byte"])
async def test_events_are_decoded_as_the_standard_says(
    stream: bytes, expected: list[bytes], split: str
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        parts = [stream] if split == "whole" else [bytes([b]) for b in stream]
        writer.write(STREAM_HEAD + chunked(*parts))
        await writer.drain()

    async with serving(handler) as origin:
        http = client(origin)
        assert await events_of(http) == expected
        await http.aclose()


async def test_a_reader_far_behind_gets_every_event() -> None:
    events = [b'data: {"n": %d}\n\n' % i for i in range(3000)]

    async with serving(answering(STREAM_HEAD + chunked(*events))) as origin:
        http = client(origin)
        response = await http.request("POST", "/v1/completions", {}, expect="events")
        await asyncio.sleep(0.1)  # everything has arrived, unread
        received = [json.loads(event)["n"] async for event in response.events()]
        await response.close()
        await http.aclose()
    assert received == list(range(3000))


# --- connections --------------------------------------------------------------------------------


async def test_an_idle_connection_is_closed_after_the_keep_alive_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_http, "KEEPALIVE_SECONDS", 0.3)
    closed = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(JSON_OK)
        await writer.drain()
        assert await reader.read() == b""  # the client closed it
        closed.set()

    async with serving(handler) as origin:
        http = client(origin)
        response = await http.request("GET", "/v1/models")
        await response.json()
        await response.close()
        await asyncio.wait_for(closed.wait(), timeout=5)  # idle: closed, though not aclose()d
        await http.aclose()


async def test_a_server_that_stops_sending_is_a_timeout_after_read_timeout() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(STREAM_HEAD + b"%x\r\ndata: 1\n\n\r\n" % len(b"data: 1\n\n"))
        await writer.drain()
        await asyncio.sleep(10)

    async with serving(handler) as origin:
        http = client(origin, read_timeout=0.3)
        response = await http.request("POST", "/v1/completions", {}, expect="events")
        started = time.monotonic()
        with pytest.raises(ReadTimeout):
            _ = [event async for event in response.events()]
        assert time.monotonic() - started < 2
        await response.close()
        await http.aclose()


async def test_a_refused_connection_is_the_sdks_connection_error_caused_by_it() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    http = client(f"http://127.0.0.1:{port}")
    with pytest.raises(openai.APIConnectionError) as raised:
        await http.request("GET", "/v1/models")
    chain, link = [], raised.value.__cause__
    while link is not None:
        chain.append(link)
        link = link.__cause__
    assert any(isinstance(error, ConnectionRefusedError) for error in chain)
    await http.aclose()


async def test_ipv6_loopback_is_reached_with_its_host_in_brackets() -> None:
    seen: list[dict[str, str]] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append((await read_request(reader))[1])
        writer.write(JSON_OK)
        await writer.drain()

    async with serving(handler, host="::1") as origin:
        http = client(origin)
        response = await http.request("GET", "/v1/models")
        assert await response.json() == {"ok": True}
        await response.close()
        await http.aclose()
    assert seen[0]["host"] == origin.removeprefix("http://")


# --- answers that are not vLLM's ----------------------------------------------------------------


async def test_an_error_status_is_the_sdks_error_with_the_servers_message() -> None:
    body = b'{"error": {"message": "model not found"}}'
    not_found = b"HTTP/1.1 404 Not Found\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    async with serving(answering(not_found)) as origin:
        http = client(origin)
        with pytest.raises(openai.NotFoundError) as raised:
            await http.request("POST", "/v1/completions", {}, expect="events")
        assert raised.value.body == {"message": "model not found"}
        await http.aclose()


@pytest.mark.parametrize("status", [301, 302, 307, 308])
async def test_a_redirect_is_not_followed_and_names_the_url_to_use(status: int) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line, _, _ = await read_request(reader)
        path = line.split(" ")[1]
        writer.write(
            b"HTTP/1.1 %d Moved\r\nlocation: http://elsewhere:8443%s\r\ncontent-length: 0\r\n\r\n"
            % (status, path.encode())
        )
        await writer.drain()

    async with serving(handler) as origin:
        config = EndpointConfig(base_url=origin + "/v1", model="m", max_retries=0)
        endpoint = Endpoint(config, "large")
        with pytest.raises(UpstreamFailure) as raised:
            await endpoint.model_info()
        await endpoint.aclose()
    assert isinstance(raised.value.cause, openai.APIStatusError)
    assert f"answered {status}" in raised.value.detail
    assert "use base_url='http://elsewhere:8443/v1'" in raised.value.detail


HTML = b"<html><body>Sign in to continue</body></html>"
HTML_PAGE = b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: %d\r\n\r\n%s" % (
    len(HTML),
    HTML,
)


@pytest.mark.parametrize("expect", ["json", "events"])
async def test_a_page_that_is_not_vllms_answer_is_an_error_naming_url_status_and_type(
    expect: Any,
) -> None:
    async with serving(answering(HTML_PAGE)) as origin:
        http = client(origin)
        with pytest.raises(openai.APIResponseValidationError) as raised:
            await http.request("POST", "/v1/completions", {}, expect=expect)
        await http.aclose()
    assert f"{origin}/v1/completions answered 200 with text/html" in raised.value.message


async def test_a_whole_generation_against_a_login_page_fails_and_writes_nothing() -> None:
    """The relay's first request (GET /v1/models) gets the page: an error that says what is
    wrong, never a generation that 'stopped' with no text."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(HTML_PAGE)
            await writer.drain()

    async with serving(handler) as origin:
        endpoint = EndpointConfig(base_url=origin + "/v1", model="m")
        config = RelayConfig(large=endpoint, small=endpoint, cues=["Now"])
        async with RelaySwitcher(config) as relay:
            with pytest.raises(EndpointError) as raised:
                await relay.generate([{"role": "user", "content": "Hi"}])
    assert "answered 200 with text/html, not JSON" in str(raised.value)
    assert "not the answer of vLLM's OpenAI API" in str(raised.value)


async def test_a_streamed_completion_answered_with_json_is_refused() -> None:
    async with serving(answering(JSON_OK)) as origin:
        http = client(origin)
        with pytest.raises(openai.APIResponseValidationError, match="not an event stream"):
            await http.request("POST", "/v1/completions", {}, expect="events")
        await http.aclose()


async def test_gzip_encoded_json_is_decoded() -> None:
    body = gzip.compress(b'{"data": [{"id": "m"}]}')

    compressed = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )
    async with serving(answering(compressed)) as origin:
        http = client(origin)
        response = await http.request("GET", "/v1/models")
        assert await response.json() == {"data": [{"id": "m"}]}
        await response.close()
        await http.aclose()


async def test_a_body_that_does_not_decode_is_an_error_not_a_crash() -> None:
    body = b"\xff\xfe not json"
    undecodable = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
        % (len(body), body)
    )
    async with serving(answering(undecodable)) as origin:
        http = client(origin)
        response = await http.request("GET", "/v1/models")
        with pytest.raises(openai.APIResponseValidationError, match="a body that is not JSON"):
            await response.json()
        await response.close()
        await http.aclose()


async def test_an_endless_header_is_refused_early_without_holding_it() -> None:
    sent = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nx-endless: ")
        while sent < 64 * 2**20:
            writer.write(b"a" * 65536)
            sent += 65536
            await writer.drain()

    async with serving(handler) as origin:
        http = client(origin, read_timeout=30, max_retries=0)
        started = time.monotonic()
        with pytest.raises(openai.APIConnectionError, match="response broke HTTP: Got more than"):
            await http.request("GET", "/v1/models")
        assert time.monotonic() - started < 5  # not at the read timeout
        await http.aclose()
    assert sent < 16 * 2**20  # the client stopped reading long before the 64 MiB


# --- what must not be sent ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"api_key": "sk-1\n"}, "api_key: the value ends with a line break"),
        ({"extra_headers": {"x-team": "a\r\nx-admin: 1"}}, r"holds the control character"),
        ({"extra_headers": {"x team": "a"}}, "is not a header name"),
    ],
)
def test_header_values_with_line_breaks_are_refused_when_configured(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message) as raised:
        EndpointConfig(base_url="http://127.0.0.1:1/v1", model="m", **fields)
    assert "sk-1" not in str(raised.value)  # a key is not repeated


async def test_a_generation_id_with_a_line_break_is_refused_before_any_byte() -> None:
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1

    async with serving(handler) as origin:
        endpoint = EndpointConfig(base_url=origin + "/v1", model="m")
        config = RelayConfig(large=endpoint, small=endpoint, cues=["Now"])
        async with RelaySwitcher(config) as relay:
            with pytest.raises(ValueError, match="generation_id"):
                await relay.generate([{"role": "user", "content": "Hi"}], generation_id="a\r\nb")
    assert connections == 0


# --- proxies ------------------------------------------------------------------------------------


def tunnel_proxy(log: list[str], authorization: str | None = None) -> Handler:
    """An HTTP proxy: absolute-URL requests forwarded, CONNECT tunnels opened; with
    `authorization`, 407 to whoever does not send it."""

    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line, headers, body = await read_request(reader)
        log.append(line)
        if authorization is not None and headers.get("proxy-authorization") != authorization:
            writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\ncontent-length: 0\r\n\r\n")
            await writer.drain()
            return
        method, target, version = line.split(" ")
        if method == "CONNECT":
            host, port = target.rsplit(":", 1)
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")

            async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()

            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
            return
        host, port = target.split("/")[2].split(":")
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        path = "/" + target.split("/", 3)[3]
        up_writer.write(
            f"{method} {path} {version}\r\ncontent-length: {len(body)}\r\n\r\n".encode()
        )
        up_writer.write(body)
        writer.write(await up_reader.read(100000))
        await writer.drain()

    return proxy


json_server = answering(JSON_OK)


@pytest.fixture
def no_proxies(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    return monkeypatch


async def models(http: HttpClient) -> Any:
    response = await http.request("GET", "/v1/models")
    try:
        return await response.json()
    finally:
        await response.close()


async def test_requests_go_through_the_http_proxy_of_the_environment_unless_no_proxy(
    no_proxies: pytest.MonkeyPatch,
) -> None:
    log: list[str] = []
    async with serving(json_server) as origin, serving(tunnel_proxy(log)) as proxy_origin:
        no_proxies.setenv("HTTP_PROXY", proxy_origin)
        http = client(origin)
        assert await models(http) == {"ok": True}
        await http.aclose()
        no_proxies.setenv("NO_PROXY", "127.0.0.1")
        bypassing = client(origin)
        assert await models(bypassing) == {"ok": True}
        await bypassing.aclose()
        no_proxies.delenv("NO_PROXY")
        ignoring = client(origin, trust_env=False)
        assert await models(ignoring) == {"ok": True}
        await ignoring.aclose()
    assert log == [f"GET {origin}/v1/models HTTP/1.1"]  # the first only


@pytest.mark.parametrize("where", ["proxy", "HTTPS_PROXY", "ALL_PROXY"])
def test_a_socks_proxy_is_refused_with_what_to_use(
    no_proxies: pytest.MonkeyPatch, where: str
) -> None:
    if where == "proxy":
        with pytest.raises(ValueError, match=r"SOCKS proxy.*session_factory"):
            EndpointConfig(base_url="https://gpu:8000/v1", model="m", proxy="socks5://p:1080")
        return
    no_proxies.setenv(where, "socks5h://p:1080")
    config = EndpointConfig(base_url="https://gpu:8000/v1", model="m")
    with pytest.raises(InvalidProxyError, match=f"the environment's {where}.*SOCKS proxy"):
        HttpClient(config)


BAD_PROXIES = {
    "no-host": ("http://:8080", "is not a proxy URL the HTTP client reads (a host"),
    "a-port-not-a-number": ("http://proxy:port-not-a-number", "a port that is a number"),
    "no-scheme-it-speaks": ("ht!tp://x", "is not an http:// or https:// proxy URL"),
    "a-space": ("http://proxy host:3128", "holds a space at position 12"),
    "a-line-break": ("http://proxy:3128\n", "U+000A (a line break) at position 17"),
    "a-control-character": ("http://pro\x01xy:3128", "the control character U+0001"),
    "credentials-and-no-host": ("http://relay:s3cret-pw@", "is not a proxy URL"),
    "no-host-after-credentials": ("http://relay:s3cret-pw@:3128", "is not a proxy URL"),
    "a-password-not-percent-encoded": ("http://relay:s3cr#t/pw@proxy:3128", "percent-encoded"),
    "a-space-in-the-password": ("http://relay:s3cret pw@proxy:3128", "a space in its user info"),
    "a-bracket-never-closed": ("http://[::1:3128", "is not a proxy URL"),
}


@pytest.mark.parametrize("where", ["HTTP_PROXY", "https_proxy", "ALL_PROXY"])
@pytest.mark.parametrize(("value", "said"), BAD_PROXIES.values(), ids=list(BAD_PROXIES))
def test_a_malformed_proxy_of_the_environment_is_refused_naming_it_and_the_fix(
    no_proxies: pytest.MonkeyPatch, where: str, value: str, said: str
) -> None:
    """Refused when the endpoint is made (nothing sent: a setting to fix, not a server that
    is out), as the relay's own error, never a password in it."""
    no_proxies.setenv(where, value)
    scheme = "http" if where == "HTTP_PROXY" else "https"
    config = EndpointConfig(base_url=f"{scheme}://gpu:8000/v1", model="m")
    with pytest.raises(InvalidProxyError) as refused:
        Endpoint(config, "large")
    error = refused.value
    assert isinstance(error, RelayError) and isinstance(error, ValueError)
    message = str(error)
    assert message.startswith(f"the environment's {where}: ") and said in message
    assert f"unset {where}, or set trust_env=False" in message
    assert "s3cr" not in message and "s3cr" not in repr(error)
    assert "relay:**********@" in message or "@" not in value
    Endpoint(config.model_copy(update={"trust_env": False}), "large")  # not taken: no error


def test_a_malformed_proxy_of_the_environment_stops_the_relay_before_any_request(
    no_proxies: pytest.MonkeyPatch,
) -> None:
    no_proxies.setenv("HTTPS_PROXY", "http://relay:s3cret@proxy:port")
    endpoint = EndpointConfig(base_url="https://gpu:8000/v1", model="m")
    with pytest.raises(InvalidProxyError, match=r"HTTPS_PROXY: 'http://relay:\*+@proxy:port'"):
        RelaySwitcher(RelayConfig(large=endpoint, small=endpoint, cues=["Now"]))


def test_a_malformed_proxy_setting_names_the_fix_and_hides_the_password() -> None:
    with pytest.raises(ValueError, match=r"proxy: 'http://relay:\*+@proxy:3128'") as refused:
        EndpointConfig(
            base_url="https://gpu:8000/v1", model="m", proxy="http://relay:s3cr#t@proxy:3128"
        )
    assert "s3cr" not in str(refused.value) and "percent-encoded" in str(refused.value)


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA made here, a server certificate for 127.0.0.1 and a client certificate, both
    signed by it (the openssl command)."""
    folder = tmp_path_factory.mktemp("tls")
    files = {name: folder / f"{name}.pem" for name in ("ca", "ca-key", "server", "server-key")}
    files |= {name: folder / f"{name}.pem" for name in ("client", "client-key")}

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    openssl(
        *("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test CA"),
        *("-keyout", str(files["ca-key"]), "-out", str(files["ca"])),
    )
    for name, extra in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "")):
        request = folder / f"{name}.csr"
        openssl(
            *("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}"),
            *("-keyout", str(files[f"{name}-key"]), "-out", str(request)),
        )
        extensions = folder / f"{name}.ext"
        extensions.write_text(extra + "\n" if extra else "basicConstraints=CA:FALSE\n")
        openssl(
            *("x509", "-req", "-in", str(request), "-CA", str(files["ca"])),
            *("-CAkey", str(files["ca-key"]), "-CAcreateserial", "-days", "1"),
            *("-out", str(files[name]), "-extfile", str(extensions)),
        )
    return files


def server_tls(files: dict[str, Path], client_certificates: bool = False) -> ssl.SSLContext:
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(files["server"], files["server-key"])
    if client_certificates:
        tls.verify_mode = ssl.CERT_REQUIRED
        tls.load_verify_locations(files["ca"])
    return tls


stream_server = answering(STREAM_HEAD + EVENTS)


async def test_https_verified_by_a_ca_bundle_path_and_refused_without_it(
    tls_files: dict[str, Path], no_proxies: pytest.MonkeyPatch
) -> None:
    no_proxies.delenv("SSL_CERT_FILE", raising=False)
    async with serving(stream_server, server_tls(tls_files)) as origin:
        trusted = client(origin, verify=str(tls_files["ca"]))
        assert (await events_of(trusted))[-1] == b"[DONE]"
        await trusted.aclose()
        unchecked = client(origin, verify=False)
        assert (await events_of(unchecked))[-1] == b"[DONE]"
        await unchecked.aclose()
        untrusted = client(origin, max_retries=0)
        with pytest.raises(openai.APIConnectionError, match=r"(?i)certificate"):
            await events_of(untrusted)
        await untrusted.aclose()


async def test_mutual_tls_with_a_client_certificate(
    tls_files: dict[str, Path], no_proxies: pytest.MonkeyPatch
) -> None:
    async with serving(stream_server, server_tls(tls_files, client_certificates=True)) as origin:
        certified = client(
            origin,
            verify=str(tls_files["ca"]),
            cert=(str(tls_files["client"]), str(tls_files["client-key"])),
        )
        assert (await events_of(certified))[-1] == b"[DONE]"
        await certified.aclose()
        anonymous = client(origin, verify=str(tls_files["ca"]))
        with pytest.raises(openai.APIConnectionError, match="wants a client certificate"):
            await events_of(anonymous)
        assert await anonymous.refuses_client_certificate()
        await anonymous.aclose()
        assert not await certified.refuses_client_certificate()  # it takes this one


async def test_https_through_an_authenticating_connect_proxy(
    tls_files: dict[str, Path], no_proxies: pytest.MonkeyPatch
) -> None:
    log: list[str] = []
    expected = "Basic " + base64.b64encode(b"relay:s3cret").decode()
    async with (
        serving(stream_server, server_tls(tls_files)) as origin,
        serving(tunnel_proxy(log, expected)) as proxy_origin,
    ):
        proxy = proxy_origin.replace("http://", "http://relay:s3cret@")
        http = client(origin, verify=str(tls_files["ca"]), proxy=proxy)
        assert (await events_of(http))[-1] == b"[DONE]"
        await http.aclose()
        no_proxies.setenv("HTTPS_PROXY", proxy)  # the same through the environment
        from_env = client(origin, verify=str(tls_files["ca"]))
        assert (await events_of(from_env))[-1] == b"[DONE]"
        await from_env.aclose()
    assert log == [f"CONNECT {origin.removeprefix('https://')} HTTP/1.1"] * 2


async def test_an_https_proxy_is_spoken_to_over_tls(
    tls_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """TLS to the proxy, never the request in clear to a proxy that said https://."""
    log: list[str] = []
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_files["ca"]))  # the proxy's certificate
    async with (
        serving(json_server) as origin,
        serving(tunnel_proxy(log), server_tls(tls_files)) as proxy_origin,
    ):
        http = client(origin, proxy=proxy_origin)
        assert await models(http) == {"ok": True}
        await http.aclose()
    assert log == [f"GET {origin}/v1/models HTTP/1.1"]


async def test_a_session_of_ones_own_carries_the_requests() -> None:
    made: list[aiohttp.ClientSession] = []
    traced: list[str] = []

    def session() -> aiohttp.ClientSession:
        async def started(
            session: aiohttp.ClientSession, context: Any, params: aiohttp.TraceRequestStartParams
        ) -> None:
            traced.append(str(params.url))

        trace = aiohttp.TraceConfig()
        trace.on_request_start.append(started)
        made.append(aiohttp.ClientSession(trace_configs=[trace]))
        return made[-1]

    async with serving(json_server) as origin:
        http = client(origin, session_factory=session)
        assert await models(http) == {"ok": True}
        await http.aclose()
    assert len(made) == 1 and traced == [f"{origin}/v1/models"]


def test_a_session_factory_with_tls_or_proxy_settings_is_refused() -> None:
    with pytest.raises(ValueError, match="verify and session_factory"):
        EndpointConfig(
            base_url="https://gpu:8000/v1",
            model="m",
            verify=False,
            session_factory=aiohttp.ClientSession,
        )
