"""The value of a JSON text that is still being written, for objects that grow as they stream.

A forced tool call streams as JSON, a token at a time. :class:`PartialJson` reads the text
once, as it arrives, and at any point gives the value written so far: open strings, objects
and arrays are closed, and what cannot be completed without guessing (a key without its
value, half a ``true``) is left out. A number is left out until a character ends it, since
``2`` may be the start of ``21``; a string shows as far as it is written::

    text = PartialJson()
    text.feed('{"city": "Par')
    text.value()                 # {'city': 'Par'}
    text.feed('is", "degrees": 2')
    text.value()                 # {'city': 'Paris'}
    text.feed('1}')
    text.value()                 # {'city': 'Paris', 'degrees': 21}
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

_LITERALS = frozenset({"true", "false", "null"})
_WHITESPACE = frozenset(" \t\n\r")

Expect = Literal["key", "colon", "value", "after"]


@dataclass
class _Frame:
    """An open object or array: what may come next, and where its unfinished member began.

    ``cut`` is the length the text is cut back to when the member being written cannot be
    completed: the position of the comma before it, or just after the opening bracket.
    """

    closer: str
    expect: Expect
    cut: int


class PartialJson:
    """Reads a JSON text piece by piece; :meth:`value` is what it says so far.

    Each character is read once (:meth:`feed`); :meth:`value` costs one ``json.loads`` of the
    text so far. Text that is not the start of a JSON value gives ``None``.
    """

    def __init__(self) -> None:
        self._text = ""
        self._stack: list[_Frame] = []
        self._in_string = False
        self._escape_at: int | None = None  # where an unfinished escape sequence began
        self._scalar_at: int | None = None  # where the number or literal being read began
        self._broken = False
        self._started = False  # a value began at the top level

    @property
    def text(self) -> str:
        return self._text

    def feed(self, delta: str) -> None:
        """Read `delta`, the continuation of the text."""
        start = len(self._text)
        self._text += delta
        for offset, char in enumerate(delta):
            if self._broken:
                return
            self._read(char, start + offset)

    def value(self) -> Any:
        """The value of the text so far (``None`` before one starts, or if the text is not
        JSON); strings, objects and arrays still open are closed."""
        if self._broken:
            return None
        completed = self._completed()
        if not completed.strip():
            return None
        try:
            return json.loads(completed)
        except json.JSONDecodeError:
            return None

    # -- reading --------------------------------------------------------------------------

    def _read(self, char: str, index: int) -> None:
        if self._in_string:
            self._read_in_string(char, index)
        elif char == '"':
            self._end_scalar()
            self._begin_value(key_allowed=True)
            self._in_string = True
        elif char in "{[":
            self._end_scalar()
            self._begin_value()
            self._stack.append(_Frame("}" if char == "{" else "]", _opening(char), index + 1))
        elif char in "}]":
            self._end_scalar()
            if not self._stack or self._stack.pop().closer != char:
                self._broken = True
            self._value_done()
        elif char == ":":
            self._end_scalar()
            self._expect("colon", "value")
        elif char == ",":
            self._end_scalar()
            frame = self._stack[-1] if self._stack else None
            if frame is None or frame.expect != "after":
                self._broken = True
            else:
                frame.expect = "key" if frame.closer == "}" else "value"
                frame.cut = index
        elif char in _WHITESPACE:
            self._end_scalar()
        elif self._scalar_at is None:
            self._begin_value()
            self._scalar_at = index

    def _read_in_string(self, char: str, index: int) -> None:
        if self._escape_at is not None:
            length = index - self._escape_at  # characters after the backslash so far
            if (length == 1 and char != "u") or length == 5:  # \n ends at once, \uXXXX at 5
                self._escape_at = None
        elif char == "\\":
            self._escape_at = index
        elif char == '"':
            self._in_string = False
            frame = self._stack[-1] if self._stack else None
            if frame is not None and frame.expect == "key":
                frame.expect = "colon"
            else:
                self._value_done()

    def _begin_value(self, key_allowed: bool = False) -> None:
        """A value (or a key) starts: only where one may, and once at the top level."""
        if self._stack:
            expect = self._stack[-1].expect
            allowed = expect == "value" or (key_allowed and expect == "key")
        else:
            allowed = not self._started
        self._started = True
        self._broken = self._broken or not allowed

    def _end_scalar(self) -> None:
        """A number or literal ends at the character after it."""
        if self._scalar_at is not None:
            self._scalar_at = None
            self._value_done()

    def _value_done(self) -> None:
        if self._stack:
            self._stack[-1].expect = "after"

    def _expect(self, current: Expect, following: Expect) -> None:
        frame = self._stack[-1] if self._stack else None
        if frame is None or frame.expect != current:
            self._broken = True
        else:
            frame.expect = following

    # -- completing -----------------------------------------------------------------------

    def _completed(self) -> str:
        """The text so far, cut back to what is certain and closed."""
        text = self._text
        frame = self._stack[-1] if self._stack else None
        closers = "".join(f.closer for f in reversed(self._stack))
        if self._in_string:
            if frame is not None and frame.expect == "key":
                return text[: frame.cut] + closers  # a key without its value
            if self._escape_at is not None:
                text = text[: self._escape_at]
            return text + '"' + closers
        if self._scalar_at is not None:
            if text[self._scalar_at :] in _LITERALS:
                return text + closers
            # A number may go on ("2" of "21"): left out until a character ends it.
            if frame is None:
                return ""
            return text[: frame.cut] + closers
        if frame is not None and frame.expect in ("key", "colon", "value"):
            return text[: frame.cut] + closers
        return text + closers


def _opening(char: str) -> Expect:
    return "key" if char == "{" else "value"
