"""The relay's HTTP/1.1 client against servers that send exactly the bytes each test needs:
responses split at every byte, kept-alive connections the server closed, stalls, error
statuses, an HTTP proxy and a CONNECT tunnel to an HTTPS server."""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import openai
import pytest

from relay_integrations.upstream._wire import PAUSE_AT, ReadTimeout, WireClient

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def serving(handler: Handler, tls: ssl.SSLContext | None = None) -> AsyncIterator[str]:
    """A raw server on a loopback port; yields its origin (``http://127.0.0.1:PORT``)."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=tls)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    finally:
        server.close()


async def read_request(reader: asyncio.StreamReader) -> tuple[str, dict[str, str], bytes]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode()
    line, *header_lines = head.strip().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return line, headers, body


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


EVENTS = chunked(b'data: {"a": 1}\n\n', b'data: {"a": 2}\n\ndata: [DO', b"NE]\n\n")
STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


def client(origin: str, read_timeout: float = 5.0) -> WireClient:
    return WireClient(origin, {"authorization": "Bearer k"}, 2.0, read_timeout)


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
                await asyncio.sleep(0)

    async with serving(handler) as origin:
        wire = client(origin)
        for _ in range(2):
            response = await wire.request("POST", "/v1/completions", {"prompt": "Hi"})
            assert [event async for event in response.events()] == [
                b'{"a": 1}',
                b'{"a": 2}',
                b"[DONE]",
            ]
            await response.close()
        await wire.aclose()
    assert len(peers) == 1  # the second request reused the connection
    line, headers, body = seen[0]
    assert line == "POST /v1/completions HTTP/1.1"
    assert headers["authorization"] == "Bearer k" and headers["host"] == origin[7:]
    assert json.loads(body) == {"prompt": "Hi"}


async def test_a_kept_alive_connection_the_server_closed_is_replaced_at_once() -> None:
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
        await writer.drain()
        writer.close()  # as a server's keep-alive timeout does, unannounced

    async with serving(handler) as origin:
        wire = client(origin)
        for _ in range(3):
            response = await wire.request("GET", "/v1/models")
            assert await response.json() == {}
            await response.close()
            await asyncio.sleep(0.05)
        await wire.aclose()
    assert connections == 3


async def test_a_server_that_stops_sending_is_a_timeout_after_read_timeout() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(STREAM_HEAD + chunked(b'data: {"a": 1}\n\n')[:-5])  # then nothing
        await writer.drain()
        await reader.read()  # until the client gives up and closes

    async with serving(handler) as origin:
        wire = client(origin, read_timeout=0.3)
        response = await wire.request("POST", "/v1/completions", {})
        received = []
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(ReadTimeout):
            async for event in response.events():
                received.append(event)
        assert 0.25 < loop.time() - started < 1.0
        assert received == [b'{"a": 1}']
        await response.close()
        await wire.aclose()


async def test_an_error_status_is_the_sdks_error_with_the_servers_message() -> None:
    body = json.dumps({"error": {"message": "stop: at most 4 items", "type": "BadRequestError"}})

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: %d\r\n\r\n" % len(body))
        writer.write(body.encode())
        await writer.drain()

    async with serving(handler) as origin:
        wire = client(origin)
        with pytest.raises(openai.BadRequestError) as refused:
            await wire.request("POST", "/v1/completions", {})
        await wire.aclose()
    assert refused.value.status_code == 400 and "at most 4 items" in refused.value.message
    assert refused.value.body == {"message": "stop: at most 4 items", "type": "BadRequestError"}
    assert str(refused.value.request.url) == f"{origin}/v1/completions"


async def test_a_refused_connection_is_the_sdks_connection_error_caused_by_it() -> None:
    async def nothing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    async with serving(nothing) as origin:  # a free port, closed again
        pass
    wire = client(origin)
    with pytest.raises(openai.APIConnectionError) as failed:
        await wire.request("GET", "/v1/models")
    assert isinstance(failed.value.__cause__, ConnectionRefusedError)


async def test_a_reader_far_behind_pauses_the_socket_and_resumes_it() -> None:
    events = [b'data: {"n": %d}\n\n' % i for i in range(PAUSE_AT * 3)]

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(STREAM_HEAD + chunked(*events))
        await writer.drain()

    async with serving(handler) as origin:
        wire = client(origin)
        response = await wire.request("POST", "/v1/completions", {})
        await asyncio.sleep(0.1)  # everything has arrived, unread
        received = [json.loads(event)["n"] async for event in response.events()]
        await response.close()
        await wire.aclose()
    assert received == list(range(PAUSE_AT * 3))


async def test_requests_go_through_the_http_proxy_of_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    targets: list[str] = []

    async def server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b'HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\n{"ok": true}')
        await writer.drain()

    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line, _, body = await read_request(reader)
        targets.append(line)
        method, url, version = line.split(" ")
        host, port = url.split("/")[2].split(":")
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        path = "/" + url.split("/", 3)[3]
        up_writer.write(
            f"{method} {path} {version}\r\ncontent-length: {len(body)}\r\n\r\n".encode()
        )
        up_writer.write(body)
        writer.write(await up_reader.read(1000))
        await writer.drain()

    async with serving(server) as origin, serving(proxy) as proxy_origin:
        monkeypatch.setenv("HTTP_PROXY", proxy_origin)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        wire = client(origin)
        response = await wire.request("GET", "/v1/models")
        assert await response.json() == {"ok": True}
        await response.close()
        await wire.aclose()
    assert targets == [f"GET {origin}/v1/models HTTP/1.1"]


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (made with the openssl command)."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


async def test_https_directly_and_through_a_connect_tunnel(
    certificate: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = certificate
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the system's trust, as for httpx
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    tunnels: list[str] = []

    async def server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(STREAM_HEAD + EVENTS)
        await writer.drain()

    async def tunnel(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line, _, _ = await read_request(reader)
        tunnels.append(line)
        host, port = line.split(" ")[1].split(":")
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async with serving(server, tls) as origin, serving(tunnel) as proxy_origin:
        for proxied in (False, True):
            if proxied:
                monkeypatch.setenv("HTTPS_PROXY", proxy_origin)
            wire = client(origin)
            response = await wire.request("POST", "/v1/completions", {})
            assert [e async for e in response.events()][-1] == b"[DONE]"
            await response.close()
            await wire.aclose()
    assert tunnels == [f"CONNECT {origin[8:]} HTTP/1.1"]
