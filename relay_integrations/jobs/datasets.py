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

    @classmethod
    def load(
        cls, path: str | Path, required: tuple[str, ...] = ("problem",), limit: int | None = None
    ) -> ProblemSet:
        """Read `path`; every row must have a non-empty string in each `required` field.

        With `limit`, only the first `limit` rows are read; the name and the hash say so.
        """
        file = Path(path)
        try:
            raw = file.read_bytes()
        except OSError as exc:
            raise DatasetError(str(file), f"cannot be read: {exc.strerror or exc}") from None
        rows: list[dict[str, Any]] = []
        lines = raw.decode("utf-8", errors="replace").splitlines()
        for number, line in enumerate(lines, 1):
            if limit is not None and len(rows) == limit:
                kept = "".join(x + "\n" for x in lines[: number - 1])
                name = f"{file.stem}[:{limit}]"
                return cls(name, file, text_sha256(kept), tuple(rows))
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{file}:{number}", f"not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise DatasetError(f"{file}:{number}", "a line must hold a JSON object")
            for name in required:
                if not _present(row.get(name)):
                    raise DatasetError(
                        f"{file}:{number}",
                        f"no {name!r} field (it has {sorted(row)}); name the field to use "
                        "with the matching --...-field option",
                    )
            rows.append(row)
        if not rows:
            raise DatasetError(str(file), "holds no rows")
        return cls(file.stem, file, hashlib.sha256(raw).hexdigest(), tuple(rows))


def chat_messages(prompt: Any, where: str) -> list[dict[str, Any]]:
    """A prompt as chat messages: a string becomes one user message."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt):
        return prompt
    raise DatasetError(where, "a prompt must be a string or a list of chat messages with 'role'")


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _present(value: Any) -> bool:
    if isinstance(value, str):
        return bool(value.strip())
    return isinstance(value, list) and bool(value)
