"""JSON read while it is written (chat/_partial_json), and the calls built from it
(chat/tool_calls.PartialCalls)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from relay_integrations.chat._partial_json import PartialJson
from relay_integrations.chat.tool_calls import PartialCalls

TEXTS = [
    '{"name": "get_weather", "arguments": {"city": "San Francisco, CA", "days": 3}}',
    '{"a": [1, -2.5e3, {"b": "x\\"y\\u00e9\\n"}], "t": true, "f": false, "n": null, "e": {}}',
    '[ "a" , [ ] , { "k" : [ 0 , 10 ] } , 0.5 ]',
    '"a string"',
]


def says_no_more_than(partial: Any, final: Any) -> bool:
    """`partial` is `final` as far as it is written: strings are prefixes, objects hold some
    of the keys (the last one possibly unfinished), arrays a prefix of the items."""
    if isinstance(final, str):
        return isinstance(partial, str) and final.startswith(partial)
    if isinstance(final, dict):
        return isinstance(partial, dict) and all(
            k in final and says_no_more_than(v, final[k]) for k, v in partial.items()
        )
    if isinstance(final, list):
        return (
            isinstance(partial, list)
            and len(partial) <= len(final)
            and all(says_no_more_than(p, f) for p, f in zip(partial, final, strict=False))
        )
    return bool(partial == final)  # numbers and literals appear whole or not at all


@pytest.mark.parametrize("text", TEXTS)
def test_every_prefix_reads_as_part_of_the_final_value(text: str) -> None:
    final = json.loads(text)
    for cut in range(len(text)):
        reader = PartialJson()
        reader.feed(text[:cut])
        value = reader.value()
        assert value is None or says_no_more_than(value, final), (text[:cut], value)
    reader = PartialJson()
    reader.feed(text)
    assert reader.value() == final


@pytest.mark.parametrize("text", TEXTS)
def test_pieces_of_any_size_read_as_the_whole_text(text: str) -> None:
    rng = random.Random(7)
    reader, at = PartialJson(), 0
    while at < len(text):
        step = rng.randint(1, 5)
        reader.feed(text[at : at + step])
        at += step
        prefix = PartialJson()
        prefix.feed(text[:at])
        assert reader.value() == prefix.value()
    assert reader.value() == json.loads(text)


@pytest.mark.parametrize(
    ("prefix", "value"),
    [
        ('{"city": "Par', {"city": "Par"}),
        ('{"city": "Paris", "deg', {"city": "Paris"}),  # a key without its value
        ('{"city": "Paris", "degrees"', {"city": "Paris"}),
        ('{"city": "Paris", "degrees": ', {"city": "Paris"}),
        ('{"city": "Paris", "degrees": 2', {"city": "Paris"}),  # 2 may be the start of 21
        ('{"city": "Paris", "degrees": 21,', {"city": "Paris", "degrees": 21}),
        ('{"ok": tr', {}),
        ('{"ok": true', {"ok": True}),
        ('{"s": "caf\\u00', {"s": "caf"}),  # half an escape is left out
        ('{"s": "a\\', {"s": "a"}),
        ("[1, 2, ", [1, 2]),
        ('{"a": {"b": [{"c": "d', {"a": {"b": [{"c": "d"}]}}),
        ("", None),
        ("   ", None),
    ],
)
def test_what_cannot_be_completed_without_guessing_is_left_out(prefix: str, value: Any) -> None:
    reader = PartialJson()
    reader.feed(prefix)
    assert reader.value() == value


@pytest.mark.parametrize(
    "text", ['{"a": 1}}', "[1}", '{"a" 1', '{"a": 1 "b"', "[1 2", "{,}", '"a" "b', "{1"]
)
def test_text_that_is_not_json_reads_as_nothing(text: str) -> None:
    reader = PartialJson()
    reader.feed(text)
    assert reader.value() is None


def test_a_partial_call_names_its_function_once_the_arguments_begin() -> None:
    calls = PartialCalls()
    assert calls.feed(0, "call_1", '{"name": "get_wea').name is None
    started = calls.feed(0, "call_1", 'ther", "arguments": {"city": "Pa')
    assert (started.id, started.name, started.arguments) == (
        "call_1",
        "get_weather",
        {"city": "Pa"},
    )
    other = calls.feed(1, "call_2", '{"name": "f", "arguments": {}}')
    assert (other.name, other.arguments) == ("f", {})  # each index is its own call
    assert calls.feed(0, "call_1", 'ris"}}').arguments == {"city": "Paris"}
