"""The chat layer both adapters share: tool choices and the answer's constraint (a forced call,
a response format, tools offered with one, strict tools)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from relay_integrations.chat.exchange import ChatRequest, normalize_tool_choice
from relay_integrations.chat.response_format import (
    JsonObjectFormat,
    JsonSchemaFormat,
    response_format_of,
)

WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object"}},
}
TIME = {"type": "function", "function": {"name": "get_time"}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.mark.parametrize(
    ("choice", "required", "expected"),
    [
        (None, False, None),
        ("auto", False, "auto"),
        (None, True, "required"),  # LlamaIndex tool_required
        ("auto", True, "required"),
        ("any", False, "required"),  # LangChain
        (True, False, "required"),
        (False, False, "none"),
        ("none", True, "none"),
        ({"type": "function", "function": {"name": "get_weather"}}, False, "get_weather"),
        ("get_weather", True, "get_weather"),
    ],
)
def test_tool_choices_of_every_framework_normalize(choice, required, expected) -> None:
    assert normalize_tool_choice(choice, required=required) == expected


def test_a_forced_choice_constrains_the_answer_to_the_allowed_calls() -> None:
    named = ChatRequest(ASK, tools=[WEATHER, TIME], tool_choice="get_weather")
    schema = named.answer_constraint()["json"]  # type: ignore[index]
    assert schema["properties"]["name"] == {"const": "get_weather"}
    assert schema["properties"]["arguments"] == {"type": "object"}
    anyone = ChatRequest(ASK, tools=[WEATHER, TIME], tool_choice="required").answer_constraint()
    assert [o["properties"]["name"] for o in anyone["json"]["anyOf"]] == [  # type: ignore[index]
        {"const": "get_weather"},
        {"const": "get_time"},
    ]
    assert ChatRequest(ASK, tools=[WEATHER], tool_choice="auto").answer_constraint() is None
    no_call = ChatRequest(ASK, tools=[WEATHER], tool_choice="none")
    assert no_call.offered_tools == [] and no_call.relay_request().tools == [WEATHER]


def test_a_choice_naming_no_bound_tool_is_refused() -> None:
    with pytest.raises(ValueError, match=r"tool_choice 'get_tme' names no bound tool"):
        ChatRequest(ASK, tools=[WEATHER, TIME], tool_choice="get_tme")


CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
STRICT_WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": CITY, "strict": True},
}
ANSWER = {"type": "object", "properties": {"degrees": {"type": "integer"}}}


def tag_format(constraint: dict[str, Any] | None) -> dict[str, Any]:
    """The format of a ``structured_outputs.structural_tag`` (a JSON string, as vLLM takes it)."""
    assert constraint is not None and set(constraint) == {"structural_tag"}
    tag = json.loads(constraint["structural_tag"])
    assert tag["type"] == "structural_tag"
    return dict(tag["format"])


def test_tools_with_a_response_format_let_the_model_call_a_tool_or_answer_in_that_format() -> None:
    request = ChatRequest(ASK, tools=[WEATHER, TIME], response_format=JsonSchemaFormat(ANSWER))
    answer, calls = tag_format(request.answer_constraint())["elements"]
    assert answer["type"] == "json_schema" and answer["json_schema"] == ANSWER
    assert calls["type"] == "tags_with_separator" and calls["at_least_one"] is True
    assert (calls["separator"], calls["stop_after_first"]) == ("\n", False)
    (block,) = calls["tags"]
    assert (block["begin"], block["end"]) == ("<tool_call>\n", "\n</tool_call>")
    names = [o["properties"]["name"] for o in block["content"]["json_schema"]["anyOf"]]
    assert names == [{"const": "get_weather"}, {"const": "get_time"}]


def test_only_a_strict_tool_s_call_arguments_are_held_to_its_parameters() -> None:
    mixed = ChatRequest(ASK, tools=[STRICT_WEATHER, TIME], response_format=JsonObjectFormat())
    answer, calls = tag_format(mixed.answer_constraint())["elements"]
    assert answer["json_schema"] == {"type": "object"}
    strict, loose = calls["tags"][0]["content"]["json_schema"]["anyOf"]
    assert strict["properties"]["arguments"] == CITY
    assert loose["properties"]["arguments"] == {"type": "object"}  # any object: it parses


def test_strict_tools_alone_leave_the_text_free_and_constrain_each_call_block() -> None:
    request = ChatRequest(ASK, tools=[STRICT_WEATHER], parallel_tool_calls=False)
    found = tag_format(request.answer_constraint())
    assert found["type"] == "triggered_tags" and found["triggers"] == ["<tool_call>"]
    assert found["stop_after_first"] is True  # one call: the answer ends with it
    call = found["tags"][0]["content"]["json_schema"]
    assert call["properties"] == {"name": {"const": "get_weather"}, "arguments": CITY}


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        (ChatRequest(ASK, response_format=JsonSchemaFormat(ANSWER)), {"json": ANSWER}),
        (ChatRequest(ASK, response_format=JsonObjectFormat()), {"json_object": True}),
        (
            ChatRequest(
                ASK, tools=[WEATHER], tool_choice="none", response_format=JsonSchemaFormat(ANSWER)
            ),
            {"json": ANSWER},
        ),
        (ChatRequest(ASK, tools=[WEATHER]), None),
    ],
)
def test_without_tools_on_offer_a_response_format_is_forced_as_before(
    request_: ChatRequest, expected: dict[str, Any] | None
) -> None:
    assert request_.answer_constraint() == expected


def test_a_forced_call_stays_bare_json_whatever_the_response_format() -> None:
    request = ChatRequest(
        ASK, tools=[WEATHER], tool_choice="required", response_format=JsonSchemaFormat(ANSWER)
    )
    constraint = request.answer_constraint()
    assert constraint is not None
    assert constraint["json"]["properties"]["name"] == {"const": "get_weather"}


def test_a_chat_with_no_messages_or_with_media_is_refused_with_its_place() -> None:
    with pytest.raises(ValueError, match="the chat has no messages: give at least one"):
        ChatRequest([])
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    chat: list[dict[str, Any]] = [
        *ASK,
        {"role": "user", "content": [{"type": "text", "text": "and this?"}, image]},
    ]
    with pytest.raises(ValueError, match=r"messages\[1\]\.content\[1\] is of type 'image_url'"):
        ChatRequest(chat)
    text_parts = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    assert ChatRequest(text_parts).messages == text_parts


ANSWER_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (
            {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER_SCHEMA}},
            JsonSchemaFormat(ANSWER_SCHEMA),
        ),  # chat completions
        (
            {"type": "json_schema", "name": "a", "schema": ANSWER_SCHEMA, "strict": True},
            JsonSchemaFormat(ANSWER_SCHEMA),
        ),  # the Responses API's text.format
        ({"type": "json_object"}, JsonObjectFormat()),
        ({"type": "text"}, None),
    ],
)
def test_both_apis_response_formats_read_one_way(given: dict[str, Any], expected: object) -> None:
    assert response_format_of(given) == expected


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"type": "json_schema"}, "text.format of type json_schema needs a schema object"),
        ({"type": "json_schema", "json_schema": {"name": "a"}}, "needs a schema object"),
        ({"type": "json_schema", "schema": "object"}, "needs a schema object"),
        ({"type": "xml"}, "text.format has type 'xml'; it must be one of text, json_object"),
        ({}, "has type None"),
    ],
)
def test_a_response_format_without_a_schema_to_follow_is_refused(
    given: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        response_format_of(given, "text.format")
