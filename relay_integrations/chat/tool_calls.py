"""Tool calls in an answer: the Qwen3 / Hermes ``<tool_call>`` format, parsed once for every
adapter.

A model given tools through its chat template answers with blocks like::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

:func:`parse_answer` splits a finished answer into its text and its calls; a block that is not
valid JSON, names no function, or is cut off becomes an :class:`InvalidToolCall` (never an
exception). :class:`ToolCallStream` does the same on a stream of deltas, releasing text as soon
as it cannot be the start of a block::

    parsed = parse_answer('Let me look.<tool_call>{"name": "f", "arguments": {}}</tool_call>')
    parsed.content, parsed.tool_calls[0].name  # ('Let me look.', 'f')

A call still being written (the JSON of a forced call, streamed) reads as a
:class:`PartialToolCall` through :class:`PartialCalls`.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..relay.reasoning import partial_suffix
from ._partial_json import PartialJson

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


def new_call_id() -> str:
    """A fresh id in OpenAI's form (``call_`` and 24 hex digits)."""
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str = field(default_factory=new_call_id)


@dataclass(frozen=True)
class InvalidToolCall:
    """A block that could not be read as a call; ``text`` is its raw content."""

    text: str
    error: str
    name: str | None = None
    id: str = field(default_factory=new_call_id)


@dataclass(frozen=True)
class PartialToolCall:
    """A call as far as it is written: its name once written in full, its arguments so far
    (strings as far as written, numbers once they end; see :mod:`._partial_json`)."""

    id: str
    name: str | None
    arguments: dict[str, Any]


class PartialCalls:
    """The calls of a stream as they are being written, from pieces of their JSON text::

    calls = PartialCalls()
    calls.feed(0, "call_1", '{"name": "f", "arguments": {"city": "Pa')
    # PartialToolCall(id='call_1', name='f', arguments={'city': 'Pa'})
    """

    def __init__(self) -> None:
        self._texts: dict[int, PartialJson] = {}

    def feed(self, index: int, call_id: str, text: str) -> PartialToolCall:
        """Call `index` after `text`, the next piece of its ``{"name", "arguments"}`` JSON."""
        written = self._texts.setdefault(index, PartialJson())
        written.feed(text)
        value = written.value()
        data = value if isinstance(value, dict) else {}
        arguments = data.get("arguments", data.get("parameters"))
        # The name comes first in the call's JSON (the forced-call schema puts it there): it
        # is whole once the arguments have begun, and until then it may be half a name.
        name = data.get("name") if isinstance(arguments, dict) else None
        return PartialToolCall(
            call_id,
            name if isinstance(name, str) else None,
            arguments if isinstance(arguments, dict) else {},
        )


@dataclass(frozen=True)
class ParsedAnswer:
    content: str
    tool_calls: list[ToolCall]
    invalid_tool_calls: list[InvalidToolCall]


def parse_answer(answer: str) -> ParsedAnswer:
    """The text of `answer` outside tool-call blocks, and the blocks as calls."""
    stream = ToolCallStream()
    pieces = stream.feed(answer) + stream.close()
    content = "".join(p for p in pieces if isinstance(p, str)).strip()
    calls = [p for p in pieces if isinstance(p, ToolCall)]
    invalid = [p for p in pieces if isinstance(p, InvalidToolCall)]
    return ParsedAnswer(content, calls, invalid)


def parse_call(block: str) -> ToolCall | InvalidToolCall:
    """One block's content (between the tags) as a call."""
    text = block.strip()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return InvalidToolCall(text, f"not valid JSON: {exc.msg} at character {exc.pos}")
    if not isinstance(data, dict):
        return InvalidToolCall(text, "a tool call must be a JSON object")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        return InvalidToolCall(text, 'the call names no function ("name")')
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return InvalidToolCall(text, f"arguments are not valid JSON: {exc.msg}", name)
    if not isinstance(arguments, dict):
        return InvalidToolCall(text, "arguments must be a JSON object", name)
    return ToolCall(name, arguments)


class ToolCallStream:
    """Splits a streamed answer into text pieces and finished calls, in order."""

    def __init__(self) -> None:
        self._buffer = ""
        self._inside = False

    def feed(self, delta: str) -> list[str | ToolCall | InvalidToolCall]:
        """What `delta` completes: text (str) that cannot belong to a block, and calls."""
        self._buffer += delta
        out: list[str | ToolCall | InvalidToolCall] = []
        while True:
            if self._inside:
                end = self._buffer.find(CLOSE)
                if end == -1:
                    return out
                out.append(parse_call(self._buffer[:end]))
                self._buffer = self._buffer[end + len(CLOSE) :]
                self._inside = False
                continue
            start = self._buffer.find(OPEN)
            if start == -1:
                cut = len(self._buffer) - partial_suffix(self._buffer, OPEN)
                if cut:
                    out.append(self._buffer[:cut])
                self._buffer = self._buffer[cut:]
                return out
            if start:
                out.append(self._buffer[:start])
            self._buffer = self._buffer[start + len(OPEN) :]
            self._inside = True

    def close(self) -> list[str | ToolCall | InvalidToolCall]:
        """The end of the answer: held-back text, or a block cut off before its end tag."""
        rest, self._buffer = self._buffer, ""
        if self._inside:
            self._inside = False
            error = "the tool call was cut off before </tool_call>"
            return [InvalidToolCall(rest.strip(), error, parse_call(rest).name)]
        return [rest] if rest else []
