"""``relaygen serve`` against clients that hold connections without using them: a request head
or body that trickles in (slowloris) is answered 408 and closed; a client that reads nothing
has its stream ended, its generation cancelled and its slot freed; each is logged and counted.
The health probe opens no connection per call; streams the shutdown cuts end cleanly."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from relay_integrations.relay import EndpointConfig, RelayConfig, SwitchPolicy
from relay_integrations.server import RelayServer, ServerSettings
from relay_integrations.testing.scripted_vllm import ScriptedModel, ScriptedVLLM, serving
from tests.fakes.capable_model import capable_relay_config, capable_server
from tests.fakes.relay_http import ServedRelay, eventually, relay_http
from tests.fakes.tcp_table import established

CHAT = b'{"model": "large", "messages": [{"role": "user", "content": "Hi"}], "stream": true}'


def relay_server(url: str, **settings: object) -> RelayServer:
    return RelayServer(capable_relay_config(url), ServerSettings(**settings))


def connect(served: ServedRelay, receive_buffer: int | None = None) -> socket.socket:
    client = socket.socket()
    if receive_buffer is not None:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    client.connect(("127.0.0.1", served.port))
    return client


def closed_with(client: socket.socket, seconds: float) -> bytes:
    """What the server sent before closing the connection (within `seconds`)."""
    client.settimeout(seconds)
    received = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := client.recv(65536):
            received += chunk
    return received


def limited(served: ServedRelay, limit: str) -> float:
    text = httpx.get(f"{served.url}/metrics").text
    for line in text.splitlines():
        if line.startswith(f'relay_connections_limited_total{{limit="{limit}"}}'):
            return float(line.split()[-1])
    return 0.0


def test_a_request_head_that_trickles_in_is_answered_408_and_closed(
    upstream: ScriptedVLLM,
) -> None:
    with relay_http(relay_server(upstream.base_url, head_timeout=0.5)) as served:
        started = time.monotonic()
        clients = [connect(served) for _ in range(20)]
        for client in clients:
            client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: relay\r\n")
        for _ in range(3):  # a header every 0.2 s: never a whole head
            time.sleep(0.2)
            for client in clients:
                with contextlib.suppress(OSError):
                    client.sendall(b"x-slow: 1\r\n")
        answers = [closed_with(client, 5) for client in clients]
        assert time.monotonic() - started < 3
        for answer in answers:
            assert answer.startswith(b"HTTP/1.1 408 "), answer[:80]
            assert b'"code": "request_timeout"' in answer
        assert limited(served, "head") == 20
        assert httpx.get(f"{served.url}/health").status_code == 200  # others are served


def test_a_connection_that_sends_nothing_is_closed_after_the_head_timeout(
    upstream: ScriptedVLLM,
) -> None:
    with relay_http(relay_server(upstream.base_url, head_timeout=0.3)) as served:
        client = connect(served)
        assert closed_with(client, 5).startswith(b"HTTP/1.1 408 ")


def test_a_kept_alive_connection_may_idle_between_requests(upstream: ScriptedVLLM) -> None:
    """The head timeout runs from a request's first byte on a kept-alive connection; the
    keep-alive timeout, not it, decides how long the connection may idle."""
    with (
        relay_http(relay_server(upstream.base_url, head_timeout=0.3)) as served,
        httpx.Client(base_url=served.url) as client,
    ):
        assert client.get("/v1/models").status_code == 200
        time.sleep(0.6)
        assert client.get("/v1/models").status_code == 200
        assert limited(served, "head") == 0


def test_a_body_that_trickles_in_is_answered_408(upstream: ScriptedVLLM) -> None:
    with relay_http(relay_server(upstream.base_url, body_timeout=0.5)) as served:
        client = connect(served)
        head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: relay\r\ncontent-length: %d\r\n\r\n"
        client.sendall(head % len(CHAT) + CHAT[:10])
        answer = closed_with(client, 5)
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:80]
        assert b"did not arrive within 0.5 s" in answer


@contextmanager
def long_writer() -> Iterator[ScriptedVLLM]:
    """A pair that writes a long answer as fast as it can: 10,000 tokens of a kilobyte each,
    more than the sockets' buffers hold (up to 4 MiB each way on Linux)."""
    trace = "<think>\nShort.\n</think>\n\n" + ("a" * 1000 + " ") * 10000
    with serving(ScriptedVLLM(ScriptedModel("large", trace), ScriptedModel("small", trace))) as up:
        yield up


@contextmanager
def streaming_to_one_client() -> Iterator[tuple[ScriptedVLLM, ServedRelay, socket.socket]]:
    """The long writer behind a relay that serves one generation at a time with a 0.5 s send
    timeout, and a client (4 KiB receive buffer) that has asked it for a streamed chat."""
    with long_writer() as upstream:
        endpoint = {"base_url": upstream.base_url}
        config = RelayConfig(
            large=EndpointConfig(**endpoint, model="large"),
            small=EndpointConfig(**endpoint, model="small"),
            cues=["Now"],
            policy=SwitchPolicy(cooldown_tokens=0),
        )
        settings = ServerSettings(send_timeout=0.5, max_concurrent_generations=1)
        with relay_http(RelayServer(config, settings)) as served:
            client = connect(served, receive_buffer=4096)
            head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: relay\r\ncontent-type: "
            head += b"application/json\r\ncontent-length: %d\r\n\r\n"
            client.sendall(head % len(CHAT) + CHAT)
            try:
                yield upstream, served, client
            finally:
                client.close()


def test_a_client_that_reads_nothing_is_dropped_and_its_slot_serves_another(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with streaming_to_one_client() as (upstream, served, _):  # the client never reads
        assert eventually(lambda: served.relay.inflight == 1, 5)
        assert eventually(lambda: served.relay.inflight == 0, 30), "the slot is still held"
        assert limited(served, "send") == 1
        assert upstream.models["large"].active == 0  # its upstream request was closed
        body = {"model": "large", "messages": [{"role": "user", "content": "Hi"}]}
        answered = httpx.post(f"{served.base_url}/chat/completions", json=body, timeout=60)
        assert answered.status_code == 200  # the freed slot serves another client
    assert any("accepted nothing for 0.5 s" in r.getMessage() for r in caplog.records)


def test_a_client_that_reads_slowly_keeps_its_stream_while_it_reads(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``--send-timeout`` counts the bytes a client takes, not how fast: a reader far slower
    than the relay writes (2 KiB every 0.1 s through a 4 KiB receive buffer, the socket
    buffers between them full all along) keeps its stream over ten windows of the timeout,
    where a client that takes nothing is dropped after one (above)."""
    with streaming_to_one_client() as (_, served, slow):
        slow.settimeout(2)
        received, ends = 0, time.monotonic() + 5
        while time.monotonic() < ends:
            time.sleep(0.1)
            chunk = slow.recv(2048)
            assert chunk, f"the relay closed a stream its client was reading ({received} B)"
            received += len(chunk)
        assert served.relay.inflight == 1  # still writing to it
        assert limited(served, "send") == 0
        assert received < 200_000  # far slower than the relay writes (10 MB)
    assert not any("accepted nothing" in r.getMessage() for r in caplog.records)


def test_health_probes_reuse_the_relays_connections(upstream: ScriptedVLLM) -> None:
    with relay_http(relay_server(upstream.base_url)) as served, httpx.Client() as client:
        assert client.get(f"{served.url}/health").status_code == 200
        opened = len(established(upstream.port))
        for _ in range(50):
            assert client.get(f"{served.url}/health").status_code == 200
        assert 1 <= len(established(upstream.port)) <= opened


def test_streams_the_shutdown_timeout_cuts_end_with_an_error_event_and_done() -> None:
    """SIGTERM with streams still running: each ends, before uvicorn's shutdown timeout
    would cut its connection, with an error event and ``[DONE]`` (a whole chunked body)."""
    with serving(capable_server(token_delay=0.05)) as slow:  # a few seconds a generation
        settings = ServerSettings(shutdown_timeout=1)
        with relay_http(RelayServer(capable_relay_config(slow.base_url), settings)) as served:
            events: list[str] = []

            def stream() -> None:
                body = {"model": "large", "messages": [{"role": "user", "content": "Hi"}]}
                with httpx.stream(
                    "POST", f"{served.base_url}/chat/completions", json={**body, "stream": True}
                ) as response:
                    events.extend(
                        line.removeprefix("data: ")
                        for line in response.iter_lines()
                        if line.startswith("data: ")
                    )

            reader = threading.Thread(target=stream)
            reader.start()
            assert eventually(lambda: len(events) >= 3, 10)  # text is streaming
            started = time.monotonic()
            served.server.handle_exit(signal.SIGTERM, None)
            reader.join(10)
            assert not reader.is_alive()
            assert time.monotonic() - started < 2
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "shutting_down"


def test_probes_within_the_cache_time_share_one_check_and_livez_needs_no_upstream(
    upstream: ScriptedVLLM,
) -> None:
    down = capable_server()  # bound, not listening: refused
    server = RelayServer(
        capable_relay_config(upstream.base_url, down.base_url),
        ServerSettings(health_cache_seconds=30),
    )
    with relay_http(server) as served, httpx.Client(base_url=served.url) as client:
        checks: list[str] = []
        small = served.relay.switcher.endpoints["small"]
        probe = small.probe

        async def counted() -> str:
            checks.append("small")
            return await probe()

        small.probe = counted  # type: ignore[method-assign]
        probes = [client.get("/readyz") for _ in range(20)] + [client.get("/health")]
        assert {p.status_code for p in probes} == {200}  # the large model serves alone
        assert {p.json()["status"] for p in probes} == {"degraded"}
        assert {p.json()["small"] for p in probes} == {"unavailable"}  # why: in the log
        assert checks == ["small"]  # one check answered every probe
        assert client.get("/livez").status_code == 200  # the process is alive
