"""``POST /v1/responses`` through the clients that speak it, over the capable scripted upstream
(no vLLM): the openai SDK (create, stream, a tool round trip, parse), the OpenAI Agents SDK with
its default model, LangChain's ``ChatOpenAI(use_responses_api=True)``; every stream event
checked against the SDK's own types; refused fields and bad items answered 400 naming them."""

from __future__ import annotations

import asyncio
import json
import typing
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from agents import (
    Agent,
    Runner,
    function_tool,
    set_default_openai_client,
    set_tracing_disabled,
)
from langchain_core.messages import AIMessageChunk, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from openai.types.responses import ResponseStreamEvent
from pydantic import BaseModel

from relay_integrations.relay import EndpointConfig, RelayConfig
from relay_integrations.server import RelayServer
from relay_integrations.server.responses_request import RESPONSES_OFF_VALUES, RESPONSES_REFUSED
from relay_integrations.testing.scripted_vllm import Fault, ScriptedModel, ScriptedVLLM, serving
from tests.fakes.capable_model import capable_relay_config
from tests.fakes.clients import off_loop
from tests.fakes.relay_http import ServedRelay, relay_http

QUESTION = "What is 7 * 6?"
ANSWER = "The answer is 42."
WEATHER_QUESTION = "What is the weather in Paris?"
WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
EVENTS = {
    typing.get_args(kind.model_fields["type"].annotation)[0]: kind
    for kind in typing.get_args(typing.get_args(ResponseStreamEvent)[0])
}
"""The SDK's class of each stream event, by its type."""


@pytest.fixture(scope="module")
def served(upstream: ScriptedVLLM) -> Iterator[ServedRelay]:
    with relay_http(RelayServer(capable_relay_config(upstream.base_url))) as running:
        yield running


@pytest.fixture(scope="module")
def client(served: ServedRelay) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=served.base_url, api_key="x", max_retries=0) as running:
        yield running


def events(served: ServedRelay, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The events of a streamed response, each checked: its SSE ``event:`` line names its
    type, the SDK's types validate it, and the sequence numbers count up from 0."""
    found: list[dict[str, Any]] = []
    request = {"model": "large", **body, "stream": True}
    with httpx.stream("POST", f"{served.base_url}/responses", json=request, timeout=30) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        named = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                named = line.removeprefix("event: ")
            elif line.startswith("data: "):
                event = json.loads(line.removeprefix("data: "))
                assert event["type"] == named
                EVENTS[event["type"]].model_validate(event)
                found.append(event)
    assert [e["sequence_number"] for e in found] == list(range(len(found)))
    return found


# --- the openai SDK -------------------------------------------------------------------------


def test_a_response_has_reasoning_and_message_items_usage_and_the_relay_figures(
    client: openai.OpenAI,
) -> None:
    response = client.responses.create(
        model="large", input=QUESTION, instructions="Answer briefly.", metadata={"case": "7"}
    )
    assert response.status == "completed" and response.output_text == ANSWER
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and message.type == "message"
    assert reasoning.content and reasoning.content[0].text.startswith("The user writes")
    assert reasoning.summary == []
    assert response.usage is not None
    assert response.usage.output_tokens_details.reasoning_tokens > 0
    assert response.usage.total_tokens == response.usage.input_tokens + (
        response.usage.output_tokens
    )
    assert response.instructions == "Answer briefly." and response.metadata == {"case": "7"}
    assert response.id.startswith("resp_") and response.model == "large"
    relay = response.model_extra["relay"]  # type: ignore[index]
    assert relay["switches"] > 0 and 0 < relay["large_share"] < 1
    assert {s["model"] for s in relay["segments"]} == {"large", "small"}


def test_a_stream_has_the_semantic_events_in_order_and_ends_as_the_whole_response(
    client: openai.OpenAI, served: ServedRelay
) -> None:
    found = events(served, {"input": QUESTION})
    kinds = [e["type"] for e in found]
    reasoning_deltas = [e for e in found if e["type"] == "response.reasoning_text.delta"]
    text_deltas = [e for e in found if e["type"] == "response.output_text.delta"]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    first_text = kinds.index("response.output_text.delta")
    assert kinds[kinds.index("response.reasoning_text.delta") : first_text] == [
        *["response.reasoning_text.delta"] * len(reasoning_deltas),
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-5:] == [
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    done = {e["type"]: e for e in found}
    reasoning = "".join(e["delta"] for e in reasoning_deltas)
    assert done["response.reasoning_text.done"]["text"] == reasoning.strip()
    assert done["response.output_text.done"]["text"] == "".join(e["delta"] for e in text_deltas)
    # each delta names its writer, and both models wrote the reasoning
    assert {e["relay"]["model"] for e in reasoning_deltas} == {"large", "small"}
    final = done["response.completed"]["response"]
    whole = client.responses.create(model="large", input=QUESTION)
    assert [item["type"] for item in final["output"]] == [item.type for item in whole.output]
    assert final["output"][1]["content"][0]["text"] == whole.output_text == ANSWER
    assert final["usage"]["output_tokens"] == whole.usage.output_tokens  # type: ignore[union-attr]


SPACED = "<think>\n  Two and two. Therefore, four.  \n</think>\n\n  Four, as asked.  \n  "
"""A scripted generation whose reasoning and answer start and end with whitespace."""


def test_the_texts_of_a_stream_are_its_deltas_and_those_of_the_whole_response() -> None:
    models = [ScriptedModel(name, SPACED) for name in ("large", "small")]
    with serving(ScriptedVLLM(*models)) as upstream:
        config = RelayConfig(
            large=EndpointConfig(base_url=upstream.base_url, model="large"),
            small=EndpointConfig(base_url=upstream.base_url, model="small"),
            cues=["Therefore,"],
        )
        with relay_http(RelayServer(config)) as served:
            found = events(served, {"input": "What is 2 + 2?"})
            whole = post(served, {"input": "What is 2 + 2?"})
    assert whole.status_code == 200, whole.text
    (reasoning, message) = whole.json()["output"]
    done = {e["type"]: e for e in found}
    final = done["response.completed"]["response"]["output"]
    for name, index, item in (("reasoning_text", 0, reasoning), ("output_text", 1, message)):
        deltas = "".join(e["delta"] for e in found if e["type"] == f"response.{name}.delta")
        assert deltas == done[f"response.{name}.done"]["text"]
        assert deltas == final[index]["content"][0]["text"] == item["content"][0]["text"]
    assert message["content"][0]["text"] == "Four, as asked.  \n  "  # its end as written
    assert reasoning["content"][0]["text"] == "Two and two. Therefore, four."  # stripped


def test_the_sdk_stream_helper_gives_the_final_response(client: openai.OpenAI) -> None:
    with client.responses.stream(model="large", input=QUESTION) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == ANSWER


def test_a_tool_round_trip_with_the_output_items_sent_back(client: openai.OpenAI) -> None:
    first = client.responses.create(model="large", input=WEATHER_QUESTION, tools=[WEATHER])
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    assert call.call_id.startswith("call_") and call.status == "completed"
    history: list[Any] = [
        {"role": "user", "content": WEATHER_QUESTION},
        *(item.model_dump(exclude_none=True) for item in first.output),  # reasoning too
        {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"},
    ]
    second = client.responses.create(model="large", input=history, tools=[WEATHER])
    assert second.output_text == "get_weather returned: Sunny, 21 C."


def test_a_forced_tool_streams_its_arguments(served: ServedRelay) -> None:
    body = {
        "input": WEATHER_QUESTION,
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "name": "get_weather"},
    }
    found = events(served, body)
    (added,) = [
        e
        for e in found
        if e["type"] == "response.output_item.added" and e["item"]["type"] == "function_call"
    ]
    (done,) = [e for e in found if e["type"] == "response.function_call_arguments.done"]
    assert added["item"]["arguments"] == "" and done["name"] == "get_weather"
    assert json.loads(done["arguments"]) == {"city": "Paris"}
    final = found[-1]["response"]
    assert [item["type"] for item in final["output"]] == ["reasoning", "function_call"]
    assert final["tool_choice"] == {"type": "function", "name": "get_weather"}


class Answer(BaseModel):
    city: str
    temperature: int


def test_parse_with_a_pydantic_model(client: openai.OpenAI) -> None:
    parsed = client.responses.parse(
        model="large", input="Give the city Paris and the temperature 21", text_format=Answer
    )
    assert parsed.output_parsed == Answer(city="Paris", temperature=21)
    echoed = parsed.text.format if parsed.text else None
    assert echoed is not None and echoed.type == "json_schema"


def test_the_budget_ends_a_response_incomplete(client: openai.OpenAI, served: ServedRelay) -> None:
    cut = client.responses.create(model="large", input=QUESTION, max_output_tokens=8)
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"
    assert cut.max_output_tokens == 8
    found = events(served, {"input": QUESTION, "max_output_tokens": 8})
    assert found[-1]["type"] == "response.incomplete"
    assert found[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_an_upstream_failure_mid_stream_ends_with_response_failed(upstream: ScriptedVLLM) -> None:
    config = capable_relay_config(upstream.base_url)
    config = config.model_copy(
        update={
            "policy": config.policy.model_copy(update={"max_resumes": 0}),
            "large": config.large.model_copy(update={"max_retries": 0}),
        }
    )
    with relay_http(RelayServer(config)) as served:
        upstream.models["large"].faults[:] = [Fault(cut_after=12)]  # after the first event
        try:
            found = events(served, {"input": QUESTION})
        finally:
            upstream.models["large"].faults.clear()
    failed = found[-1]
    assert failed["type"] == "response.failed"
    error = failed["response"]["error"]
    assert error["code"] == "server_error"
    assert error["message"].startswith("the large model's server is unavailable")
    assert failed["response"]["relay"]["error"] == {"status": 502, "code": "upstream_failed"}
    assert "127.0.0.1" not in json.dumps(found)
    assert failed["response"]["relay"]["partial"]["finish_reason"] == "error"


# --- a reasoning summary: the whole reasoning, for the clients that read only summaries -----


@pytest.mark.parametrize(
    "reasoning",
    [
        {"summary": "auto"},
        {"summary": "concise"},
        {"summary": "detailed", "effort": None},
        {"generate_summary": "auto"},  # the deprecated name
    ],
    ids=["auto", "concise", "detailed", "generate_summary"],
)
def test_a_summary_asked_for_streams_the_whole_reasoning_as_summary_events(
    served: ServedRelay, reasoning: dict[str, Any]
) -> None:
    found = events(served, {"input": QUESTION, "reasoning": reasoning})  # SDK types checked
    kinds = [e["type"] for e in found]
    text = [e for e in found if e["type"] == "response.reasoning_text.delta"]
    summary = [e for e in found if e["type"] == "response.reasoning_summary_text.delta"]
    assert [e["delta"] for e in summary] == [e["delta"] for e in text]
    assert [e["relay"]["model"] for e in summary] == [e["relay"]["model"] for e in text]
    assert {e["summary_index"] for e in summary} == {0}
    opened = kinds.index("response.reasoning_summary_part.added")
    assert kinds[opened - 2 : opened] == [
        "response.output_item.added",
        "response.content_part.added",
    ]
    closed = kinds.index("response.reasoning_summary_part.done")
    assert kinds[closed - 3 : closed + 3] == [
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added",  # the message
    ]
    done = {e["type"]: e for e in found}
    whole = done["response.reasoning_text.done"]["text"]
    assert whole and done["response.reasoning_summary_text.done"]["text"] == whole
    assert done["response.reasoning_summary_part.done"]["part"] == {
        "type": "summary_text",
        "text": whole,
    }
    final = done["response.completed"]["response"]
    assert final["output"][0]["summary"] == [{"type": "summary_text", "text": whole}]
    assert final["reasoning"]["summary"] == (reasoning.get("summary"))


def test_a_whole_response_with_a_summary_asked_for_has_the_reasoning_as_summary(
    client: openai.OpenAI,
) -> None:
    response = client.responses.create(
        model="large", input=QUESTION, reasoning={"summary": "concise"}
    )
    reasoning = response.output[0]
    assert reasoning.type == "reasoning" and reasoning.content
    assert [(s.type, s.text) for s in reasoning.summary] == [
        ("summary_text", reasoning.content[0].text)
    ]
    assert response.reasoning is not None and response.reasoning.summary == "concise"
    assert response.output_text == ANSWER


def test_without_a_summary_asked_for_no_summary_is_sent(
    client: openai.OpenAI, served: ServedRelay
) -> None:
    asked: dict[str, Any]
    for asked in ({}, {"reasoning": None}, {"reasoning": {}}, {"reasoning": {"summary": None}}):
        found = events(served, {"input": QUESTION, **asked})
        assert not [e for e in found if "summary" in e["type"]], asked
        assert found[-1]["response"]["output"][0]["summary"] == []
        whole = client.responses.create(model="large", input=QUESTION, **asked)
        assert whole.output[0].type == "reasoning" and whole.output[0].summary == []


def test_langchain_chat_openai_streams_the_reasoning_when_it_asks_for_a_summary(
    client: openai.OpenAI, served: ServedRelay
) -> None:
    reasoning = client.responses.create(model="large", input=QUESTION).output[0]
    assert reasoning.type == "reasoning" and reasoning.content
    expected = reasoning.content[0].text
    llm = ChatOpenAI(
        model="large",
        base_url=served.base_url,
        api_key="x",
        use_responses_api=True,
        reasoning={"summary": "auto"},
    )
    chunks = list(llm.stream(QUESTION))
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole += chunk
    assert whole.text == ANSWER
    blocks = [b for b in whole.content if isinstance(b, dict) and b["type"] == "reasoning"]
    (block,) = blocks
    assert "".join(s["text"] for s in block["summary"]) == expected
    (standard,) = [b for b in whole.content_blocks if b["type"] == "reasoning"]
    assert standard.get("reasoning") == expected
    invoked = llm.invoke(QUESTION)
    (block,) = [b for b in invoked.content if isinstance(b, dict) and b["type"] == "reasoning"]
    assert [s["text"] for s in block["summary"]] == [expected]


# --- the routes of a stored response: a 404 that says none is stored ------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda client: client.responses.retrieve("resp_x"),
        lambda client: client.responses.delete("resp_x"),
        lambda client: client.responses.input_items.list("resp_x"),
        lambda client: client.responses.cancel("resp_x"),
    ],
    ids=["retrieve", "delete", "input_items", "cancel"],
)
def test_a_stored_response_is_not_found_because_none_is_stored(
    client: openai.OpenAI, call: Any
) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        call(client)
    error = missing.value.body
    assert isinstance(error, dict)
    assert error["message"].startswith("no response 'resp_x': this server stores no responses")
    assert "store=true is refused" in error["message"]
    assert "send the whole input each time" in error["message"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "not_found")


# --- the OpenAI Agents SDK, its default model -----------------------------------------------


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"Sunny, 21 C in {city}"


async def test_the_agents_sdk_runs_an_agent_with_a_function_tool(served: ServedRelay) -> None:
    set_tracing_disabled(True)
    async with await off_loop(openai.AsyncOpenAI, base_url=served.base_url, api_key="x") as client:
        set_default_openai_client(client, use_for_tracing=False)
        agent = Agent(name="weather", instructions="Answer briefly.", model="large")
        agent = agent.clone(tools=[get_weather])
        result = await Runner.run(agent, WEATHER_QUESTION)
        assert result.final_output == "get_weather returned: Sunny, 21 C in Paris."
        kinds = [type(item).__name__ for item in result.new_items]
        assert kinds == [
            "ReasoningItem",
            "ToolCallItem",
            "ToolCallOutputItem",
            "ReasoningItem",
            "MessageOutputItem",
        ]
        streamed = Runner.run_streamed(agent, WEATHER_QUESTION)
        raw = [
            event.data.type
            async for event in streamed.stream_events()
            if event.type == "raw_response_event"
        ]
        assert streamed.final_output == result.final_output
        assert raw.count("response.completed") == 2  # the call, then the answer
        assert "response.function_call_arguments.done" in raw


# --- LangChain ChatOpenAI(use_responses_api=True) --------------------------------------------


@tool("get_weather")
def weather_tool(city: str) -> str:
    """The weather in a city."""
    return f"Sunny, 21 C in {city}"


def test_langchain_chat_openai_on_the_responses_api(served: ServedRelay) -> None:
    llm = ChatOpenAI(model="large", base_url=served.base_url, api_key="x", use_responses_api=True)
    message = llm.invoke(QUESTION)
    assert message.text == ANSWER
    assert [block["type"] for block in message.content] == ["reasoning", "text"]  # type: ignore[index]
    assert message.usage_metadata is not None
    assert message.usage_metadata["output_token_details"]["reasoning"] > 0

    chunks = list(llm.stream(QUESTION))
    assert len(chunks) > 3 and all(isinstance(c, AIMessageChunk) for c in chunks)
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole += chunk
    assert whole.text == ANSWER

    with_tools = llm.bind_tools([weather_tool])
    asked = with_tools.invoke(WEATHER_QUESTION)
    (call,) = asked.tool_calls
    assert (call["name"], call["args"]) == ("get_weather", {"city": "Paris"})
    answered = with_tools.invoke(
        [
            ("user", WEATHER_QUESTION),
            asked,
            ToolMessage("Sunny, 21 C", tool_call_id=call["id"]),
        ]
    )
    assert answered.text == "get_weather returned: Sunny, 21 C."


# --- refused and bad input ------------------------------------------------------------------

REFUSED_VALUES: dict[str, Any] = {
    "previous_response_id": "resp_123",
    "store": True,
    "conversation": "conv_1",
    "background": True,
    "include": ["reasoning.encrypted_content"],
    "top_logprobs": 3,
    "truncation": "auto",
    "max_tool_calls": 2,
    "prompt": {"id": "pmpt_1"},
    "service_tier": "flex",
    "moderation": {"enabled": True},
    "context_management": [{"type": "compaction"}],
}


def post(served: ServedRelay, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{served.base_url}/responses", json={"model": "large", **body}, timeout=30)


def test_every_refused_field_is_a_400_naming_it_and_its_off_value_passes(
    served: ServedRelay,
) -> None:
    assert set(REFUSED_VALUES) == set(RESPONSES_REFUSED)
    for name, value in REFUSED_VALUES.items():
        refused = post(served, {"input": QUESTION, name: value})
        assert refused.status_code == 400, (name, refused.text)
        error = refused.json()["error"]
        assert error["param"] == name and error["message"].startswith(f"{name}: "), error
        assert error["code"] == "unsupported_parameter"
    for name, (off, *_) in RESPONSES_OFF_VALUES.items():
        assert post(served, {"input": QUESTION, name: off}).status_code == 200, name


@pytest.mark.parametrize(
    ("body", "param", "said"),
    [
        ({"input": QUESTION, "temprature": 0.2}, "temprature", "did you mean 'temperature'"),
        ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0].type", "of type"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", "keeps none"),
        (
            {"input": [{"type": "function_call_output", "call_id": "call_9", "output": "x"}]},
            "input[0].call_id",
            "answers no function_call",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0]",
            "text models",
        ),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role", "must be one of"),
        ({"input": []}, "input", "at least one item"),
        ({"input": QUESTION, "tools": [{"type": "web_search"}]}, "tools[0].type", "hosted"),
        ({"input": QUESTION, "tool_choice": "required"}, "tool_choice", "needs tools"),
        ({"input": QUESTION, "text": {"verbosity": "high"}}, "text.verbosity", ""),
        (
            {"input": QUESTION, "text": {"format": {"type": "json_schema"}}},
            "text.format",
            "needs a schema object",
        ),
        ({"input": QUESTION, "max_output_tokens": 0}, "max_output_tokens", ""),
        (
            {"input": QUESTION, "reasoning": {"effort": "high"}},
            "reasoning.effort",
            "the relay always reasons",
        ),
        ({"input": QUESTION, "reasoning": {"summary": "long"}}, "reasoning.summary", ""),
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    served: ServedRelay, body: dict[str, Any], param: str, said: str
) -> None:
    refused = post(served, body)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == param and said in error["message"], error


def test_the_model_must_be_served_and_the_key_checked(served: ServedRelay) -> None:
    missing = httpx.post(
        f"{served.base_url}/responses", json={"model": "gpt-5", "input": QUESTION}, timeout=30
    )
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_a_whole_and_a_streamed_response_on_one_event_loop(served: ServedRelay) -> None:
    """Both through the async client at once: the relay runs them side by side."""

    async def both() -> tuple[str, str]:
        async with await off_loop(
            openai.AsyncOpenAI, base_url=served.base_url, api_key="x"
        ) as client:
            whole = client.responses.create(model="large", input=QUESTION)

            async def streamed() -> str:
                stream = await client.responses.create(model="large", input=QUESTION, stream=True)
                return "".join(
                    [e.delta async for e in stream if e.type == "response.output_text.delta"]
                )

            first, second = await asyncio.gather(whole, streamed())
            return first.output_text, second

    assert asyncio.run(both()) == (ANSWER, ANSWER)
