"""``relaygen serve`` under hostile upstreams and clients.

- **Upstream words stay in the log.** An upstream's error body (a proxy's 502 page naming the
  host behind it, vLLM quoting its own URL, an error event, anything at all) never reaches a
  remote client: not in a JSON error, an SSE error event, a Responses API failure, ``relay``
  fields, ``/health``, ``/readyz``, ``/v1/models`` or ``/metrics``, nor in what later clients
  are told while the server is known down. The log keeps it.
- **A client that reads slowly, or not at all.** The send timeout runs on progress: a client
  that accepts bytes keeps its stream however slowly it reads; one that accepts nothing for
  ``--send-timeout`` seconds is dropped, however little the server has written (no waiting
  for the socket buffers to fill).
- **Connections are capped**, in all and per client address: one more is answered 503 with
  ``Retry-After`` and closed.
- **One failed probe, one refused request**, do not turn other clients away.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given
from hypothesis import strategies as st
from starlette.requests import Request
from starlette.responses import Response

from relay_integrations.relay import EndpointConfig, RelayConfig, SwitchPolicy
from relay_integrations.server import RelayServer, ServerSettings
from relay_integrations.testing.scripted_vllm import Fault, ScriptedModel, ScriptedVLLM, serving
from tests.fakes.capable_model import CAPABLE_CUES, capable, capable_relay_config
from tests.fakes.hostile_upstream import hostile_settings
from tests.fakes.relay_http import ServedRelay, eventually, relay_http

QUESTION = [{"role": "user", "content": "What is 7 * 6?"}]
ADDRESS = "10.9.8.7:8001"
WORDS = "upstream-words-7f3a"
"""What the hostile upstream writes into its error bodies; no answer byte may carry either."""


# --- a hostile upstream ---------------------------------------------------------------------


@dataclass(frozen=True)
class Hostile:
    """The next `repeat` answers of `route` for `role`'s model: `status` with `body`."""

    route: str
    role: str
    status: int
    body: str
    content_type: str = "application/json"
    repeat: int = 1
    after: int = 0
    """Requests of the route and role answered as usual first."""


class HostileVLLM(ScriptedVLLM):
    """The capable scripted pair, whose next answers on a route can be replaced by
    :class:`Hostile` ones (``/v1/models`` for either role: it serves both models)."""

    def __init__(self) -> None:
        super().__init__(*(ScriptedModel(name, "", respond=capable) for name in ("large", "small")))
        self.planned: list[Hostile] = []

    def plan(self, hostile: Hostile) -> None:
        self.planned.extend([hostile] * hostile.repeat)

    async def _planned(self, request: Request, route: str) -> Response | None:
        model = None if route == "/v1/models" else (await request.json()).get("model")
        for index, hostile in enumerate(self.planned):
            if hostile.route == route and model in (None, hostile.role):
                if hostile.after:
                    self.planned[index] = replace(hostile, after=hostile.after - 1)
                    return None
                del self.planned[index]
                return Response(hostile.body, hostile.status, media_type=hostile.content_type)
        return None

    async def _models(self, request: Request) -> Response:
        return await self._planned(request, "/v1/models") or await super()._models(request)

    async def _tokenize(self, request: Request) -> Response:
        return await self._planned(request, "/tokenize") or await super()._tokenize(request)

    async def _completions(self, request: Request) -> Response:
        planned = await self._planned(request, "/v1/completions")
        return planned or await super()._completions(request)


@pytest.fixture(scope="module")
def hostile() -> Iterator[HostileVLLM]:
    server = HostileVLLM()
    with serving(server):
        yield server


@pytest.fixture(scope="module")
def served(hostile: HostileVLLM) -> Iterator[ServedRelay]:
    fast = {"max_retries": 0, "read_timeout": 5.0, "probe_interval": 0.05}
    config = RelayConfig(
        large=EndpointConfig(base_url=hostile.base_url, model="large", **fast),
        small=EndpointConfig(base_url=hostile.base_url, model="small", **fast),
        cues=CAPABLE_CUES,
        policy=SwitchPolicy(cooldown_tokens=0, resume_wait_seconds=0.5),
    )
    with relay_http(RelayServer(config, ServerSettings(health_cache_seconds=0))) as running:
        yield running


def event(payload: Any) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def chunk(text: str) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "finish_reason": None, "stop_reason": None}
    return {"id": "c", "object": "text_completion", "model": "large", "choices": [choice]}


PROXY_PAGE = (
    "<html><head><title>502 Bad Gateway</title></head><body><h1>502 Bad Gateway</h1>"
    f"<p>upstream {ADDRESS} refused the connection ({WORDS})</p><hr>nginx</body></html>"
)
VLLM_400 = json.dumps(
    {
        "error": {
            "message": f"model 'large' at http://{ADDRESS}/v1 cannot take this ({WORDS})",
            "type": "BadRequestError",
            "code": 400,
        }
    }
)
SSE = "text/event-stream"


def error_bodies() -> st.SearchStrategy[tuple[str, str]]:
    """Error bodies carrying the marks, as servers, proxies and gateways write them."""
    said = st.sampled_from(
        [
            f"http://{ADDRESS}/v1 said no ({WORDS})",
            f"{WORDS} at {ADDRESS}",
            f"upstream connect error or disconnect/reset before headers. {ADDRESS} {WORDS}",
        ]
    )
    return st.one_of(
        said.map(lambda text: (json.dumps({"error": {"message": text, "code": 400}}), "json")),
        said.map(lambda text: (json.dumps({"detail": text}), "json")),
        said.map(lambda text: (json.dumps({"message": text}), "json")),
        said.map(lambda text: (json.dumps({"error": text}), "json")),
        said.map(lambda text: (f"<html><body>{text}</body></html>", "html")),
        said.map(lambda text: (text, "text")),
    )


@st.composite
def hostile_answers(draw: st.DrawFn) -> Hostile:
    route = draw(st.sampled_from(["/v1/completions", "/tokenize", "/v1/models"]))
    role = draw(st.sampled_from(["large", "small"]))
    repeat = draw(st.integers(1, 12))
    if route == "/v1/completions" and draw(st.booleans()):  # an error event in a 200 stream
        said = draw(st.sampled_from([f"{WORDS} {ADDRESS}", f"http://{ADDRESS}/v1 {WORDS}"]))
        before = draw(st.sampled_from([[], [chunk("The user")]]))
        body = "".join(event(c) for c in before) + event({"error": {"message": said}})
        return Hostile(route, role, 200, body, SSE, repeat)
    status = draw(st.sampled_from([200, 400, 401, 404, 413, 422, 429, 500, 502, 503, 504]))
    body, kind = draw(error_bodies())
    content_type = {"json": "application/json", "html": "text/html", "text": "text/plain"}[kind]
    return Hostile(route, role, status, body, content_type, repeat)


def every_answer(served: ServedRelay) -> list[bytes]:
    """What clients get from every surface: chat completions and responses, whole and
    streamed (each sent twice: later clients too), then the probes, models and metrics."""
    answers = []
    with httpx.Client(base_url=served.url, timeout=30) as client:
        for _ in range(2):
            for path, body in (
                ("/v1/chat/completions", {"model": "large", "messages": QUESTION}),
                ("/v1/responses", {"model": "large", "input": QUESTION}),
            ):
                for stream in (False, True):
                    with client.stream("POST", path, json={**body, "stream": stream}) as response:
                        answers.append(bytes(response.read()))
                        answers.append(str(response.headers).encode())
        for path in ("/health", "/readyz", "/v1/models", "/metrics"):
            answers.append(client.get(path).content)
    return answers


@hostile_settings(
    examples=25,  # generated upstream answers (the named examples run besides)
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(answer=hostile_answers())
@example(  # a proxy's 502 page naming the host behind it, until the server is known down
    answer=Hostile("/v1/completions", "large", 502, PROXY_PAGE, "text/html", repeat=12)
).via("proxy_502_page_naming_the_host_behind_it")
@example(answer=Hostile("/v1/models", "large", 502, PROXY_PAGE, "text/html", repeat=3)).via(
    "a_probe_meets_the_proxy_page"
)
@example(answer=Hostile("/v1/completions", "large", 400, VLLM_400)).via("vllm_400_quoting_its_url")
@example(answer=Hostile("/tokenize", "large", 400, VLLM_400)).via("chat_template_refusal")
@example(answer=Hostile("/v1/completions", "small", 502, PROXY_PAGE, "text/html", 12)).via(
    "small_server_behind_the_proxy_degrades"
)
def test_no_answer_carries_an_upstreams_words_or_address(
    hostile: HostileVLLM,
    served: ServedRelay,
    caplog: pytest.LogCaptureFixture,
    answer: Hostile,
) -> None:
    caplog.clear()
    hostile.plan(answer)
    try:
        answers = every_answer(served)
    finally:
        hostile.planned.clear()
    for sent in answers:
        assert ADDRESS.encode() not in sent and WORDS.encode() not in sent, sent[:600]
    errs = answer.status >= 400 or answer.content_type == SSE  # a 200 body may not say error
    if answer.route == "/v1/completions" and answer.role == "large" and errs:
        fields = [getattr(record, "fields", None) for record in caplog.records]
        assert WORDS in caplog.text + str(fields)  # the operator reads what the upstream said


# --- clients that read slowly, or not at all --------------------------------------------------

CHAT = b'{"model": "large", "messages": [{"role": "user", "content": "Hi"}], "stream": true}'
HEAD = (
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: relay\r\ncontent-type: application/json\r\n"
    b"content-length: %d\r\n\r\n" % len(CHAT)
)


@contextmanager
def writer(tokens: int, token_delay: float) -> Iterator[ServedRelay]:
    """A relay over a pair that writes `tokens` words of reasoning, `token_delay` apart,
    with a send timeout of one second."""
    trace = "<think>\n" + "word " * tokens + "\n</think>\n\nDone."
    pair = ScriptedVLLM(
        *(ScriptedModel(name, trace, token_delay=token_delay) for name in ("large", "small"))
    )
    with serving(pair) as upstream:
        config = capable_relay_config(upstream.base_url)
        settings = ServerSettings(send_timeout=1.0, max_concurrent_generations=1)
        with relay_http(RelayServer(config, settings)) as served:
            yield served


def connect(served: ServedRelay, receive_buffer: int, source: str = "127.0.0.1") -> socket.socket:
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    client.bind((source, 0))
    client.connect(("127.0.0.1", served.port))
    return client


def limited(served: ServedRelay, limit: str) -> float:
    """Connections closed by `limit`, read from an address of its own (the tests fill
    127.0.0.1's share of connections)."""
    transport = httpx.HTTPTransport(local_address="127.0.0.9")
    with httpx.Client(transport=transport) as client:
        metrics = client.get(f"{served.url}/metrics").text
    for line in metrics.splitlines():
        if line.startswith(f'relay_connections_limited_total{{limit="{limit}"}}'):
            return float(line.split()[-1])
    return 0.0


def test_a_client_that_trickles_its_reads_is_dropped_before_the_buffers_fill() -> None:
    """A byte every half second is no progress TCP can see (it acknowledges reads in steps
    of half the receive buffer): once the client's small buffer is full, the stream is
    dropped after the send timeout, while the relay has written far less than its own
    buffers hold (20 KB/s here; they would take minutes to fill)."""
    with writer(tokens=3000, token_delay=0.01) as served:
        slow = connect(served, receive_buffer=4096)
        slow.sendall(HEAD + CHAT)
        started = time.monotonic()
        assert eventually(lambda: served.relay.inflight == 1, 5)
        while served.relay.inflight and time.monotonic() - started < 15:
            with contextlib.suppress(OSError):
                slow.recv(1)
            time.sleep(0.5)
        assert served.relay.inflight == 0, "the trickling client still holds its slot"
        assert time.monotonic() - started < 8  # its buffer full, then one send timeout
        assert limited(served, "send") == 1
        slow.close()


def test_a_slow_reader_that_keeps_taking_bytes_keeps_its_stream() -> None:
    """2 KB every 0.1 s, slower than the generation: the relay waits on it for seconds at a
    time, past the one-second send timeout, but it takes bytes within each: it gets the
    whole stream."""
    with writer(tokens=1000, token_delay=0.002) as served:
        reader = connect(served, receive_buffer=4096)
        reader.sendall(HEAD + CHAT)
        received = b""
        reader.settimeout(10)
        while chunk := reader.recv(2048):
            received += chunk
            if received.endswith(b"0\r\n\r\n"):  # the chunked body's end
                break
            time.sleep(0.1)
        reader.close()
        assert received.rstrip(b"\r\n0").endswith(b"data: [DONE]"), received[-200:]
        assert limited(served, "send") == 0


# --- how many connections ---------------------------------------------------------------------


def refused_with(client: socket.socket) -> bytes:
    """What the server sent a connection before closing it."""
    client.settimeout(5)
    received = b""
    with contextlib.suppress(ConnectionResetError, TimeoutError):
        while chunk := client.recv(65536):
            received += chunk
    return received


def test_connections_beyond_the_caps_get_503_with_retry_after(hostile: HostileVLLM) -> None:
    config = RelayConfig(
        large=EndpointConfig(base_url=hostile.base_url, model="large"),
        small=EndpointConfig(base_url=hostile.base_url, model="small"),
        cues=CAPABLE_CUES,
    )
    settings = ServerSettings(max_connections=5, max_connections_per_client=3, retry_after=2)
    with relay_http(RelayServer(config, settings)) as served:
        held = [connect(served, 65536) for _ in range(3)]
        one_more = connect(served, 65536)  # a fourth from the same address
        answer = refused_with(one_more)
        assert answer.startswith(b"HTTP/1.1 503 "), answer[:80]
        assert b"retry-after: 2\r\n" in answer and b'"code": "too_many_connections"' in answer
        assert b"3 connections from one client" in answer
        held += [connect(served, 65536, "127.0.0.2") for _ in range(2)]  # five in all
        answer = refused_with(connect(served, 65536, "127.0.0.3"))
        assert b"limit of 5 open connections" in answer
        time.sleep(0.2)
        for client in held[2:]:  # the held ones are served as before
            client.sendall(b"GET /livez HTTP/1.1\r\nhost: relay\r\n\r\n")
            assert client.recv(65536).startswith(b"HTTP/1.1 200 ")
        with httpx.Client(base_url=served.url) as http:  # an HTTP client sees the 503
            refused = http.get("/livez")
            assert refused.status_code == 503 and refused.headers["retry-after"] == "2"
            held.pop(0).close()  # one from 127.0.0.1: its share has room again
            assert eventually(lambda: http.get("/livez").status_code == 200)
        assert (
            limited(served, "connections") >= 2 and limited(served, "connections_per_client") == 1
        )
        for client in held:
            client.close()


def test_one_client_cannot_hold_every_connection(hostile: HostileVLLM) -> None:
    """One address opening 600 idle connections: the defaults let it hold 512, and another
    client still gets in."""
    config = RelayConfig(
        large=EndpointConfig(base_url=hostile.base_url, model="large"),
        small=EndpointConfig(base_url=hostile.base_url, model="small"),
        cues=CAPABLE_CUES,
    )
    with relay_http(RelayServer(config, ServerSettings())) as served:
        idle = [connect(served, 65536) for _ in range(600)]
        assert eventually(lambda: limited(served, "connections_per_client") == 600 - 512, 10)
        other = connect(served, 65536, "127.0.0.2")
        other.sendall(b"GET /livez HTTP/1.1\r\nhost: relay\r\n\r\n")
        assert other.recv(65536).startswith(b"HTTP/1.1 200 ")
        for client in [*idle, other]:
            client.close()


# --- one failed probe, one refused request ----------------------------------------------------


def answered(served: ServedRelay, clients: int, stream: bool = False) -> list[int]:
    """The statuses `clients` concurrent chat requests get."""
    body = {"model": "large", "messages": QUESTION, "stream": stream}

    def one(_: int) -> int:
        url = f"{served.base_url}/chat/completions"
        return httpx.post(url, json=body, timeout=60).status_code

    with ThreadPoolExecutor(clients) as pool:
        return list(pool.map(one, range(clients)))


@pytest.fixture
def slow_probes(hostile: HostileVLLM) -> Iterator[ServedRelay]:
    """A relay over the hostile pair that probes a server found down every 30 s: whatever
    it finds down stays down for the test."""
    slow = {"max_retries": 0, "probe_interval": 30.0}
    config = RelayConfig(
        large=EndpointConfig(base_url=hostile.base_url, model="large", **slow),
        small=EndpointConfig(base_url=hostile.base_url, model="small", **slow),
        cues=CAPABLE_CUES,
        policy=SwitchPolicy(cooldown_tokens=0),
    )
    settings = ServerSettings(health_cache_seconds=0)
    with relay_http(RelayServer(config, settings)) as running:
        yield running
    hostile.planned.clear()


def test_one_probe_meeting_a_503_turns_no_client_away(
    hostile: HostileVLLM, slow_probes: ServedRelay
) -> None:
    """A /readyz probe whose check of the large server meets one 503 (a proxy's blip) says
    so, but 65 clients right after it are all answered: one failure is not an outage."""
    assert answered(slow_probes, 1) == [200]  # the models are known
    hostile.plan(Hostile("/v1/models", "large", 503, PROXY_PAGE, "text/html"))
    probe = httpx.get(f"{slow_probes.url}/readyz")
    assert probe.status_code == 503 and probe.json()["large"] == "unavailable"
    assert answered(slow_probes, 65) == [200] * 65
    assert httpx.get(f"{slow_probes.url}/readyz").status_code == 200


@pytest.mark.parametrize(
    "hostile_answer",
    [
        pytest.param(Hostile("/v1/completions", "large", 400, VLLM_400, repeat=8), id="400"),
        pytest.param(Hostile("/v1/completions", "large", 500, VLLM_400, repeat=8), id="500"),
        pytest.param(
            Hostile("/v1/completions", "large", 200, event({"error": {"message": WORDS}}), SSE, 8),
            id="error_event",
        ),
    ],
)
def test_a_failure_of_one_request_repeated_turns_no_other_away(
    hostile: HostileVLLM, slow_probes: ServedRelay, hostile_answer: Hostile
) -> None:
    """Eight requests in a row each failed by the large server (the request's fault, not the
    server's): the server is up, and the next clients get answers, not 503 "known down"."""
    assert answered(slow_probes, 1) == [200]
    hostile.plan(hostile_answer)
    failed = answered(slow_probes, 8)
    assert 503 not in failed and 200 not in failed, failed
    assert answered(slow_probes, 4, stream=True) == [200] * 4
    assert answered(slow_probes, 4) == [200] * 4


def test_a_resume_the_upstream_refuses_ends_the_stream_with_an_error_and_done(
    hostile: HostileVLLM,
) -> None:
    """The large model's stream breaks near the end of its reasoning and the request that
    resumes it is refused: the client's stream ends with an error event and ``[DONE]`` at
    once, not keep-alive comments while nothing can come."""
    large = hostile.models["large"]
    config = RelayConfig(
        large=EndpointConfig(base_url=hostile.base_url, model="large", max_retries=0),
        small=EndpointConfig(base_url=hostile.base_url, model="small", max_retries=0),
        cues=CAPABLE_CUES,
        policy=SwitchPolicy(cooldown_tokens=0),
    )
    settings = ServerSettings(sse_keepalive=0.2)
    with relay_http(RelayServer(config, settings)) as served:
        large.faults[:] = [Fault(), Fault(cut_after=12)]  # its second turn, near the end
        hostile.plan(Hostile("/v1/completions", "large", 400, VLLM_400, after=2))
        started = time.monotonic()
        body = {"model": "large", "messages": QUESTION, "stream": True}
        with httpx.stream("POST", f"{served.base_url}/chat/completions", json=body) as response:
            events = [e for e in response.read().decode().split("\n\n") if e]
        hostile.planned.clear()
        large.faults.clear()
    assert time.monotonic() - started < 5
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert error["code"] == "upstream_rejected_request"
    assert "relay.partial" in error["message"]
    assert sum(e == ": keep-alive" for e in events) <= 5
