"""Generated requests to ``POST /v1/responses`` (hypothesis), the twin of the chat completions
fuzzing (test_server_fuzz.py): any value in every field of a rich request, any item in the
input, unknown and refused fields. Each gets a status below 500 with an OpenAI-shaped error
naming the problem, a refused request reaches neither upstream model, and a stream that
starts ends with a terminal event. ``RELAY_FUZZ_SCALE`` scales the counts as there."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay_integrations.relay import SamplingConfig
from relay_integrations.server import RelayServer
from relay_integrations.server.responses_request import (
    RESPONSES_IGNORED,
    RESPONSES_OFF_VALUES,
    RESPONSES_REFUSED,
    ResponsesRequest,
)
from relay_integrations.testing.scripted_vllm import ScriptedVLLM
from tests.component.test_server_fuzz import (
    LIMITS,
    UPSTREAM_CODES,
    bounded,
    encode,
    json_values,
    put,
)
from tests.fakes.capable_model import capable_relay_config
from tests.fakes.relay_http import relay_http

EXAMPLES = {"wrong types": 700, "items": 300, "unknown fields": 200}
TERMINAL = ("response.completed", "response.incomplete", "response.failed")
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
RICH: dict[str, Any] = {
    "model": "large",
    "instructions": "Be brief.",
    "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    ],
    "tools": [TOOL],
    "tool_choice": "auto",
    "text": {"format": {"type": "text"}},
    "max_output_tokens": 8,
    "temperature": 0.5,
    "metadata": {"case": "1"},
    "user": "someone",
}
FIELD_PATHS: list[tuple[str | int, ...]] = [
    *((name,) for name in ResponsesRequest.model_fields),
    *((name,) for name in (*RESPONSES_IGNORED, *RESPONSES_REFUSED)),
    ("input", 0),
    ("input", 0, "role"),
    ("input", 0, "content"),
    ("input", 0, "content", 0, "type"),
    ("input", 0, "content", 0, "text"),
    ("input", 1, "type"),
    ("input", 2, "call_id"),
    ("input", 2, "name"),
    ("input", 2, "arguments"),
    ("input", 3, "call_id"),
    ("input", 3, "output"),
    ("tools", 0),
    ("tools", 0, "type"),
    ("tools", 0, "name"),
    ("tools", 0, "parameters"),
    ("tools", 0, "strict"),
    ("tool_choice", "name"),
    ("text", "format"),
    ("text", "format", "type"),
    ("text", "format", "schema"),
    ("metadata", "case"),
]
items = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["message", "function_call", "function_call_output", "reasoning"])
        | st.text(max_size=12),
        "role": st.sampled_from(["user", "assistant", "system", "developer", "tool"]),
        "content": json_values,
        "call_id": st.sampled_from(["call_1", "call_2"]) | json_values,
        "name": json_values,
        "arguments": json_values,
        "output": json_values,
    },
)


def fuzz_settings(name: str) -> Callable[[Any], Any]:
    return bounded(EXAMPLES[name])


class Responses:
    """The served relay, a client, and the checks every answer must pass."""

    def __init__(self, base_url: str, upstream: ScriptedVLLM) -> None:
        self.client = httpx.Client(base_url=base_url, timeout=60)
        self.upstream = upstream
        self.secrets = [f"127.0.0.1:{upstream.port}", "Traceback", 'File "']

    def calls(self) -> int:
        return sum(len(m.requests) + m.renders for m in self.upstream.models.values())

    def send(self, body: Any, *, refused: bool | None = None) -> httpx.Response:
        before = self.calls()
        response = self.client.post(
            "/responses", content=encode(body), headers={"content-type": "application/json"}
        )
        status = response.status_code
        assert status < 500, (str(body)[:300], response.text[:500])
        assert not any(secret in response.text for secret in self.secrets), response.text[:500]
        if status != 200:
            error = response.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert error["message"] and len(response.content) < 4096, error
            if error["code"] not in UPSTREAM_CODES:
                assert self.calls() == before, (str(body)[:300], error)
        elif isinstance(body, dict) and body.get("stream") is True:
            lines = response.text.split("\n")  # SSE lines end at LF (not at U+0085)
            data = [line for line in lines if line.startswith("data: ")]
            assert json.loads(data[-1].removeprefix("data: "))["type"] in TERMINAL
        for model in self.upstream.models.values():
            model.forget()
        if refused is True:
            assert 400 <= status < 500, (str(body)[:300], response.text[:300])
        return response


@pytest.fixture(scope="module")
def fuzzed(upstream: ScriptedVLLM) -> Iterator[Responses]:
    config = capable_relay_config(upstream.base_url, sampling=SamplingConfig(max_tokens=8))
    with relay_http(RelayServer(config, LIMITS)) as served:
        fuzz = Responses(served.base_url, upstream)
        assert fuzz.send(RICH).status_code == 200
        yield fuzz
        fuzz.client.close()


@fuzz_settings("wrong types")
@given(value=json_values, where=st.sampled_from(range(len(FIELD_PATHS))), stream=st.booleans())
def test_any_value_in_every_field_is_answered_below_500(
    fuzzed: Responses, value: Any, where: int, stream: bool
) -> None:
    fuzzed.send(put({**RICH, "stream": stream}, FIELD_PATHS[where], value))


@fuzz_settings("items")
@given(input_items=st.lists(items, max_size=4), stream=st.booleans())
def test_any_input_items_are_answered_below_500(
    fuzzed: Responses, input_items: list[dict[str, Any]], stream: bool
) -> None:
    fuzzed.send({**RICH, "input": input_items, "stream": stream})


@fuzz_settings("unknown fields")
@given(
    name=st.text(max_size=30) | st.sampled_from(sorted({*RESPONSES_REFUSED, *RESPONSES_IGNORED})),
    value=json_values,
)
def test_an_unknown_field_is_refused_naming_it(fuzzed: Responses, name: str, value: Any) -> None:
    if name in ResponsesRequest.model_fields:
        return
    passes = name in RESPONSES_IGNORED or (
        name in RESPONSES_REFUSED
        and (
            value is None
            or any(
                value == off and type(value) is type(off)
                for off in RESPONSES_OFF_VALUES.get(name, ())
            )
        )
    )
    response = fuzzed.send({**RICH, name: value}, refused=not passes)
    if not passes:
        assert response.json()["error"]["param"] == (name if len(name) <= 64 else name[:64] + "...")
