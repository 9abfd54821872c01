"""Every malformed or unservable request gets an OpenAI-shaped 4xx naming what to fix, and never
reaches the upstream servers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from relay_integrations.server import RelayServer, ServerSettings
from relay_integrations.testing.scripted_vllm import ScriptedVLLM
from tests.fakes.capable_model import WEATHER_TOOL as TOOL
from tests.fakes.capable_model import capable_relay_config
from tests.fakes.relay_http import ServedRelay, relay_http

LIMITS = ServerSettings(max_tokens_limit=1000, max_messages=8, max_body_bytes=4096)
USER = {"role": "user", "content": "What is 7 * 6?"}


@dataclass(frozen=True)
class Chunked:
    """A body sent with chunked transfer encoding (no Content-Length to refuse it by)."""

    data: bytes


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "large", "messages": [USER], **fields}


def without(key: str) -> dict[str, Any]:
    body = chat()
    del body[key]
    return body


def function(**fields: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "get_weather", **fields}}


POST = "POST /v1/chat/completions"
CASES: list[tuple[str, str, Any, int, str, str | None]] = [
    # (what, "METHOD path", body, status, in error.message, error.param or error.code)
    ("malformed JSON", POST, b'{"model": "large",', 400, "not valid JSON", None),
    ("not UTF-8", POST, b'{"model": "\xff"}', 400, "not valid JSON", None),
    ("a list, not an object", POST, [chat()], 400, "must be a JSON object", None),
    ("a string, not an object", POST, "hello", 400, "must be a JSON object", None),
    ("no model", POST, without("model"), 400, "Field required", "model"),
    ("model not a string", POST, chat(model=7), 400, "valid string", "model"),
    ("unknown model", POST, chat(model="gpt-4"), 404, "'gpt-4' does not exist", "model"),
    ("no messages", POST, without("messages"), 400, "Field required", "messages"),
    ("empty messages", POST, chat(messages=[]), 400, "at least one message", "messages"),
    ("messages not a list", POST, chat(messages="hi"), 400, "valid list", "messages"),
    (
        "a message not an object",
        POST,
        chat(messages=["hi"]),
        400,
        "valid dictionary",
        "messages[0]",
    ),
    (
        "bad role",
        POST,
        chat(messages=[{"role": "wizard", "content": "hi"}]),
        400,
        "'wizard'; it must be one of system, developer, user, assistant, tool",
        "messages[0].role",
    ),
    (
        "message without content",
        POST,
        chat(messages=[{"role": "user"}]),
        400,
        "content is missing",
        "messages[0].content",
    ),
    (
        "content a number",
        POST,
        chat(messages=[{"role": "user", "content": 5}]),
        400,
        "string or a list of text parts",
        "messages[0]",
    ),
    (
        "image_url content part",
        POST,
        chat(
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is this?"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
                    ],
                }
            ]
        ),
        400,
        "'image_url'; the relay serves text models",
        "messages[0].content[1]",
    ),
    (
        "text part without text",
        POST,
        chat(messages=[{"role": "user", "content": [{"type": "text"}]}]),
        400,
        "text must be a string",
        "messages[0].content[0]",
    ),
    (
        "tool message without tool_call_id",
        POST,
        chat(messages=[USER, {"role": "tool", "content": "sunny"}]),
        400,
        "no tool_call_id",
        "messages[1].tool_call_id",
    ),
    ("n=2", POST, chat(n=2), 400, "n is 2; the relay writes one choice", "n"),
    ("logprobs", POST, chat(logprobs=True), 400, "logprobs are not available", "logprobs"),
    (
        "reasoning_effort",
        POST,
        chat(reasoning_effort="low"),
        400,
        "always reasons",
        "reasoning_effort",
    ),
    ("max_tokens 0", POST, chat(max_tokens=0), 400, "greater than or equal to 1", "max_tokens"),
    ("max_tokens over the limit", POST, chat(max_tokens=5000), 400, "limit of 1000", "max_tokens"),
    (
        "max_completion_tokens over the limit",
        POST,
        chat(max_completion_tokens=1001),
        400,
        "max_completion_tokens 1001 is more than this server's limit of 1000",
        "max_completion_tokens",
    ),
    ("too many messages", POST, chat(messages=[USER] * 9), 400, "limit of 8", "messages"),
    ("body over the size limit", POST, chat(pad="x" * 5000), 413, "larger than 4096", None),
    (
        "chunked body over the size limit",
        POST,
        Chunked(json.dumps(chat(pad="x" * 5000)).encode()),
        413,
        "larger than 4096",
        None,
    ),
    (
        "tool of another type",
        POST,
        chat(tools=[{"type": "retrieval", "function": TOOL["function"]}]),
        400,
        "'function'",
        "tools[0].type",
    ),
    (
        "tool name with spaces",
        POST,
        chat(tools=[function(name="get the weather")]),
        400,
        "letters, digits",
        "tools[0].function.name",
    ),
    (
        "tool parameters an array",
        POST,
        chat(tools=[function(parameters={"type": "array", "items": {"type": "string"}})]),
        400,
        "of type 'object'",
        "tools[0].function.parameters",
    ),
    (
        "tool without function",
        POST,
        chat(tools=[{"type": "function"}]),
        400,
        "Field required",
        "tools[0].function",
    ),
    (
        "tool_choice naming an unknown tool",
        POST,
        chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "nope"}}),
        400,
        "'nope' names no bound tool",
        "tool_choice",
    ),
    (
        "tool_choice required without tools",
        POST,
        chat(tool_choice="required"),
        400,
        "tool_choice needs tools",
        "tool_choice",
    ),
    ("tool_choice a number", POST, chat(tool_choice=3), 400, "tool_choice", "tool_choice"),
    (
        "json_schema format without json_schema",
        POST,
        chat(response_format={"type": "json_schema"}),
        400,
        "needs a schema object",
        "response_format",
    ),
    (
        "unknown response_format type",
        POST,
        chat(response_format={"type": "xml"}),
        400,
        "'text', 'json_object' or 'json_schema'",
        "response_format.type",
    ),
    ("temperature 5", POST, chat(temperature=5), 400, "less than or equal to 2", "temperature"),
    ("top_p 0", POST, chat(top_p=0), 400, "greater than 0", "top_p"),
    ('stream "yes"', POST, chat(stream="yes"), 400, "valid boolean", "stream"),
    ("stream 1", POST, chat(stream=1), 400, "valid boolean", "stream"),
    ("stop a number", POST, chat(stop=5), 400, "stop", "stop"),
    ("stop a list of numbers", POST, chat(stop=[1, 2]), 400, "valid string", "stop[0]"),
    (
        "include_usage not a boolean",
        POST,
        chat(stream=True, stream_options={"include_usage": "maybe"}),
        400,
        "valid boolean",
        "stream_options.include_usage",
    ),
    # found by tests/component/test_server_fuzz.py: each was a 500 or reached the upstream
    ("nesting past the limit", POST, b"[" * 65 + b"]" * 65, 400, "deeper than 64 levels", None),
    ("nesting past Python's recursion limit", POST, b"[" * 2000, 400, "deeper than 64", None),
    (
        "a lone surrogate in a message",
        POST,
        b'{"model": "large", "messages": [{"role": "user", "content": "\\ud800"}]}',
        400,
        "lone UTF-16 surrogate",
        "messages[0].content",
    ),
    ("a 4,000-digit number", POST, b'{"n": ' + b"9" * 4000 + b"}", 400, "100 digits", None),
    ("NaN", POST, b'{"temperature": NaN}', 400, "NaN is not a JSON number", None),
    ("seed beyond 64 bits", POST, chat(seed=2**64), 400, "less than", "seed"),
    (
        "tool_calls not a list",
        POST,
        chat(messages=[USER, {"role": "assistant", "content": None, "tool_calls": True}]),
        400,
        "tool_calls must be a list",
        "messages[1].tool_calls",
    ),
    (
        "tool_choice without a function name",
        POST,
        chat(tools=[TOOL], tool_choice={"type": "function", "function": "get_weather"}),
        400,
        "valid dictionary",
        "tool_choice.function",
    ),
    ("five stop strings", POST, chat(stop=list("abcde")), 400, "at most 4", "stop"),
    ("a stop string too long", POST, chat(stop="x" * 300), 400, "at most 256", "stop"),
    ("an empty stop string", POST, chat(stop=[""]), 400, "is empty", "stop"),
    ("an unknown field", POST, chat(max_token=5), 400, "did you mean 'max_tokens'", "max_token"),
    ("GET on chat completions", "GET /v1/chat/completions", None, 405, "GET is not allowed", None),
    ("POST on models", "POST /v1/models", chat(), 405, "POST is not allowed", None),
    ("unknown path", "POST /v1/completions", chat(), 404, "no route /v1/completions", "not_found"),
    ("unknown root path", "GET /v2/anything", None, 404, "no route /v2/anything", "not_found"),
]


@pytest.fixture(scope="module")
def served(upstream: ScriptedVLLM) -> Iterator[ServedRelay]:
    config = capable_relay_config(upstream.base_url)
    with relay_http(RelayServer(config, LIMITS)) as running:
        yield running
    assert upstream.models["large"].requests == []  # no bad request ever reached upstream
    assert upstream.models["small"].requests == []


@pytest.mark.parametrize(
    ("route", "body", "status", "message", "param_or_code"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_a_bad_request_gets_an_openai_error_naming_the_problem(
    served: ServedRelay,
    upstream: ScriptedVLLM,
    route: str,
    body: Any,
    status: int,
    message: str,
    param_or_code: str | None,
) -> None:
    method, path = route.split(" ")
    content: Any
    if isinstance(body, Chunked):
        content = iter([body.data[:1000], body.data[1000:]])  # no Content-Length: chunked
    elif isinstance(body, bytes):
        content = body
    else:
        content = None if body is None else json.dumps(body).encode()
    response = httpx.request(method, served.url + path, content=content)

    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.headers["x-request-id"]
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert all(isinstance(error[key], str | None) for key in error)
    assert message in error["message"]
    assert error["type"] == "invalid_request_error"
    if param_or_code is not None:
        assert param_or_code in (error["param"], error["code"])
    assert upstream.models["large"].requests == upstream.models["small"].requests == []
