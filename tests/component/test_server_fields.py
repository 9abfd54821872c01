"""Every field of an OpenAI chat completion request (and the vLLM fields clients send in
``extra_body``) has one fate at ``relaygen serve``: honoured, refused with the reason (400
naming the field, no upstream request), or ignored because it cannot change the answer (200,
and it never reaches a model). One row per field and value, the table of docs/deployment.md."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from relay_integrations.server import RelayServer
from relay_integrations.server.fields import IGNORED_FIELDS, REFUSED
from relay_integrations.server.responses_request import (
    RESPONSES_IGNORED,
    RESPONSES_OFF_VALUES,
    RESPONSES_REFUSED,
    ResponsesRequest,
)
from relay_integrations.testing.qwen3_template import THINKING_OFF
from relay_integrations.testing.scripted_vllm import ScriptedVLLM
from tests.fakes.capable_model import WEATHER_TOOL as TOOL
from tests.fakes.capable_model import capable_relay_config
from tests.fakes.relay_http import ServedRelay, relay_http

DOCS = Path(__file__).resolve().parents[2] / "docs" / "deployment.md"
USER = {"role": "user", "content": "What is 7 * 6?"}
Upstream = list[dict[str, Any]]  # the completion requests both models received


def sent(name: str, value: Any) -> Callable[[httpx.Response, Upstream], bool]:
    return lambda response, bodies: all(body.get(name) == value for body in bodies)


def budget(limit: int) -> Callable[[httpx.Response, Upstream], bool]:
    return lambda response, bodies: all(body["max_tokens"] <= limit for body in bodies)


def prompted(text: str) -> Callable[[httpx.Response, Upstream], bool]:
    return lambda response, bodies: all(text in body["prompt"] for body in bodies)


def streamed(response: httpx.Response, bodies: Upstream) -> bool:
    return response.text.endswith("data: [DONE]\n\n")


def streamed_usage(response: httpx.Response, bodies: Upstream) -> bool:
    events = [json.loads(line[6:]) for line in response.text.split("\n\n")[:-2] if line]
    return streamed(response, bodies) and "usage" in events[-1] and events[-1]["choices"] == []


def stops_sent(response: httpx.Response, bodies: Upstream) -> bool:
    return any("Paris" in (body.get("stop") or []) for body in bodies)


def called(response: httpx.Response, bodies: Upstream) -> bool:
    message = response.json()["choices"][0]["message"]
    return bool(message["tool_calls"][0]["function"]["name"] == "get_weather")


def json_answer(response: httpx.Response, bodies: Upstream) -> bool:
    return isinstance(json.loads(response.json()["choices"][0]["message"]["content"]), dict)


def answered(response: httpx.Response, bodies: Upstream) -> bool:
    return bool(response.json()["choices"][0]["message"]["content"])


@dataclass(frozen=True)
class Row:
    field: str
    value: Any
    fate: str  # honoured | refused | ignored
    check: Callable[[httpx.Response, Upstream], bool] | str | None = None
    """honoured: what the upstream requests or the answer show; refused: in the message."""
    extra: dict[str, Any] | None = None  # other fields the row needs (tools for tool_choice)


ROWS = [
    Row("model", "large", "honoured", answered),
    Row("messages", [USER], "honoured", prompted("What is 7 * 6?")),
    Row("stream", True, "honoured", streamed),
    Row("stream_options", {"include_usage": True}, "honoured", streamed_usage, {"stream": True}),
    Row("stream_options", {"include_obfuscation": True}, "ignored", streamed, {"stream": True}),
    Row("max_tokens", 6, "honoured", budget(6)),
    Row("max_completion_tokens", 6, "honoured", budget(6)),
    Row("temperature", 0.3, "honoured", sent("temperature", 0.3)),
    Row("top_p", 0.9, "honoured", sent("top_p", 0.9)),
    Row("top_k", 40, "honoured", sent("top_k", 40)),
    Row("min_p", 0.05, "honoured", sent("min_p", 0.05)),
    Row("presence_penalty", 0.5, "honoured", sent("presence_penalty", 0.5)),
    Row("frequency_penalty", -0.5, "honoured", sent("frequency_penalty", -0.5)),
    Row("repetition_penalty", 1.1, "honoured", sent("repetition_penalty", 1.1)),
    Row("seed", 7, "honoured", sent("seed", 7)),
    Row("stop", ["Paris"], "honoured", stops_sent),
    Row("stop", ["a", "b", "c", "d", "e"], "refused", "at most 4"),
    Row("stop", ["x" * 257], "refused", "at most 256"),
    Row("tools", [TOOL], "honoured", prompted('"name": "get_weather"')),
    Row("tool_choice", "required", "honoured", called, {"tools": [TOOL]}),
    Row(
        "parallel_tool_calls",
        False,
        "honoured",
        called,
        {"tools": [TOOL], "tool_choice": "required"},
    ),
    Row("response_format", {"type": "json_object"}, "honoured", json_answer),
    Row("chat_template_kwargs", {"enable_thinking": False}, "honoured", prompted(THINKING_OFF)),
    Row("n", 1, "honoured", answered),
    Row("n", 2, "refused", "one choice per request"),
    Row("logprobs", False, "honoured", answered),
    Row("logprobs", True, "refused", "two tokenizers"),
    Row("top_logprobs", 0, "honoured", answered),
    Row("top_logprobs", 3, "refused", "two tokenizers"),
    Row("logit_bias", {}, "honoured", answered),
    Row("logit_bias", {"7": 5}, "refused", "tokenizers"),
    Row("store", False, "honoured", answered),
    Row("store", True, "refused", "OpenAI platform option"),
    Row("modalities", ["text"], "honoured", answered),
    Row("modalities", ["text", "audio"], "refused", "text only"),
    Row("audio", {"voice": "alloy", "format": "wav"}, "refused", "text only"),
    Row("functions", [TOOL["function"]], "refused", "send tools="),
    Row("function_call", "auto", "refused", "send tool_choice"),
    Row("reasoning_effort", "low", "refused", "the relay always reasons"),
    Row("verbosity", "low", "refused", "OpenAI platform option"),
    Row("service_tier", "flex", "refused", "OpenAI platform option"),
    Row("moderation", {"model": "omni-moderation-latest"}, "refused", "OpenAI platform option"),
    Row("web_search_options", {}, "refused", "no web search"),
    Row("user", "user-1234", "ignored", answered),
    Row("safety_identifier", "user-1234", "ignored", answered),
    Row("metadata", {"team": "search"}, "ignored", answered),
    Row("prompt_cache_key", "tenant-7", "ignored", answered),
    Row("prompt_cache_retention", "24h", "ignored", answered),
    Row("prompt_cache_options", {"mode": "implicit"}, "ignored", answered),
    Row("prediction", {"type": "content", "content": "42"}, "ignored", answered),
    # vLLM's own fields, as clients send them in extra_body
    Row("best_of", 2, "refused", "one generation"),
    Row("use_beam_search", True, "refused", "one sequence over two"),
    Row("min_tokens", 5, "refused", "hand-off"),
    Row("stop_token_ids", [1], "refused", "hand-offs"),
    Row("ignore_eos", True, "refused", "use max_tokens"),
    Row("include_stop_str_in_output", True, "refused", "sets it on every request"),
    Row("echo", True, "refused", "sets it on every request"),
    Row("add_special_tokens", True, "refused", "sets it on every request"),
    Row("return_token_ids", True, "refused", "sets it on every request"),
    Row("prompt_logprobs", 1, "refused", "two tokenizers"),
    Row("structured_outputs", {"json": {"type": "object"}}, "refused", "use response_format"),
    Row("guided_json", {"type": "object"}, "refused", "use response_format"),
    Row("guided_regex", "[0-9]+", "refused", "use response_format"),
    Row("guided_choice", ["yes", "no"], "refused", "use response_format"),
    Row("guided_grammar", "root ::= 'a'", "refused", "use response_format"),
    Row("guided_decoding_backend", "xgrammar", "refused", "use response_format"),
    Row("chat_template", "{{ messages }}", "refused", "own chat template"),
    Row("add_generation_prompt", False, "refused", "new assistant turn"),
    Row("continue_final_message", True, "refused", "new assistant turn"),
    Row("request_id", "abc", "refused", "X-Request-Id"),
    Row("temprature", 0.3, "refused", "did you mean 'temperature'?"),  # any unknown field
]


@pytest.fixture(scope="module")
def served(upstream: ScriptedVLLM) -> Iterator[ServedRelay]:
    config = capable_relay_config(upstream.base_url)
    with relay_http(RelayServer(config)) as running:
        yield running


@pytest.mark.parametrize(
    "row", ROWS, ids=[f"{row.field}={json.dumps(row.value)[:24]}-{row.fate}" for row in ROWS]
)
def test_each_field_is_honoured_refused_with_the_reason_or_ignored(
    served: ServedRelay, upstream: ScriptedVLLM, row: Row
) -> None:
    for model in upstream.models.values():
        model.requests.clear()
    body = {"model": "large", "messages": [USER], **(row.extra or {}), row.field: row.value}
    response = httpx.post(f"{served.base_url}/chat/completions", json=body, timeout=60)
    bodies = upstream.models["large"].requests + upstream.models["small"].requests
    if row.fate == "refused":
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == row.field
        assert isinstance(row.check, str) and row.check in error["message"], error["message"]
        assert bodies == []
        return
    assert response.status_code == 200, response.text
    assert bodies
    assert callable(row.check) and row.check(response, bodies)
    if row.fate == "ignored":  # it reaches no model
        assert not any("obfuscation" in json.dumps(body) for body in bodies)
        if row.field != "stream_options":  # the relay's own stream_options go upstream
            assert all(row.field not in body for body in bodies)


def docs_table() -> dict[str, str]:
    """The field table of docs/deployment.md: {field: fate cell}."""
    text = DOCS.read_text()
    table = text.split("<!-- chat request fields -->", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| ([^|]+) \|", table, flags=re.M)
    return {field: fate.strip() for field, fate in rows}


def test_the_docs_table_has_each_field_with_its_fate() -> None:
    documented = docs_table()
    for row in ROWS:
        name = (
            "stream_options.include_obfuscation"
            if row.extra == {"stream": True} and row.fate == "ignored"
            else row.field
        )
        if name == "temprature":
            continue  # the unknown field's row is "any other field"
        assert name in documented, name
        assert row.fate in documented[name], (name, documented[name])
    assert "any other field" in documented
    assert set(REFUSED) | set(IGNORED_FIELDS) <= set(documented)  # no fate left undocumented


def test_the_responses_table_has_each_field_with_its_fate() -> None:
    text = DOCS.read_text()
    table = text.split("<!-- responses request fields -->", 1)[1].split("\n\n", 1)[0]
    documented: dict[str, str] = {}
    for cell, fate in re.findall(r"^\| ([^|]+) \| ([^|]+) \|", table, flags=re.M):
        for name in re.findall(r"`([^`]+)`", cell):
            documented[name] = fate.strip()
    assert set(ResponsesRequest.model_fields) <= set(documented)
    assert {documented[name] for name in RESPONSES_IGNORED} == {"ignored"}
    for name in RESPONSES_REFUSED:
        off = "honoured when" if name in RESPONSES_OFF_VALUES else "refused"
        assert documented[name].startswith(off), (name, documented[name])
    assert "any other field" in documented
