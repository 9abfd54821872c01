"""Problem sets and trace files: JSON Lines read with errors that name the line.

A problem set has one JSON object a line with a ``problem`` field (``answer`` and others are
kept for benchmarks)::

    problems = ProblemSet.load("amc23.jsonl")
    problems.name, len(problems.rows), problems.sha256[:12]

Ready traces (``relaygen calibrate --traces``) have a prompt (a string, or a list of chat
messages) and the reasoning text; the field names are configurable, so MATH-500's worked
solutions serve as traces with ``prompt_field="problem", reasoning_field="solution"``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..upstream.errors import RelayError


class DatasetError(RelayError, ValueError):
    """A problem set or trace file that cannot be used; says which file, line and why."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")


@dataclass(frozen=True)
class ProblemSet:
    """The rows of a JSON Lines file, each with a non-empty text field."""

    name: str
    path: Path
    sha256: str
    rows: tuple[dict[str, Any], ...]
    lines: tuple[int, ...]
    """The line of the file each row is on (blank lines are skipped), for errors."""

    def where(self, index: int) -> str:
        """Row `index` as errors name it: ``problems.jsonl:12``."""
        return f"{self.path}:{self.lines[index]}"

    @classmethod
    def load(
        cls, path: str | Path, required: tuple[str, ...] = ("problem",), limit: int | None = None
    ) -> ProblemSet:
        """Read `path`; every row must have a non-empty string (or list) in each `required`
        field. Anything else (not UTF-8, not JSON, not an object, a field missing, empty or
        of another type) fails with the file, the line and the reason.

        With `limit`, only the first `limit` rows are read; the name and the hash say so.
        """
        file = Path(path)
        try:
            raw = file.read_bytes()
        except OSError as exc:
            raise DatasetError(str(file), f"cannot be read: {exc.strerror or exc}") from None
        rows: list[dict[str, Any]] = []
        numbers: list[int] = []
        lines = raw.splitlines()  # bytes split on line ends only, not on U+2028 inside text
        for number, line in enumerate(lines, 1):
            if limit is not None and len(rows) == limit:
                kept = b"".join(x + b"\n" for x in lines[: number - 1])
                name = f"{file.stem}[:{limit}]"
                return cls(
                    name, file, hashlib.sha256(kept).hexdigest(), tuple(rows), tuple(numbers)
                )
            row = _row(line, f"{file}:{number}", required)
            if row is not None:
                rows.append(row)
                numbers.append(number)
        if not rows:
            raise DatasetError(str(file), "holds no rows")
        return cls(file.stem, file, hashlib.sha256(raw).hexdigest(), tuple(rows), tuple(numbers))


def _row(line: bytes, where: str, required: tuple[str, ...]) -> dict[str, Any] | None:
    """One line's row (None for a blank line), its `required` fields checked."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(
            where, f"not UTF-8 text (byte {exc.start + 1} of the line); save the file as UTF-8"
        ) from None
    if not text.strip():
        return None
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetError(where, f"not valid JSON ({exc.msg})") from None
    if not isinstance(row, dict):
        raise DatasetError(where, f"a line must hold a JSON object, not {json_kind(row)}")
    for name in required:
        if name not in row or row[name] is None:
            raise DatasetError(
                where,
                f"no {name!r} field (it has {sorted(row)}); name the field to use "
                "with the matching --...-field option",
            )
        if not isinstance(row[name], str | list):
            raise DatasetError(where, f"{name!r} is {json_kind(row[name])}, not text")
        if not _present(row[name]):
            raise DatasetError(where, f"{name!r} is empty")
    return row


def json_kind(value: Any) -> str:
    """What a JSON value is, as errors say it: "a number", "an object", "true"."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    kinds = {str: "text", int: "a number", float: "a number", list: "a list", dict: "an object"}
    return kinds.get(type(value), type(value).__name__)


def chat_messages(prompt: Any, where: str) -> list[dict[str, Any]]:
    """A prompt as chat messages: a string becomes one user message; a list must hold
    messages with a text ``role`` and a text ``content``."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    usage = 'a prompt must be text or a list of chat messages ({"role": ..., "content": ...})'
    if not isinstance(prompt, list) or not prompt:
        raise DatasetError(where, f"{usage}, not {json_kind(prompt) if prompt != [] else '[]'}")
    for number, message in enumerate(prompt, 1):
        if not isinstance(message, dict):
            raise DatasetError(where, f"{usage}; message {number} is {json_kind(message)}")
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                found = json_kind(message[key]) if key in message else "missing"
                raise DatasetError(where, f"{usage}; message {number}'s {key!r} is {found}")
    return prompt


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _present(value: Any) -> bool:
    if isinstance(value, str):
        return bool(value.strip())
    return isinstance(value, list) and bool(value)
