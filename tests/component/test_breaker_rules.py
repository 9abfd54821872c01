"""The rules of the endpoint's circuit breaker (Envoy's outlier detection and vllm-router's
breaker are the model), and the failures it must not count, each against a raw server on a
loopback port that answers exactly what the test needs (or real aiohttp's own TLS, proxy and
parser errors):

- it opens after ``failures_to_open`` (5) outages in a row; one outage opens nothing, so a
  caller's own retry (LangChain's ``with_retry``, with or without jitter) reaches the server;
- any answer of the server's own resets the count: a prompt refused again and again while
  others pass opens nothing;
- open, it lets one request through as the half-open trial every ``probe_interval``: its
  success closes it, its failure re-opens it, the others fail at once;
- a probe counts like a request; a TLS failure (a client certificate the server requires,
  missing or refused, among them), a proxy's refusal, a response that broke HTTP and a URL
  aiohttp cannot use are named as what they are, and neither retried nor counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay_integrations.langchain import RelayChatModel
from relay_integrations.testing.scripted_vllm import Fault
from relay_integrations.upstream import availability as availability_module
from relay_integrations.upstream._http import sdk_request
from relay_integrations.upstream.answers import Tokenized
from relay_integrations.upstream.availability import Availability, ServerDown
from relay_integrations.upstream.config import EndpointConfig
from relay_integrations.upstream.endpoint import (
    CompletionRequest,
    Endpoint,
    UpstreamErrorEvent,
    UpstreamFailure,
)
from relay_integrations.upstream.errors import RelayError
from tests.component.test_http import (  # noqa: F401  (tls_files: a fixture)
    read_request,
    server_tls,
    serving,
    tls_files,
)
from tests.fakes.capable_model import capable_server, relay_fields
from tests.fakes.ports import refusing_port


def response(status: str, body: bytes, content_type: str = "application/json") -> bytes:
    head = f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}"
    return head.encode() + b"\r\n\r\n" + body


OK = response("200 OK", b'{"tokens": [1]}')
DOWN = response("503 Service Unavailable", b'{"error": {"message": "the engine restarts"}}')
STREAM = response(
    "200 OK",
    b'data: {"choices": [{"text": "hi", "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n',
    "text/event-stream",
)
MODELS_OK = response("200 OK", b'{"object": "list", "data": [{"id": "m", "object": "model"}]}')


class Server:
    """A raw server on a loopback port answering each request (kept-alive connections too)
    with what :attr:`answer` says for its request line and body; ``requests`` counts what
    reached it, ``delay`` holds each answer back."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.mode = "up"
        self.delay = 0.0

    def answer(self, line: str, body: bytes) -> bytes:
        if self.mode.isdigit():  # any status: a refusal, a busy or a broken server
            return response(f"{self.mode} No", b"{}")
        if self.mode == "down" or (self.mode == "poison" and b"poison" in body):
            return DOWN
        if line.startswith("GET "):
            return MODELS_OK
        return STREAM if line.startswith("POST /v1/completions") else OK

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            line, _, body = await read_request(reader)
            self.requests.append(line)
            await asyncio.sleep(self.delay)
            writer.write(self.answer(line, body))
            await writer.drain()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[str]:
        async with serving(self.handle) as origin:
            yield origin


@asynccontextmanager
async def endpoint(origin: str, **fields: Any) -> AsyncIterator[Endpoint]:
    settings: dict[str, Any] = {"max_retries": 0, "connect_timeout": 2.0, "read_timeout": 5.0}
    config = EndpointConfig(base_url=origin + "/v1", model="m", **(settings | fields))
    made = Endpoint(config, "small")
    try:
        yield made
    finally:
        await made.aclose()


async def tokenize(endpoint: Endpoint, prompt: str = "Hi") -> Tokenized:
    return await endpoint.post_json("/tokenize", {"prompt": prompt}, Tokenized)


async def complete(endpoint: Endpoint, prompt: str = "Hi") -> str:
    request = CompletionRequest(prompt=prompt, max_tokens=4)
    return "".join([piece.text async for piece in endpoint.stream_completion(request)])


def not_sent(failure: UpstreamFailure) -> bool:
    return isinstance(failure.cause, ServerDown)


# --- one outage opens nothing; N in a row do --------------------------------------------------


@pytest.mark.parametrize("route", ["completions", "tokenize"])
async def test_one_503_then_healthy_with_no_retries_passes_on_the_callers_own_retry(
    route: str,
) -> None:
    """Today's fault was: one 503 opened the breaker, and the caller's retry got "known down
    ... the request was not sent" from a healthy server."""
    server = Server()
    call = complete if route == "completions" else tokenize
    async with server.running() as origin, endpoint(origin) as small:
        server.mode = "down"
        with pytest.raises(UpstreamFailure) as first:
            await call(small)
        assert first.value.outage and not small.availability.down
        server.mode = "up"
        assert await call(small)  # sent, and answered
    assert len(server.requests) == 2


async def test_one_host_name_not_found_opens_nothing() -> None:
    async with endpoint("http://no-such-host.invalid:8000", connect_timeout=5.0) as small:
        for _ in range(2):
            with pytest.raises(UpstreamFailure) as caught:
                await tokenize(small)
            assert "not found" in caught.value.reason and not not_sent(caught.value)
        assert not small.availability.down and small.availability.failures == 2


@pytest.mark.parametrize("jitter", [True, False], ids=["with-jitter", "no-jitter"])
async def test_langchain_with_retry_after_one_503_gets_the_answer(jitter: bool) -> None:
    """LangChain's with_retry tries again at once (no jitter) or after 1-2 s (its default
    jitter): both reach the healthy server (before, the first found the breaker open; the
    second found a probe due, which it started and then failed without waiting for it)."""
    async with capable_server() as server:
        server.models["large"].faults.append(Fault(503))
        model = RelayChatModel(**relay_fields(server.base_url, max_retries=0))
        # two tries: the answer must come on the first retry (with three, the default, the
        # old breaker's probe had closed it by the third)
        retrying = model.with_retry(wait_exponential_jitter=jitter, stop_after_attempt=2)
        answer = await retrying.ainvoke("What is 2 + 2?")
    assert answer.text == "The answer is 4."


@pytest.mark.parametrize("failures_to_open", [5, 1, 3], ids=["default-5", "one", "three"])
async def test_the_breaker_opens_after_n_outages_in_a_row(failures_to_open: int) -> None:
    server = Server()
    server.mode = "down"
    fields = {} if failures_to_open == 5 else {"failures_to_open": failures_to_open}
    async with server.running() as origin, endpoint(origin, **fields) as small:
        assert small.config.failures_to_open == failures_to_open
        for sent in range(1, failures_to_open + 1):
            assert not small.availability.down
            with pytest.raises(UpstreamFailure) as caught:
                await tokenize(small)
            assert not not_sent(caught.value) and len(server.requests) == sent
        assert small.availability.down
        with pytest.raises(UpstreamFailure) as known:
            await tokenize(small)
    assert not_sent(known.value) and known.value.kind == "unavailable"
    assert f"{failures_to_open} failed requests in a row" in known.value.reason
    assert len(server.requests) == failures_to_open


async def test_a_prompt_refused_with_503_again_and_again_while_others_pass_opens_nothing() -> None:
    server = Server()
    server.mode = "poison"
    async with server.running() as origin, endpoint(origin, failures_to_open=2) as small:
        for _ in range(10):
            with pytest.raises(UpstreamFailure):
                await complete(small, "poison")
            assert await complete(small, "fine") == "hi"
            assert await small.probe() == "ok"
        assert not small.availability.down and small.availability.failures == 0
    assert len(server.requests) == 30


@pytest.mark.parametrize("answer", ["400", "500", "429"])
async def test_any_answer_of_the_server_resets_the_count(answer: str) -> None:
    server = Server()
    async with server.running() as origin, endpoint(origin, failures_to_open=2) as small:
        for _ in range(3):
            server.mode = "down"
            with pytest.raises(UpstreamFailure):
                await tokenize(small)
            server.mode = answer
            with pytest.raises(UpstreamFailure) as caught:
                await tokenize(small)
            assert not caught.value.outage
        assert not small.availability.down and small.availability.failures == 0


# --- the rules, over any schedule of requests and outcomes -----------------------------------

INTERVAL = 1.0
OUTCOMES: dict[str, Exception] = {
    "outage": openai.APIConnectionError(request=sdk_request("POST", "http://m/v1")),
    "answer": UpstreamErrorEvent("the server sent an error event: refused"),
    "neutral": openai.APITimeoutError(request=sdk_request("POST", "http://m/v1")),
}
ENDS = ["succeed", *OUTCOMES]
step = st.one_of(
    st.tuples(st.just("call"), st.sampled_from(ENDS)),  # sent and ended at once
    st.tuples(st.just("send"), st.just("")),  # sent, still out
    st.tuples(st.just("end"), st.sampled_from(ENDS)),  # the oldest one out ends
    st.tuples(st.just("wait"), st.sampled_from(["0.3", "1.0", "2.5"])),
)


class Schedule:
    """Requests through one breaker on a clock of the test's, and what the rules say of
    them: ``outages`` since the last answer, and when the door last shut (it opened, or a
    trial ended without an answer)."""

    def __init__(self, failures_to_open: int) -> None:
        self.now, self.door, self.outages = 0.0, 0.0, 0
        self.failures_to_open = failures_to_open
        self.breaker = Availability(
            "small",
            "http://m/v1",
            probe,
            probe_interval=INTERVAL,
            probe_timeout=1.0,
            failures_to_open=failures_to_open,
        )
        self.out: list[bool] = []  # the requests out: whether each is the trial

    def send(self) -> bool:
        down, trials = self.breaker.down, sum(self.out)
        try:
            self.out.append(self.breaker.admit())
        except ServerDown:
            assert down and (trials == 1 or self.now < self.door + INTERVAL)
            return False
        assert not down or (trials == 0 and self.now >= self.door + INTERVAL)
        return True

    def end(self, outcome: str) -> None:
        trial, was_down = self.out.pop(0), self.breaker.down
        if outcome == "succeed":
            self.breaker.succeeded()
        else:
            self.breaker.record(OUTCOMES[outcome], outcome, trial=trial)
        if outcome in ("succeed", "answer"):
            self.outages = 0
        elif outcome == "outage":
            self.outages += 1
        if self.breaker.down and (trial or not was_down):
            self.door = self.now
        assert self.breaker.down == (self.outages >= self.failures_to_open)


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=st.lists(step, max_size=40), failures_to_open=st.integers(1, 3))
def test_the_breaker_keeps_its_rules_over_any_schedule(
    steps: list[tuple[str, str]], failures_to_open: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Open exactly while `failures_to_open` outages have come since the last answer; closed,
    every request goes; open, one trial at a time, and only an interval after it opened or
    after the last trial ended without an answer (then surely)."""
    schedule = Schedule(failures_to_open)
    clock = type("Clock", (), {"monotonic": lambda: schedule.now})
    monkeypatch.setattr(availability_module, "time", clock)  # the breaker's clock only
    for action, argument in steps:
        if action == "wait":
            schedule.now += float(argument)
        elif action == "send":
            schedule.send()
        elif (action == "call" and schedule.send()) or (action == "end" and schedule.out):
            schedule.end(argument)


async def probe() -> str:
    return "ok"


# --- open: one trial at a time ---------------------------------------------------------------


async def opened(server: Server, small: Endpoint) -> None:
    server.mode = "down"
    with pytest.raises(UpstreamFailure):
        await tokenize(small)
    assert small.availability.down


async def at_once(small: Endpoint, count: int) -> list[Tokenized | BaseException]:
    calls = (tokenize(small) for _ in range(count))
    return list(await asyncio.gather(*calls, return_exceptions=True))


async def test_half_open_sends_one_trial_whose_success_closes_the_breaker() -> None:
    server = Server()
    async with (
        server.running() as origin,
        endpoint(origin, failures_to_open=1, probe_interval=0.3) as small,
    ):
        await opened(server, small)
        outcomes = await at_once(small, 4)  # before the interval: none is sent
        assert all(isinstance(o, UpstreamFailure) and not_sent(o) for o in outcomes)
        assert len(server.requests) == 1

        await asyncio.sleep(0.35)
        server.mode, server.delay = "up", 0.2  # the trial is still out when the others come
        outcomes = await at_once(small, 4)
        assert len(server.requests) == 2  # exactly one request reached the server
        passed = [o for o in outcomes if isinstance(o, Tokenized)]
        refused = [o for o in outcomes if isinstance(o, UpstreamFailure) and not_sent(o)]
        assert (len(passed), len(refused)) == (1, 3)
        assert not small.availability.down
        assert len(await at_once(small, 3)) == 3 and len(server.requests) == 5


async def test_a_failed_trial_reopens_the_breaker_for_another_interval() -> None:
    server = Server()
    async with (
        server.running() as origin,
        endpoint(origin, failures_to_open=1, probe_interval=0.3, max_retries=3) as small,
    ):
        await opened(server, small)  # after its retries
        sent = len(server.requests)
        await asyncio.sleep(0.35)
        outcomes = await at_once(small, 4)
        assert len(server.requests) == sent + 1  # the trial, sent once: no retries
        assert sum(not not_sent(o) for o in outcomes if isinstance(o, UpstreamFailure)) == 1
        assert small.availability.down
        outcomes = await at_once(small, 2)  # re-opened: not before another interval
        assert all(isinstance(o, UpstreamFailure) and not_sent(o) for o in outcomes)
        assert len(server.requests) == sent + 1
        await asyncio.sleep(0.35)
        server.mode = "up"
        assert await tokenize(small) and not small.availability.down
    assert len(server.requests) == sent + 2


async def test_a_cancelled_trial_hands_its_turn_to_a_later_request() -> None:
    server = Server()
    async with (
        server.running() as origin,
        endpoint(origin, failures_to_open=1, probe_interval=0.2) as small,
    ):
        await opened(server, small)
        await asyncio.sleep(0.25)
        server.mode, server.delay = "up", 5.0
        trial = asyncio.ensure_future(tokenize(small))
        await asyncio.sleep(0.05)
        trial.cancel()
        await asyncio.gather(trial, return_exceptions=True)
        server.delay = 0.0
        await asyncio.sleep(0.25)
        assert await tokenize(small) and not small.availability.down


# --- probes count like requests ---------------------------------------------------------------


async def test_a_probes_single_failure_opens_nothing() -> None:
    """Before, one refused probe opened the breaker."""
    with refusing_port() as port:
        async with endpoint(f"http://127.0.0.1:{port}", max_retries=0) as small:
            assert (await small.probe()).startswith("unreachable: it refused the connection")
            assert not small.availability.down
            with pytest.raises(UpstreamFailure) as caught:
                await tokenize(small)
    assert not not_sent(caught.value) and "refused" in caught.value.reason


async def test_a_waiting_generation_probes_until_the_server_answers() -> None:
    server = Server()
    server.mode = "down"
    async with (
        server.running() as origin,
        endpoint(origin, failures_to_open=2, probe_interval=0.1) as small,
    ):
        with pytest.raises(UpstreamFailure):
            await tokenize(small)
        waiting = asyncio.ensure_future(small.availability.wait_until_up(5.0))
        await asyncio.sleep(0.35)  # its probes failed: the breaker opened
        assert not waiting.done() and small.availability.down
        server.mode = "up"
        assert await waiting and not small.availability.down


# --- failures that are not outages ------------------------------------------------------------


def answering(head: bytes) -> Any:
    """A server that answers every request with `head`, byte for byte."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(head)
            await writer.drain()

    return handler


BROKEN_HTTP = {
    "content-length-and-chunked": (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n"
        b"transfer-encoding: chunked\r\n\r\n{}",
        "Transfer-Encoding can't be present with Content-Length",
    ),
    "oversized-head": (
        b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * 70000 + b"\r\n\r\n",
        "Got more than 8190 bytes when reading",
    ),
}
PROXY_REFUSALS = {
    "proxy-407-connect": (b"407 Proxy Authentication Required", "https", "wants credentials"),
    "proxy-403-connect": (b"403 Forbidden", "https", "does not let the relay through"),
    "proxy-407-plain": (b"407 Proxy Authentication Required", "http", "wants credentials"),
}


@asynccontextmanager
async def misfit_server(kind: str, certificates: dict[str, Path]) -> AsyncIterator[dict[str, Any]]:
    """An endpoint's settings that meet the misfit `kind`, and what its message says."""
    if kind == "tls-untrusted":
        async with serving(answering(OK), server_tls(certificates)) as origin:
            said = "the server's TLS certificate failed verification"
            yield {"base_url": origin, "said": said, "reason": said, "fix": "verify"}
    elif kind == "tls-to-a-plain-server":

        async def plain(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read(1)  # the TLS hello, answered in plain HTTP
            writer.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
            await writer.drain()
            writer.close()

        async with serving(plain) as origin:
            said = "the TLS handshake failed (wrong version number)"
            https = origin.replace("http://", "https://")
            yield {"base_url": https, "said": said, "reason": said, "fix": "speaks TLS"}
    elif kind in BROKEN_HTTP:
        head, reason = BROKEN_HTTP[kind]
        async with serving(answering(head)) as origin:
            said = f"the server's response broke HTTP ({reason})"
            yield {"base_url": origin, "said": said, "reason": said, "fix": "base_url"}
    elif kind in PROXY_REFUSALS:
        status, scheme, fix = PROXY_REFUSALS[kind]
        refusal = b"HTTP/1.1 " + status + b"\r\ncontent-length: 0\r\n\r\n"
        async with serving(answering(refusal)) as proxy:
            code = status.decode().split()[0]
            said = f"answered {code}" if scheme == "http" else f"the proxy refused with {code}"
            yield {
                "base_url": f"{scheme}://127.0.0.1:9",  # never reached: the proxy refuses
                "proxy": proxy,
                "said": said,
                "reason": f"the proxy on the way answered {code}" if scheme == "http" else said,
                "fix": fix,
            }
    else:  # a base URL whose port is out of range: aiohttp refuses it
        said = "its URL is not one the HTTP client can use (Port out of range 0-65535)"
        yield {
            "base_url": "http://127.0.0.1:99999",
            "said": said,
            "reason": said,
            "fix": "base_url",
        }


@pytest.fixture(scope="module")
def certificates(request: pytest.FixtureRequest) -> dict[str, Path]:
    """test_http's CA and the server certificate it signed (made with the openssl command,
    off the event loop)."""
    files: dict[str, Path] = request.getfixturevalue("tls_files")
    return files


@pytest.fixture
def no_proxies(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "SSL_CERT_FILE"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    yield monkeypatch


@pytest.mark.parametrize("call", [tokenize, complete], ids=["json", "stream"])
@pytest.mark.parametrize(
    "kind",
    [
        "tls-untrusted",
        "tls-to-a-plain-server",
        *BROKEN_HTTP,
        *PROXY_REFUSALS,
        "port-out-of-range",
    ],
)
async def test_a_failure_that_is_not_an_outage_is_named_and_opens_nothing(
    kind: str,
    call: Any,
    certificates: dict[str, Path],
    no_proxies: pytest.MonkeyPatch,
    traced: bool,
) -> None:
    """Before, each read "cannot reach ... Check that the server is up", was retried, and
    opened the breaker. The same with a tracer provider set (a span's attributes come from
    the URL: a port out of range must fail the request, not the tracing)."""
    async with misfit_server(kind, certificates) as case:
        fields = {"failures_to_open": 1, "max_retries": 2}
        if "proxy" in case:
            fields["proxy"] = case["proxy"]
        async with endpoint(case["base_url"], **fields) as small:
            for _ in range(2):  # sent again: the breaker did not open
                with pytest.raises(UpstreamFailure) as caught:
                    await call(small)
                failure = caught.value
                assert not not_sent(failure) and not failure.outage
                assert not small.availability.down
    assert case["said"] in failure.detail and failure.reason.startswith(case["reason"])
    assert case["fix"] in failure.detail
    assert "Check that the small vLLM server is up" not in failure.detail
    assert "cannot reach" not in failure.detail
    assert "attempts over" not in failure.detail  # not retried: each attempt would meet it
    assert not re.search(r"127\.0\.0\.1|http://|https://", failure.reason)  # no address


# --- a server that requires a client certificate ------------------------------------------------


CLIENT_CERTIFICATE_REFUSALS = {
    # Python's TLS (vLLM's own server, with --ssl-cert-reqs 2): no alert; the connection is
    # reset under the request (on loopback), or closed (over a network, where the request
    # arrives with the handshake's end); the relay looks once more, with a connection that
    # sends no request, to tell that from a server that is out
    "python-reset": 2,
    "python-closed": 2,
    # servers that send the TLS alert ("certificate required", "unknown CA") before they
    # close, as OpenSSL's and BoringSSL's own do (HAProxy, Envoy)
    "alert": 1,
}
"""How a TLS 1.3 server refuses a client that sent no certificate, or one it does not trust
(after the handshake, on the client's first read), and the connections it sees per
request."""


@asynccontextmanager
async def requiring_a_client_certificate(
    how: str, certificates: dict[str, Path]
) -> AsyncIterator[tuple[str, list[str]]]:
    """An https server that requires a client certificate its CA signed, refusing any other
    as `how` says; yields its origin and the connections it took."""
    tls = server_tls(certificates, client_certificates=True)
    connections: list[str] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(how)
        if how == "python-reset":
            await writer.start_tls(tls)  # asyncio's TLS server, as uvicorn's
            return
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        session = tls.wrap_bio(incoming, outgoing, server_side=True)
        while True:
            try:
                session.do_handshake()
                return  # a certificate it trusts was sent: not this server's case
            except ssl.SSLWantReadError:
                writer.write(outgoing.read())
                if not (received := await reader.read(65536)):
                    return
                incoming.write(received)
            except ssl.SSLError:  # no certificate, or an untrusted one: OpenSSL wrote the alert
                break
        alert = outgoing.read()
        if how == "alert":
            writer.write(alert)
        with contextlib.suppress(TimeoutError):  # read what came (the request): a close,
            async with asyncio.timeout(0.2):  # not a reset
                while await reader.read(65536):
                    pass
        writer.close()

    async with serving(handler) as origin:
        yield origin.replace("http://", "https://"), connections


@pytest.fixture(scope="module")
def untrusted_client(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A client certificate and its key, signed by no CA the server trusts (itself)."""
    folder = tmp_path_factory.mktemp("untrusted")
    certificate, key = folder / "client.pem", folder / "client-key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=stranger", "-keyout", str(key), "-out", str(certificate)),
        ],
        check=True,
        capture_output=True,
    )
    return str(certificate), str(key)


@pytest.mark.parametrize("call", [tokenize, complete], ids=["json", "stream"])
@pytest.mark.parametrize("how", list(CLIENT_CERTIFICATE_REFUSALS))
@pytest.mark.parametrize("cert", ["none", "untrusted"])
async def test_a_client_certificate_missing_or_refused_is_named_and_neither_retried_nor_an_outage(
    cert: str,
    how: str,
    call: Any,
    certificates: dict[str, Path],
    untrusted_client: tuple[str, str],
    no_proxies: pytest.MonkeyPatch,
) -> None:
    """Before, a server that wants a client certificate read as one that "closed the
    connection before answering": retried, counted as an outage, and the breaker opened."""
    fields: dict[str, Any] = {"verify": str(certificates["ca"]), "max_retries": 2}
    if cert == "untrusted":
        fields["cert"] = untrusted_client
    async with (
        requiring_a_client_certificate(how, certificates) as (origin, connections),
        endpoint(origin, failures_to_open=1, **fields) as small,
    ):
        for sent in (1, 2):  # sent again: the breaker did not open
            with pytest.raises(RelayError) as caught:
                await call(small)
            assert isinstance(caught.value, UpstreamFailure)  # the relay's error, named
            failure = caught.value
            assert not not_sent(failure) and not failure.outage
            assert not small.availability.down
            # one attempt: not retried as a connection lost before an answer
            assert len(connections) == sent * CLIENT_CERTIFICATE_REFUSALS[how]
    said = (
        "the server requires a TLS client certificate and none was sent"
        if cert == "none"
        else "the server refused the TLS client certificate"
    )
    assert said in failure.detail and failure.reason.startswith(said)
    assert "Set cert to" in failure.detail and "; 1 attempt." in failure.detail
    assert "closed the connection before answering" not in failure.detail
    assert not re.search(r"127\.0\.0\.1|http://|https://", failure.reason)  # no address


async def test_an_https_server_that_drops_requests_is_still_an_outage(
    certificates: dict[str, Path], no_proxies: pytest.MonkeyPatch
) -> None:
    """A server that takes the TLS connection (no client certificate wanted) and then drops
    each request is out, however the relay looked at it: retried, and counted."""
    requests: list[str] = []

    async def dropping(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line, _, _ = await read_request(reader)
        requests.append(line)
        writer.transport.abort()

    ca = str(certificates["ca"])
    async with (
        serving(dropping, server_tls(certificates)) as origin,
        endpoint(origin, verify=ca, failures_to_open=1, max_retries=1) as small,
    ):
        with pytest.raises(UpstreamFailure) as caught:
            await tokenize(small)
        assert caught.value.outage and small.availability.down
    assert len(requests) == 2  # retried
    assert "closed the connection before answering" in caught.value.detail
    assert "certificate" not in caught.value.detail
