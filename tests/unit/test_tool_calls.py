"""Parsing Qwen3/Hermes tool-call blocks from answers, whole and streamed."""

from __future__ import annotations

import random

import pytest

from relay_integrations.chat.tool_calls import (
    InvalidToolCall,
    ToolCall,
    ToolCallStream,
    parse_answer,
)

TWO_CALLS = (
    "Let me look both up.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": "{\\"zone\\": \\"CET\\"}"}\n</tool_call>'
)


def test_text_and_calls_are_split() -> None:
    parsed = parse_answer(TWO_CALLS)
    assert parsed.content == "Let me look both up."
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {"zone": "CET"}),  # arguments given as a JSON string
    ]
    assert parsed.invalid_tool_calls == []
    assert len({c.id for c in parsed.tool_calls}) == 2


def test_an_answer_without_calls_is_all_content() -> None:
    parsed = parse_answer("The answer is 4. Note: a < b and <tool is not a tag.")
    assert parsed.content == "The answer is 4. Note: a < b and <tool is not a tag."
    assert parsed.tool_calls == [] and parsed.invalid_tool_calls == []


def test_a_call_without_arguments_gets_an_empty_object() -> None:
    assert parse_answer('<tool_call>{"name": "now"}</tool_call>').tool_calls[0].arguments == {}


@pytest.mark.parametrize(
    ("block", "error", "name"),
    [
        ('{"name": "f", "arguments": {"x": 1}', "not valid JSON", None),
        ('["f"]', "must be a JSON object", None),
        ('{"arguments": {}}', 'names no function ("name")', None),
        ('{"name": "f", "arguments": "{oops"}', "arguments are not valid JSON", "f"),
        ('{"name": "f", "arguments": [1]}', "arguments must be a JSON object", "f"),
    ],
)
def test_malformed_calls_become_invalid_calls(block: str, error: str, name: str | None) -> None:
    parsed = parse_answer(f"Calling.\n<tool_call>\n{block}\n</tool_call>")
    assert parsed.content == "Calling."
    assert parsed.tool_calls == []
    (invalid,) = parsed.invalid_tool_calls
    assert error in invalid.error
    assert (invalid.text, invalid.name) == (block, name)


def test_a_call_cut_off_by_the_token_limit_is_invalid_not_lost() -> None:
    parsed = parse_answer('Sure.\n<tool_call>\n{"name": "get_weather", "argum')
    (invalid,) = parsed.invalid_tool_calls
    assert invalid.error == "the tool call was cut off before </tool_call>"
    assert invalid.text == '{"name": "get_weather", "argum'
    assert parsed.content == "Sure."


def test_streaming_gives_the_same_result_for_any_chunking() -> None:
    rng = random.Random(7)
    whole = parse_answer(TWO_CALLS)
    for _ in range(200):
        stream, pieces, pos = ToolCallStream(), [], 0
        while pos < len(TWO_CALLS):
            step = rng.randint(1, 9)
            pieces += stream.feed(TWO_CALLS[pos : pos + step])
            pos += step
        pieces += stream.close()
        text = "".join(p for p in pieces if isinstance(p, str))
        calls = [(p.name, p.arguments) for p in pieces if isinstance(p, ToolCall)]
        assert text.strip() == whole.content
        assert calls == [(c.name, c.arguments) for c in whole.tool_calls]
        assert not any(isinstance(p, InvalidToolCall) for p in pieces)


def test_streamed_text_is_released_unless_it_may_open_a_block() -> None:
    stream = ToolCallStream()
    assert stream.feed("Hello <to") == ["Hello "]
    assert stream.feed("y> there") == ["<toy> there"]
    assert stream.feed("<tool_call>") == []
    (call,) = stream.feed('{"name": "f"}</tool_call> done')[:1]
    assert isinstance(call, ToolCall) and call.name == "f"
    assert stream.close() == []
