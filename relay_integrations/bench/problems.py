"""Benchmark problems: JSON Lines with ``problem`` and ``answer``, multiple choice too.

A row is ``{"problem": ..., "answer": ...}`` (AMC, AIME, MATH-500 style; ``id`` optional), or
a multiple-choice one with ``choices`` (a list, lettered A, B, ... in order, or a dict from
letter to text) and an ``answer`` that is the letter or the text of the right choice::

    problems = load_problems("amc23.jsonl", limit=10)
    problems.items[0].messages()   # the chat the models get
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..jobs.datasets import DatasetError, ProblemSet

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
CHOICE_INSTRUCTION = (
    "Please reason step by step, and put the letter of your final choice within \\boxed{}."
)


@dataclass(frozen=True)
class Problem:
    """One problem: its text, the gold answer, and the choice letters if it is multiple choice."""

    id: str
    text: str
    answer: str
    choices: dict[str, str] | None = None

    @property
    def letters(self) -> str | None:
        return "".join(self.choices) if self.choices else None

    def messages(self) -> list[dict[str, str]]:
        """The chat: the problem, its choices, and the instruction to box the answer."""
        if not self.choices:
            return [{"role": "user", "content": f"{self.text}\n\n{INSTRUCTION}"}]
        listed = "\n".join(f"({letter}) {text}" for letter, text in self.choices.items())
        return [{"role": "user", "content": f"{self.text}\n\n{listed}\n\n{CHOICE_INSTRUCTION}"}]


@dataclass(frozen=True)
class Problems:
    name: str
    sha256: str
    items: tuple[Problem, ...]


def load_problems(path: str | Path, limit: int | None = None) -> Problems:
    """Read a problem set; a row without a usable answer fails with its file and line."""
    rows = ProblemSet.load(path, required=("problem",), limit=limit)
    items = []
    seen: set[str] = set()
    for number, row in enumerate(rows.rows, 1):
        where = f"{rows.path} (row {number})"
        problem = _problem(row, number, where)
        if problem.id in seen:
            raise DatasetError(where, f"id {problem.id!r} appears twice; ids must be unique")
        seen.add(problem.id)
        items.append(problem)
    return Problems(rows.name, rows.sha256, tuple(items))


def _problem(row: dict[str, Any], number: int, where: str) -> Problem:
    answer = row.get("answer")
    if answer is None or (isinstance(answer, str) and not answer.strip()):
        raise DatasetError(where, f"no 'answer' field (it has {sorted(row)})")
    gold = _number_text(answer)
    choices = _choices(row.get("choices"), where)
    if choices is not None:
        gold = _gold_letter(gold, choices, where)
    return Problem(str(row.get("id", number)), row["problem"], gold, choices)


def _number_text(answer: Any) -> str:
    """An answer as text; a float that is a whole number loses its ``.0`` (AMC's ``27.0``)."""
    if isinstance(answer, float) and answer.is_integer():
        return str(int(answer))
    return str(answer).strip()


def _choices(raw: Any, where: str) -> dict[str, str] | None:
    if raw is None:
        return None
    if isinstance(raw, list) and raw and all(isinstance(c, str) for c in raw):
        if len(raw) > 26:
            raise DatasetError(where, "more than 26 choices")
        return dict(zip(string.ascii_uppercase, raw, strict=False))
    if (
        isinstance(raw, dict)
        and raw
        and all(
            isinstance(k, str) and len(k) == 1 and k.isupper() and isinstance(v, str)
            for k, v in raw.items()
        )
    ):
        return dict(raw)
    raise DatasetError(
        where, "'choices' must be a list of strings or a dict from letters (A, B, ...) to text"
    )


def _gold_letter(answer: str, choices: dict[str, str], where: str) -> str:
    letter = answer.strip("() ").upper()
    if letter in choices:
        return letter
    for key, text in choices.items():
        if text.strip() == answer:
            return key
    raise DatasetError(
        where, f"answer {answer!r} is neither a choice letter ({''.join(choices)}) nor a choice"
    )
