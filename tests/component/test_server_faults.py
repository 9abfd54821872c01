"""``relaygen serve`` when its upstream servers fail: refused connections, 500s, stalls, streams
cut mid-way, failures in the middle of a generation. Each failure gets a clean OpenAI error (or
is absorbed), the server keeps serving, and nothing leaks: no tasks left on the server's loop,
no upstream connections piling up."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from typing import Any

import httpx
import openai
import pytest

from relay_integrations.relay import EndpointConfig, RelayConfig, SwitchPolicy
from relay_integrations.server import RelayServer, ServerSettings
from relay_integrations.testing.scripted_vllm import Fault, ScriptedVLLM, serving
from tests.fakes.capable_model import CAPABLE_CUES, capable_server
from tests.fakes.relay_http import ServedRelay, eventually, relay_http
from tests.fakes.tcp_table import established

QUESTION: Any = [{"role": "user", "content": "What is 7 * 6?"}]
ANSWER = "The answer is 42."
REASONING = (
    "The user writes: What is 7 * 6. Now I think about the best reply. A direct reply fits best "
    "here. Therefore, I will answer directly."
)
BODY = {"model": "large", "messages": QUESTION}
STALL = 5.0  # seconds an upstream stalls; the relay gives up after its read timeout (0.5 s)


@pytest.fixture(autouse=True)
def no_faults_left(upstream: ScriptedVLLM) -> Iterator[None]:
    yield
    for model in upstream.models.values():
        model.faults.clear()


def relay(
    large_url: str,
    small_url: str | None = None,
    policy: SwitchPolicy | None = None,
    settings: ServerSettings | None = None,
    **endpoint: Any,
) -> RelayServer:
    """A relay whose endpoints give up fast (`endpoint`: EndpointConfig fields of both)."""
    fast = {"max_retries": 1, "read_timeout": 2.0, "connect_timeout": 1.0, **endpoint}
    config = RelayConfig(
        large=EndpointConfig(base_url=large_url, model="large", **fast),
        small=EndpointConfig(base_url=small_url or large_url, model="small", **fast),
        cues=CAPABLE_CUES,
        policy=policy or SwitchPolicy(cooldown_tokens=0),
    )
    return RelayServer(config, settings)


@contextmanager
def kept_serving(server: RelayServer) -> Iterator[ServedRelay]:
    """Serve `server`; when the block ends (its faults spent), the tasks on the server's loop
    are back to what they were before the block and a normal request succeeds."""
    with relay_http(server) as served:
        baseline = served.tasks()
        yield served
        assert eventually(lambda: served.tasks() == baseline), (served.tasks(), baseline)
        assert served.relay.inflight == 0
        answer = httpx.post(f"{served.base_url}/chat/completions", json=BODY, timeout=30)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"] == ANSWER


def whole(served: ServedRelay, **fields: Any) -> httpx.Response:
    return httpx.post(f"{served.base_url}/chat/completions", json={**BODY, **fields}, timeout=30)


def streamed(served: ServedRelay) -> tuple[int, list[Any]]:
    """The status of a streamed request, and its events (JSON, or ``[DONE]``) or error body."""
    body = {**BODY, "stream": True}
    with httpx.stream("POST", f"{served.base_url}/chat/completions", json=body, timeout=30) as r:
        r.read()
        if r.status_code != 200:
            return r.status_code, [r.json()]
        lines = [line.removeprefix("data: ") for line in r.text.split("\n\n") if line]
        return 200, [line if line == "[DONE]" else json.loads(line) for line in lines]


def assert_openai_error(response_body: dict[str, Any], code: str, *in_message: str) -> None:
    """An OpenAI-shaped error with `code` and `in_message`, naming the request id and no
    upstream address (remote clients are not told internal URLs; the log has them)."""
    error = response_body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code
    for text in in_message:
        assert text in error["message"]
    assert "request id " in error["message"]
    assert "http://" not in json.dumps(response_body) and "127.0.0.1" not in error["message"]


def openai_client(served: ServedRelay) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.base_url, api_key="x", max_retries=0, timeout=30)


# --- refused connections --------------------------------------------------------------------


def test_an_upstream_refusing_connections_gets_a_quick_502_then_503_while_known_down(
    upstream: ScriptedVLLM,
) -> None:
    late = capable_server()  # its port is bound but not listening: connections are refused
    # one failed request opens the breaker here (five in a row by default: test_breaker_rules)
    refusing = relay(late.base_url, upstream.base_url, failures_to_open=1)
    with ExitStack() as later, kept_serving(refusing) as served:
        started = time.monotonic()
        response = whole(served)  # found down: one retry, after 0.5 s
        assert response.status_code == 502
        assert_openai_error(
            response.json(), "upstream_failed", "the large model's server", "no connection"
        )
        assert response.json()["error"]["type"] == "upstream_error"

        # known down now: at once, 503 with Retry-After, a status and not a 200 when streamed
        status, (body,) = streamed(served)
        assert status == 503
        assert_openai_error(body, "upstream_unavailable", "the large model's server", "known down")
        assert "retry in a few seconds" in body["error"]["message"]
        assert body["error"]["type"] == "service_unavailable"

        with openai_client(served) as client:
            with pytest.raises(openai.InternalServerError) as raised:
                client.chat.completions.create(model="large", messages=QUESTION)
            assert raised.value.status_code == 503
            assert raised.value.response.headers["retry-after"] == "1"
            with pytest.raises(openai.APIError):
                list(
                    client.chat.completions.create(
                        model="large",
                        messages=QUESTION,
                        stream=True,
                    )
                )
        assert time.monotonic() - started < 15
        later.enter_context(serving(late))  # the upstream comes up: a probe finds it
        assert eventually(lambda: whole(served).status_code == 200)


# --- 500s -----------------------------------------------------------------------------------


def test_an_upstream_answering_500_on_every_try_gets_502_naming_the_endpoint(
    upstream: ScriptedVLLM,
) -> None:
    with kept_serving(relay(upstream.base_url, max_retries=1)) as served:
        upstream.models["large"].faults[:] = [Fault(status=500)] * 2  # the try and the retry
        response = whole(served)
        assert response.status_code == 502
        assert_openai_error(
            response.json(),
            "upstream_failed",
            "the large model's server is unavailable",
            "it answered 500",
        )
        assert upstream.models["large"].faults == []

        upstream.models["large"].faults[:] = [Fault(status=500)] * 2
        with openai_client(served) as client, pytest.raises(openai.APIStatusError) as raised:
            list(client.chat.completions.create(model="large", messages=QUESTION, stream=True))
        assert raised.value.status_code == 502
        assert "the large model's server is unavailable" in raised.value.message


def test_a_small_endpoint_failing_is_absorbed_by_the_large_model(upstream: ScriptedVLLM) -> None:
    with kept_serving(relay(upstream.base_url, max_retries=0)) as served:
        upstream.models["small"].faults[:] = [Fault(status=500)]
        response = whole(served)
        assert response.status_code == 200
        body = response.json()
        assert body["choices"][0]["message"]["content"] == ANSWER
        assert body["choices"][0]["message"]["reasoning"] == REASONING
        assert body["relay"]["usage"]["small"]["completion_tokens"] == 0
        assert body["relay"]["large_share"] == 1


# --- stalls ---------------------------------------------------------------------------------


def test_a_stalled_upstream_gets_a_timeout_well_before_the_stall_ends(
    upstream: ScriptedVLLM,
) -> None:
    with kept_serving(relay(upstream.base_url, max_retries=0, read_timeout=0.5)) as served:
        for stream in (False, True):
            upstream.models["large"].faults[:] = [Fault(stall=STALL)]
            started = time.monotonic()
            if stream:
                status, (body,) = streamed(served)
            else:
                response = whole(served)
                status, body = response.status_code, response.json()
            assert time.monotonic() - started < STALL / 2
            assert status == 504
            assert_openai_error(body, "upstream_timeout", "the large model's server timed out")
            assert body["error"]["type"] == "upstream_timeout"


def test_a_stream_silent_while_an_upstream_stalls_gets_keep_alive_comments_clients_skip(
    upstream: ScriptedVLLM,
) -> None:
    """The small model's first turn stalls 1.2 s in the middle of the stream: the stream sends
    SSE comments meanwhile (a proxy's read timeout sees bytes), and the openai SDK, for chat
    completions and responses, reads the same generation as without them."""
    small = upstream.models["small"]
    quick = ServerSettings(sse_keepalive=0.2)
    with kept_serving(relay(upstream.base_url, settings=quick)) as served:
        small.faults[:] = [Fault(stall=1.2)]
        body = {**BODY, "stream": True}
        with httpx.stream("POST", f"{served.base_url}/chat/completions", json=body) as raw:
            events = [event for event in raw.read().decode().split("\n\n") if event]
        comments = [i for i, event in enumerate(events) if event == ": keep-alive"]
        assert len(comments) >= 3, events
        assert comments[0] > 1 and comments[-1] < len(events) - 2  # mid-stream, in the stall
        assert events[-1] == "data: [DONE]"

        client = openai_client(served)
        small.faults[:] = [Fault(stall=1.2)]
        chunks = list(client.chat.completions.create(model="large", messages=QUESTION, stream=True))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        assert "".join(getattr(d, "reasoning", None) or "" for d in deltas) == REASONING
        assert "".join(d.content or "" for d in deltas) == ANSWER

        small.faults[:] = [Fault(stall=1.2)]
        streamed_events = list(client.responses.create(model="large", input=QUESTION, stream=True))
        assert streamed_events[-1].type == "response.completed"
        assert streamed_events[-1].response.output_text == ANSWER


def test_keep_alive_comments_can_be_turned_off(upstream: ScriptedVLLM) -> None:
    upstream.models["small"].faults[:] = [Fault(stall=0.6)]
    silent = ServerSettings(sse_keepalive=0)
    with kept_serving(relay(upstream.base_url, settings=silent)) as served:
        body = {**BODY, "stream": True}
        with httpx.stream("POST", f"{served.base_url}/chat/completions", json=body) as raw:
            text = raw.read().decode()
    assert ": keep-alive" not in text and text.endswith("data: [DONE]\n\n")


# --- streams cut mid-way --------------------------------------------------------------------


def test_a_stream_cut_mid_way_is_resumed_and_the_answer_is_whole(upstream: ScriptedVLLM) -> None:
    large, small = upstream.models["large"], upstream.models["small"]
    with kept_serving(relay(upstream.base_url)) as served:
        reference = whole(served).json()
        cut_before = large.cut_short + small.cut_short

        large.faults[:] = [Fault(cut_after=3)]
        small.faults[:] = [Fault(cut_after=3)]
        response = whole(served)
        assert response.status_code == 200, response.text
        message = response.json()["choices"][0]["message"]
        assert message["content"] == reference["choices"][0]["message"]["content"] == ANSWER
        assert message["reasoning"] == reference["choices"][0]["message"]["reasoning"] == REASONING
        assert large.cut_short + small.cut_short == cut_before + 2  # both streams did break
        assert (
            response.json()["usage"]["completion_tokens"] == reference["usage"]["completion_tokens"]
        )
        assert (reference["relay"]["resumes"], response.json()["relay"]["resumes"]) == (0, 2)
        scrape = httpx.get(f"{served.url}/metrics").text
        assert "relay_resumed_streams_total 2.0" in scrape.splitlines()

        large.faults[:] = [Fault(cut_after=3)]
        status, events = streamed(served)
        assert status == 200
        assert events[-1] == "[DONE]"
        chunks = events[:-1]
        assert not any("error" in c for c in chunks)
        deltas = [c["choices"][0]["delta"] for c in chunks]
        assert "".join(d.get("reasoning", "") for d in deltas) == REASONING
        assert "".join(d.get("content") or "" for d in deltas) == ANSWER
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


# --- failures mid-generation ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("role", "faults", "policy", "written"),
    [
        pytest.param(
            "large",
            [Fault(), Fault(cut_after=4)],  # its second turn breaks after 4 tokens
            SwitchPolicy(cooldown_tokens=0, max_resumes=0),
            "The user writes: What is 7 * 6. Now I think about the best reply. A direct reply fits",
            id="large",
        ),
        pytest.param(
            "small",
            [Fault(cut_after=3)],  # its first turn breaks after 3 tokens
            SwitchPolicy(cooldown_tokens=0, max_resumes=0, on_small_failure="raise"),
            "The user writes: What is 7 * 6. Now I think about",
            id="small",
        ),
    ],
)
def test_a_failure_mid_generation_keeps_the_text_written_before_it(
    upstream: ScriptedVLLM, role: str, faults: list[Fault], policy: SwitchPolicy, written: str
) -> None:
    with kept_serving(relay(upstream.base_url, policy=policy, max_retries=0)) as served:
        upstream.models[role].faults[:] = list(faults)
        response = whole(served)
        assert response.status_code == 502
        body = response.json()
        assert_openai_error(body, "upstream_failed", f"the {role} model's server")
        partial = body["relay"]["partial"]
        assert partial["finish_reason"] == "error"
        assert partial["reasoning"] == written  # nothing written before the failure is lost
        assert REASONING.startswith(partial["reasoning"])
        assert partial["text"] == "<think>\n" + written
        assert partial["segments"][-1]["model"] == role
        assert partial["segments"][-1]["ended_by"] == "failed"
        assert partial["usage"][role]["completion_tokens"] > 0

        # streamed: the text arrives, then the error (with the same partial), then [DONE]
        upstream.models[role].faults[:] = list(faults)
        status, events = streamed(served)
        assert status == 200
        assert events[-1] == "[DONE]"
        error = events[-2]
        assert_openai_error(error, "upstream_failed", f"the {role} model's server")
        assert error["relay"]["partial"]["reasoning"] == written
        shown = "".join(e["choices"][0]["delta"].get("reasoning", "") for e in events[1:-2])
        assert shown and written.startswith(shown)

        upstream.models[role].faults[:] = list(faults)
        with openai_client(served) as client, pytest.raises(openai.APIError) as raised:
            for _ in client.chat.completions.create(model="large", messages=QUESTION, stream=True):
                pass
        assert f"the {role} model's server" in raised.value.message


# --- no leaks -------------------------------------------------------------------------------

ROUNDS = 5
CONCURRENT = 2  # generations at once in each round: one whole, one streamed
RESUMES_OFF = SwitchPolicy(cooldown_tokens=0, max_resumes=0)
FAULTS: dict[str, tuple[dict[str, Any], dict[str, Fault], int]] = {
    # kind: (relay settings, the fault each generation meets per model, the status it gets)
    "500": ({"max_retries": 1}, {"large": Fault(status=500)}, 502),  # on the try and the retry
    "stall": ({"max_retries": 0, "read_timeout": 0.5}, {"large": Fault(stall=STALL)}, 504),
    "cut and resumed": ({}, {"large": Fault(cut_after=3), "small": Fault(cut_after=2)}, 200),
    "cut beyond resumes": ({"policy": RESUMES_OFF}, {"large": Fault(cut_after=4)}, 502),
}


@pytest.mark.parametrize("kind", list(FAULTS))
def test_repeated_faults_leave_no_tasks_and_no_growing_connections(
    upstream: ScriptedVLLM, kind: str
) -> None:
    settings, faults, status = FAULTS[kind]
    tries = 2 if kind == "500" else 1
    bound = 2 * CONCURRENT  # a generation holds at most one connection to each endpoint

    def request(served: ServedRelay, stream: bool) -> None:
        body = {**BODY, "stream": stream}
        with httpx.stream("POST", f"{served.base_url}/chat/completions", json=body) as response:
            response.read()
            assert response.status_code == status, response.text
            if stream and status == 200:
                assert response.text.endswith("data: [DONE]\n\n")

    def fault_round(served: ServedRelay) -> None:
        for role, fault in faults.items():
            upstream.models[role].faults[:] = [fault] * tries * CONCURRENT
        with ThreadPoolExecutor(CONCURRENT) as pool:
            list(pool.map(lambda stream: request(served, stream), [False, True][:CONCURRENT]))
        for model in upstream.models.values():
            model.faults.clear()

    with kept_serving(relay(upstream.base_url, **settings)) as served:
        baseline = served.tasks()
        fault_round(served)
        assert eventually(lambda: len(established(upstream.port)) <= bound)
        after_one = len(established(upstream.port))
        for _ in range(ROUNDS - 1):
            fault_round(served)
        assert eventually(lambda: len(established(upstream.port)) <= after_one)
        assert eventually(lambda: served.tasks() == baseline)
