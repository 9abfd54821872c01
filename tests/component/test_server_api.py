"""``relaygen serve`` through the official ``openai`` clients and raw HTTP, over the capable
scripted upstream (no vLLM): answers, streams, tools, models, health, metrics, keys, request
ids, logs, the concurrency limit and client disconnects."""

from __future__ import annotations

import io
import json
import logging
import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from relay_integrations.relay import ModelUsage, RelayConfig, RelayResult, RelayStats
from relay_integrations.server import RelayServer, ServerSettings
from relay_integrations.server.logs import JsonFormatter
from relay_integrations.server.metrics import RelayMetrics
from relay_integrations.testing.scripted_vllm import ScriptedVLLM, serving
from tests.fakes.capable_model import capable_relay_config, capable_server
from tests.fakes.clients import off_loop
from tests.fakes.ports import refusing_port
from tests.fakes.relay_http import ServedRelay, eventually, relay_http

QUESTION: Any = [{"role": "user", "content": "What is 7 * 6?"}]
ANSWER = "The answer is 42."
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
POPULATION: Any = {
    "type": "function",
    "function": {
        "name": "get_population",
        "description": "The population of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


# --- servers --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def slow_upstream() -> Iterator[ScriptedVLLM]:
    """About 50 ms a token: a generation takes a few seconds, long enough to act during it."""
    with serving(capable_server(token_delay=0.05)) as running:
        yield running


@pytest.fixture(scope="module")
def served(upstream: ScriptedVLLM) -> Iterator[ServedRelay]:
    with relay_http(RelayServer(relay_config(upstream.base_url))) as running:
        yield running


@pytest.fixture(scope="module")
def client(served: ServedRelay) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=served.base_url, api_key="x") as running:
        yield running


def relay_config(url: str, small_url: str | None = None) -> RelayConfig:
    return capable_relay_config(url, small_url)


def metric_samples(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """``GET /metrics`` as {(sample name, labels): value}."""
    text = httpx.get(f"{url}/metrics").text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def metric(url: str, name: str, **labels: str) -> float | None:
    return metric_samples(url).get((name, frozenset(labels.items())))


def sse_events(response: httpx.Response) -> Iterator[str]:
    """The ``data:`` payloads of a server-sent event stream, as they arrive."""
    for line in response.iter_lines():
        if line:
            assert line.startswith("data: "), line
            yield line.removeprefix("data: ")


def chat_body(**fields: Any) -> dict[str, Any]:
    return {"model": "large", "messages": QUESTION, **fields}


def extra(obj: Any, name: str) -> Any:
    """A field the openai models keep as an extra (``reasoning``, ``relay``)."""
    return (obj.model_extra or {}).get(name)


# --- answers --------------------------------------------------------------------------------


def test_a_whole_completion_has_reasoning_content_usage_and_relay_figures(
    client: openai.OpenAI,
) -> None:
    response = client.chat.completions.create(model="large", messages=QUESTION)
    choice = response.choices[0]
    assert response.object == "chat.completion"
    assert response.id.startswith("chatcmpl-")
    assert response.model == "large"
    assert choice.message.role == "assistant"
    assert choice.message.content == ANSWER
    reasoning = extra(choice.message, "reasoning")
    assert reasoning and reasoning.startswith("The user writes: What is 7 * 6.")
    assert extra(choice.message, "reasoning_content") == reasoning
    assert choice.finish_reason == "stop"

    usage = response.usage
    assert usage is not None
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens  # every switch re-sends the transcript
    assert usage.completion_tokens_details is not None
    assert 0 < (usage.completion_tokens_details.reasoning_tokens or 0) < usage.completion_tokens

    relay = extra(response, "relay")
    assert relay["generation_id"] == response.id
    assert relay["switches"] >= 1
    assert 0 < relay["large_share"] < 1
    per_model = relay["usage"]
    assert per_model["large"]["completion_tokens"] + per_model["small"]["completion_tokens"] == (
        usage.completion_tokens
    )


def test_sampling_fields_reach_both_models_and_logit_bias_is_refused(
    client: openai.OpenAI, upstream: ScriptedVLLM
) -> None:
    for model in upstream.models.values():
        model.requests.clear()
    client.chat.completions.create(
        model="large",
        messages=QUESTION,
        presence_penalty=1.5,
        frequency_penalty=-0.5,
        extra_body={"min_p": 0.05, "repetition_penalty": 1.1, "top_k": 40},
    )
    bodies = upstream.models["large"].requests + upstream.models["small"].requests
    assert upstream.models["large"].requests and upstream.models["small"].requests
    for body in bodies:
        assert (body["presence_penalty"], body["frequency_penalty"]) == (1.5, -0.5)
        assert (body["min_p"], body["repetition_penalty"], body["top_k"]) == (0.05, 1.1, 40)
    with pytest.raises(openai.BadRequestError, match="tokenizers") as refused:
        client.chat.completions.create(model="large", messages=QUESTION, logit_bias={"7": 5})
    assert refused.value.body["param"] == "logit_bias"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError, match="presence_penalty"):
        client.chat.completions.create(model="large", messages=QUESTION, presence_penalty=3)


async def test_the_async_client_gets_the_same_answer(served: ServedRelay) -> None:
    async with await off_loop(openai.AsyncOpenAI, base_url=served.base_url, api_key="x") as client:
        response = await client.chat.completions.create(model="large", messages=QUESTION)
    assert response.choices[0].message.content == ANSWER
    assert extra(response.choices[0].message, "reasoning")
    assert extra(response, "relay")["switches"] >= 1


def test_a_stream_sends_the_role_then_reasoning_then_content_then_usage(
    client: openai.OpenAI,
) -> None:
    whole = client.chat.completions.create(model="large", messages=QUESTION)
    chunks = list(
        client.chat.completions.create(
            model="large",
            messages=QUESTION,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    kinds, reasoning, content = [], [], []
    for chunk in chunks[1:-2]:
        delta = chunk.choices[0].delta
        assert chunk.choices[0].finish_reason is None
        if extra(delta, "reasoning"):
            assert extra(delta, "reasoning_content") == extra(delta, "reasoning")
            kinds.append("reasoning")
            reasoning.append(extra(delta, "reasoning"))
        if delta.content:
            kinds.append("content")
            content.append(delta.content)
    assert kinds == sorted(kinds, reverse=True)  # every reasoning delta before any content
    assert "".join(reasoning) == extra(whole.choices[0].message, "reasoning")
    assert "".join(content) == whole.choices[0].message.content == ANSWER

    finish = chunks[-2]
    assert finish.choices[0].finish_reason == "stop"
    assert extra(finish, "relay")["generation_id"] == finish.id
    assert extra(finish, "relay")["switches"] >= 1

    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None and whole.usage is not None
    assert last.usage.completion_tokens == whole.usage.completion_tokens
    assert last.usage.prompt_tokens_details is not None
    assert last.usage.prompt_tokens_details.cached_tokens


async def test_an_async_stream_without_include_usage_sends_no_usage_chunk(
    served: ServedRelay,
) -> None:
    async with await off_loop(openai.AsyncOpenAI, base_url=served.base_url, api_key="x") as client:
        stream = await client.chat.completions.create(
            model="large",
            messages=QUESTION,
            stream=True,
        )
        chunks = [chunk async for chunk in stream]
    assert all(chunk.usage is None and chunk.choices for chunk in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ANSWER


def test_the_raw_event_stream_is_sse_and_ends_with_done(served: ServedRelay) -> None:
    body = chat_body(stream=True, stream_options={"include_usage": True})
    with httpx.stream("POST", f"{served.base_url}/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        events = list(sse_events(response))
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop" and "relay" in chunks[-2]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0


# --- tools and structured answers -----------------------------------------------------------


def arguments(response: Any) -> tuple[str, dict[str, Any]]:
    """The name and parsed arguments of the single tool call of a whole response."""
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id
    return call.function.name, json.loads(call.function.arguments)


def test_tool_choice_required_forces_a_call_with_json_arguments(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model="large",
        messages=[{"role": "user", "content": "How is the weather in Paris for 3 days?"}],
        tools=[WEATHER, POPULATION],
        tool_choice="required",
    )
    assert arguments(response) == ("get_weather", {"city": "Paris", "days": 3})
    assert not response.choices[0].message.content


def test_a_named_tool_choice_calls_that_tool(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model="large",
        messages=[{"role": "user", "content": "How is the weather in Paris for 3 days?"}],
        tools=[WEATHER, POPULATION],
        tool_choice={"type": "function", "function": {"name": "get_population"}},
    )
    assert arguments(response) == ("get_population", {"city": "Paris"})


def test_tool_choice_auto_gives_hermes_calls_whole_and_streamed(client: openai.OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "Use get_weather for Paris."}]
    response = client.chat.completions.create(
        model="large",
        messages=messages,
        tools=[WEATHER, POPULATION],
        tool_choice="auto",
    )
    name, args = arguments(response)
    assert name == "get_weather" and args["city"] == "Paris"
    assert "<tool_call>" not in (response.choices[0].message.content or "")

    chunks = list(
        client.chat.completions.create(
            model="large",
            messages=messages,
            tools=[WEATHER, POPULATION],
            tool_choice="auto",
            stream=True,
        )
    )
    streamed = [call for c in chunks for call in c.choices[0].delta.tool_calls or []]
    assert [(c.index, c.function and c.function.name) for c in streamed] == [(0, "get_weather")]
    assert streamed[0].function is not None and streamed[0].function.arguments is not None
    assert json.loads(streamed[0].function.arguments) == args
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not "".join(c.choices[0].delta.content or "" for c in chunks)


def test_a_json_schema_response_format_gives_content_valid_against_the_schema(
    client: openai.OpenAI,
) -> None:
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "population": {"type": "integer"},
            "capital": {"type": "boolean"},
        },
        "required": ["city", "population", "capital"],
        "additionalProperties": False,
    }
    response = client.chat.completions.create(
        model="large",
        messages=[{"role": "user", "content": "Tell me about Paris, population 2102650."}],
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}},
    )
    answer = json.loads(response.choices[0].message.content or "")
    assert set(answer) == {"city", "population", "capital"}
    assert isinstance(answer["city"], str)
    assert isinstance(answer["population"], int) and not isinstance(answer["population"], bool)
    assert isinstance(answer["capital"], bool)
    assert answer == {"city": "Paris", "population": 2102650, "capital": True}
    assert extra(response.choices[0].message, "reasoning")  # it still reasoned first


# --- models and health ----------------------------------------------------------------------


def test_models_lists_the_served_names(client: openai.OpenAI) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == ["large", "large+small"]
    assert all(m.object == "model" and extra(m, "max_model_len") == 4096 for m in models)


def test_health_is_ok_when_both_upstreams_answer(served: ServedRelay) -> None:
    response = httpx.get(f"{served.url}/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "large": "ok", "small": "ok"}


@pytest.mark.parametrize("policy", ["use_large", "raise"])
def test_health_names_an_unreachable_small_upstream(upstream: ScriptedVLLM, policy: str) -> None:
    """The large model alone can serve (degraded, 200) unless the policy says raise (503)."""
    with refusing_port() as port:
        config = relay_config(upstream.base_url, small_url=f"http://127.0.0.1:{port}/v1")
        policy_update = config.policy.model_copy(update={"on_small_failure": policy})
        config = config.model_copy(update={"policy": policy_update})
        with relay_http(RelayServer(config)) as served:
            response = httpx.get(f"{served.url}/health")
    body = response.json()
    if policy == "use_large":
        assert (response.status_code, body["status"]) == (200, "degraded")
    else:
        assert (response.status_code, body["status"]) == (503, "unavailable")
    assert body["large"] == "ok"
    assert body["small"] == "unavailable"  # why: in the log, not to whoever probes


def test_health_is_503_naming_an_unreachable_large_upstream(
    upstream: ScriptedVLLM, caplog: pytest.LogCaptureFixture
) -> None:
    with refusing_port() as port:
        config = relay_config(f"http://127.0.0.1:{port}/v1", small_url=upstream.base_url)
        with relay_http(RelayServer(config)) as served:
            response = httpx.get(f"{served.url}/health")
    assert response.status_code == 503
    assert response.json() == {"status": "unavailable", "large": "unavailable", "small": "ok"}
    assert "the large model's server is unavailable: unreachable: it refused the connection" in (
        caplog.text
    )


# --- metrics --------------------------------------------------------------------------------


def test_metrics_count_the_small_prompts_warm_up_apart_from_the_tokens() -> None:
    metrics = RelayMetrics()
    used = {"large": ModelUsage(prompt_tokens=40), "small": ModelUsage(prompt_tokens=60)}
    warm_up = ModelUsage(requests=1, prompt_tokens=900, cached_tokens=128, completion_tokens=1)
    stats = RelayStats(
        large_share=1.0,
        switches=0,
        seconds={"large": 1.0, "small": 0.0},
        total_seconds=1.0,
        time_to_first_token=None,
        warm_up=warm_up,
    )
    metrics.observe(
        RelayResult(
            generation_id="g",
            text="",
            reasoning="",
            answer="",
            finish_reason="stop",
            segments=[],
            usage=used,
            stats=stats,
        )
    )

    def value(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    assert value("relay_warm_up_tokens_total", kind="prompt") == 900
    assert value("relay_warm_up_tokens_total", kind="cached") == 128
    assert value("relay_tokens_total", model="small", kind="prompt") == 60


def test_metrics_count_requests_tokens_switches_and_generations(upstream: ScriptedVLLM) -> None:
    with relay_http(RelayServer(relay_config(upstream.base_url))) as served:
        response = httpx.post(f"{served.base_url}/chat/completions", json=chat_body())
        assert response.status_code == 200
        relay = response.json()["relay"]
        path = "/v1/chat/completions"
        assert eventually(  # counted as the request ends, just after its last byte
            lambda: metric(served.url, "relay_requests_total", path=path, status="200") == 1
        )
        samples = metric_samples(served.url)

    def value(name: str, **labels: str) -> float | None:
        return samples.get((name, frozenset(labels.items())))

    large, small = relay["usage"]["large"], relay["usage"]["small"]
    assert value("relay_tokens_total", model="large", kind="cached") == large["cached_tokens"] > 0
    assert value("relay_tokens_total", model="large", kind="prompt") == large["prompt_tokens"]
    assert (
        value("relay_tokens_total", model="small", kind="completion")
        == (small["completion_tokens"])
    )
    assert value("relay_switches_total") == relay["switches"] >= 1
    assert value("relay_generation_seconds_count") == 1
    assert value("relay_large_share_count") == 1
    assert value("relay_inflight_generations") == 0.0
    assert value("relay_rejected_total") == 0


def test_metrics_watch_the_event_loop_while_the_server_runs(upstream: ScriptedVLLM) -> None:
    with relay_http(RelayServer(relay_config(upstream.base_url))) as served:
        assert eventually(
            lambda: (metric(served.url, "relay_event_loop_lag_seconds_count") or 0) >= 3
        )
        samples = metric_samples(served.url)
    count = samples[("relay_event_loop_lag_seconds_count", frozenset())]
    total = samples[("relay_event_loop_lag_seconds_sum", frozenset())]
    assert 0 <= total / count < 1.0  # the mean lateness of an idle loop's timer, in seconds


# --- API keys -------------------------------------------------------------------------------


def test_api_keys_guard_the_api_but_not_health_or_metrics(upstream: ScriptedVLLM) -> None:
    relay = RelayServer(relay_config(upstream.base_url), ServerSettings(api_keys=["k1", "k2"]))
    with relay_http(relay) as served:
        url = f"{served.base_url}/chat/completions"
        refused = [
            httpx.post(url, json=chat_body()),
            httpx.post(url, json=chat_body(), headers={"Authorization": "Bearer k3"}),
            httpx.post(url, json=chat_body(), headers={"Authorization": "Basic k1"}),
            httpx.get(f"{served.base_url}/models"),
        ]
        for response in refused:
            assert response.status_code == 401
            error = response.json()["error"]
            assert error["code"] == "invalid_api_key"
            assert error["type"] == "authentication_error"
            assert set(error) == {"message", "type", "param", "code"}
        assert "Authorization: Bearer" in refused[0].json()["error"]["message"]
        assert refused[0].headers["x-request-id"]  # refusals carry the request id too

        for key in ("k1", "k2"):
            with openai.OpenAI(base_url=served.base_url, api_key=key) as client:
                answer = client.chat.completions.create(model="large", messages=QUESTION)
                assert answer.choices[0].message.content == ANSWER
        with (
            openai.OpenAI(base_url=served.base_url, api_key="wrong", max_retries=0) as client,
            pytest.raises(openai.AuthenticationError) as raised,
        ):
            client.chat.completions.create(model="large", messages=QUESTION)
        assert raised.value.status_code == 401
        assert raised.value.code == "invalid_api_key"

        assert httpx.get(f"{served.url}/health").status_code == 200
        metrics = httpx.get(f"{served.url}/metrics")
        assert metrics.status_code == 200
        assert 'relay_requests_total{path="/v1/chat/completions",status="401"} 4.0' in metrics.text


# --- request ids ----------------------------------------------------------------------------


def upstream_headers(upstream: ScriptedVLLM, generation_id: str) -> list[dict[str, str]]:
    """The headers of every upstream completion request of one generation."""
    return [
        headers
        for model in upstream.models.values()
        for headers in model.headers
        if headers.get("x-session-id") == generation_id
    ]


def test_a_generated_request_id_names_the_generation_upstream(
    served: ServedRelay, upstream: ScriptedVLLM
) -> None:
    response = httpx.post(f"{served.base_url}/chat/completions", json=chat_body())
    rid = response.headers["x-request-id"]
    assert len(rid) == 32 and int(rid, 16) >= 0  # a fresh uuid4, hex
    generation_id = response.json()["id"]
    assert generation_id == f"chatcmpl-{rid}"
    sent = upstream_headers(upstream, generation_id)
    assert len(sent) >= 3  # large, small, large, ..., answer
    numbers = sorted(int(h["x-request-id"].removeprefix(f"{generation_id}-")) for h in sent)
    assert numbers == list(range(1, len(sent) + 1))  # one unique id per upstream request


def test_a_client_request_id_is_echoed_and_prefixes_the_upstream_ids(
    served: ServedRelay, upstream: ScriptedVLLM
) -> None:
    ids = []
    for _ in range(2):  # the same client id twice: each generation still gets its own ids
        response = httpx.post(
            f"{served.base_url}/chat/completions",
            json=chat_body(),
            headers={"X-Request-Id": "abc"},
        )
        assert response.status_code == 200
        assert response.headers["x-request-id"] == "abc"
        generation_id = response.json()["id"]
        assert generation_id.startswith("chatcmpl-abc-")
        sent = upstream_headers(upstream, generation_id)
        assert sent
        assert all(h["x-request-id"].startswith(f"{generation_id}-") for h in sent)
        ids.append(generation_id)
    assert ids[0] != ids[1]


@pytest.mark.parametrize(
    ("sent", "upstream_prefix"),
    [
        pytest.param("caf\xe9 au lait".encode("latin-1"), "chatcmpl-caf__au_lait-", id="latin-1"),
        pytest.param(b"t" * 5000, f"chatcmpl-{'t' * 64}-", id="long"),
    ],
)
def test_an_odd_client_request_id_is_made_safe_for_the_upstream_headers(
    served: ServedRelay, upstream: ScriptedVLLM, sent: bytes, upstream_prefix: str
) -> None:
    response = httpx.post(
        f"{served.base_url}/chat/completions", json=chat_body(), headers=[(b"X-Request-Id", sent)]
    )
    assert response.status_code == 200, response.text  # not a 500 from encoding the header
    assert response.headers.get_list("x-request-id") == [sent.decode("latin-1")]  # as sent
    generation_id = response.json()["id"]
    assert generation_id.startswith(upstream_prefix)
    assert len(generation_id) == len(upstream_prefix) + 8
    assert upstream_headers(upstream, generation_id)


def test_errors_and_other_routes_carry_the_request_id(served: ServedRelay) -> None:
    for response in (
        httpx.get(f"{served.url}/health", headers={"X-Request-Id": "h-1"}),
        httpx.get(f"{served.url}/nowhere", headers={"X-Request-Id": "h-2"}),
        httpx.post(
            f"{served.base_url}/chat/completions", content=b"{", headers={"X-Request-Id": "h-3"}
        ),
    ):
        assert response.headers["x-request-id"] == response.request.headers["x-request-id"]


# --- structured logs ------------------------------------------------------------------------


@contextmanager
def json_logs() -> Iterator[io.StringIO]:
    """The relay's log records as JSON lines, while the block runs."""
    logger = logging.getLogger("relay_integrations")
    lines = io.StringIO()
    handler = logging.StreamHandler(lines)
    handler.setFormatter(JsonFormatter())
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_json_logs_tie_the_request_and_its_generation_to_one_request_id(
    served: ServedRelay,
) -> None:
    with json_logs() as lines:
        response = httpx.post(f"{served.base_url}/chat/completions", json=chat_body())

        def records() -> list[dict[str, Any]]:
            return [json.loads(line) for line in lines.getvalue().splitlines()]

        assert eventually(lambda: any(r["msg"] == "request" for r in records()))
    rid, generation_id = response.headers["x-request-id"], response.json()["id"]
    mine = [r for r in records() if r.get("request_id") == rid]
    (request,) = [r for r in mine if r["msg"] == "request"]
    (done,) = [r for r in mine if r["msg"] == "generation done"]
    assert request["path"] == "/v1/chat/completions"
    assert request["method"] == "POST"
    assert request["status"] == 200
    assert request["level"] == "info"
    assert done["generation_id"] == generation_id
    assert done["switches"] == response.json()["relay"]["switches"]
    assert done["completion_tokens"] == response.json()["usage"]["completion_tokens"]


# --- the concurrency limit ------------------------------------------------------------------


def test_past_the_concurrency_limit_a_request_gets_429_until_a_slot_frees(
    slow_upstream: ScriptedVLLM,
) -> None:
    settings = ServerSettings(max_concurrent_generations=2, retry_after=3)
    with relay_http(RelayServer(relay_config(slow_upstream.base_url), settings)) as served:
        url = f"{served.base_url}/chat/completions"
        with ExitStack() as stack:
            http = stack.enter_context(httpx.Client(timeout=60))
            streams = []
            for _ in range(2):
                response = stack.enter_context(
                    http.stream("POST", url, json=chat_body(stream=True))
                )
                events = sse_events(response)
                assert json.loads(next(events))["choices"][0]["delta"]["role"] == "assistant"
                streams.append(events)  # admitted: the role chunk follows the admission

            busy = httpx.post(url, json=chat_body())
            assert busy.status_code == 429
            assert busy.headers["retry-after"] == "3"
            assert busy.json()["error"]["code"] == "too_many_generations"
            assert busy.json()["error"]["type"] == "rate_limit_error"
            with (
                openai.OpenAI(base_url=served.base_url, api_key="x", max_retries=0) as client,
                pytest.raises(openai.RateLimitError) as raised,
            ):
                client.chat.completions.create(model="large", messages=QUESTION)
            assert raised.value.response.headers["retry-after"] == "3"

            for events in streams:  # both admitted streams run to their end
                rest = list(events)
                assert rest[-1] == "[DONE]"
                assert json.loads(rest[-2])["choices"][0]["finish_reason"] == "stop"

        after = httpx.post(url, json=chat_body(), timeout=60)
        assert after.status_code == 200
        assert after.json()["choices"][0]["message"]["content"] == ANSWER
        assert metric(served.url, "relay_rejected_total") == 2
        assert metric(served.url, "relay_inflight_generations") == 0


# --- client disconnects ---------------------------------------------------------------------


@contextmanager
def posted_whole(url: str, body: dict[str, Any]) -> Iterator[None]:
    """A non-streaming request sent on a raw socket, which is closed (the client leaves)
    when the block ends, however long the server has been working on it."""
    parsed = httpx.URL(url)
    payload = json.dumps(body).encode()
    head = (
        f"POST {parsed.raw_path.decode()} HTTP/1.1\r\nHost: {parsed.host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    with socket.create_connection((parsed.host, parsed.port or 80), timeout=60) as sock:
        sock.sendall(head.encode() + payload)
        yield


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_a_client_leaving_cuts_the_upstream_request(
    slow_upstream: ScriptedVLLM, stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    models = slow_upstream.models.values()

    def active() -> int:
        return sum(m.active for m in models)

    def started() -> int:
        return sum(len(m.requests) for m in models)

    cut_before = sum(m.cut_short for m in models)
    with relay_http(RelayServer(relay_config(slow_upstream.base_url))) as served:
        baseline = served.tasks()
        url = f"{served.base_url}/chat/completions"
        with httpx.Client(timeout=60) as http:
            if stream:
                with http.stream("POST", url, json=chat_body(stream=True)) as response:
                    reasoning = 0
                    for event in sse_events(response):
                        delta = json.loads(event)["choices"][0]["delta"]
                        reasoning += bool(delta.get("reasoning"))
                        if reasoning == 3:
                            break
                    # a model is writing when the client leaves (not a hand-off's instant
                    # between two requests: the generation goes on while the client waits;
                    # two at once while a hand-off's next request is opened ahead)
                    assert eventually(lambda: active() >= 1)
            else:
                with posted_whole(url, chat_body()):  # the client leaves mid-reasoning
                    assert eventually(lambda: active() >= 1)  # a model is writing
                    assert served.relay.inflight == 1
            left_active, left_started = active(), started()
        assert eventually(lambda: active() == 0)
        cut = sum(m.cut_short for m in models) - cut_before
        new_requests = started() - left_started
        # At most the hand-off in flight when the server noticed starts one more request; the
        # request that was writing (or that one) is closed mid-stream, not run to its end.
        assert new_requests <= 1
        assert cut >= 1 or (left_active == 0 and new_requests == 0), (cut, left_active)
        assert eventually(lambda: metric(served.url, "relay_inflight_generations") == 0)
        assert metric(served.url, "relay_errors_total", kind="client_disconnected") == 1
        assert eventually(lambda: served.tasks() == baseline)
        assert served.relay.inflight == 0
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]  # a disconnect is no server error
