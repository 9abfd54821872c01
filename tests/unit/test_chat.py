"""The chat layer both adapters share: tool choices and the forced-call constraint."""

from __future__ import annotations

import pytest

from relay_integrations.core.chat import ChatRequest, normalize_tool_choice

WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object"}},
}
TIME = {"type": "function", "function": {"name": "get_time"}}


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
    named = ChatRequest([], tools=[WEATHER, TIME], tool_choice="get_weather")
    schema = named.answer_constraint()["json"]  # type: ignore[index]
    assert schema["properties"]["name"] == {"const": "get_weather"}
    assert schema["properties"]["arguments"] == {"type": "object"}
    anyone = ChatRequest([], tools=[WEATHER, TIME], tool_choice="required").answer_constraint()
    assert [o["properties"]["name"] for o in anyone["json"]["anyOf"]] == [  # type: ignore[index]
        {"const": "get_weather"},
        {"const": "get_time"},
    ]
    assert ChatRequest([], tools=[WEATHER], tool_choice="auto").answer_constraint() is None
    assert ChatRequest([], tools=[WEATHER], tool_choice="none").offered_tools == []


def test_a_choice_naming_no_bound_tool_is_refused() -> None:
    with pytest.raises(ValueError, match=r"tool_choice 'get_tme' names no bound tool"):
        ChatRequest([], tools=[WEATHER, TIME], tool_choice="get_tme")
