"""Final answers: taken from the last ``\\boxed{...}`` of a response and graded with math-verify.

Math answers are compared as mathematics (``\\frac{1}{2}`` equals ``0.5``, ``27`` equals
``27.0``) by `math-verify <https://github.com/huggingface/Math-Verify>`_; multiple-choice
answers by their letter::

    extract_boxed(r"so \\boxed{\\frac{1}{2}}.")             # '\\frac{1}{2}'
    grade(r"... \\boxed{\\frac{1}{2}}", "0.5").correct       # True
    grade(r"... \\boxed{(B)}", "B", choices="ABCDE").correct  # True
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_LETTER = re.compile(r"^\s*(?:\\[a-z]+\s*\{)?\s*\(?\s*([A-Z])\s*(?:\)|\}|[.:]|\s|$)")
"""A boxed choice: ``B``, ``(B)``, ``\text{(C)}``, ``\textbf{(B)}``, ``(B) 12`` (AMC style)."""
# "answer is (c)" or "answer: C", not "answer is a multiple of 4"
_ANSWER_IS = re.compile(r"(?i:answer\s*(?:is|:))\s*(?:\(\s*([A-Za-z])\s*\)|([A-Z])\b)")


@dataclass(frozen=True)
class Grade:
    """What the response answered (None: no answer found) and whether it is right."""

    extracted: str | None
    correct: bool


def extract_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced.

    An unclosed last box (a response cut by the token limit) counts as no answer.
    """
    last: str | None = None
    for match in _BOXED.finditer(text):
        depth, start = 1, match.end()
        for index in range(start, len(text)):
            char = text[index]
            if char == "{" and text[index - 1] != "\\":
                depth += 1
            elif char == "}" and text[index - 1] != "\\":
                depth -= 1
                if depth == 0:
                    last = text[start:index].strip()
                    break
        else:  # unclosed: cut off, so no answer unless a later box closes
            last = None
    return last


def extract_choice(text: str, letters: str) -> str | None:
    """The choice letter answered: a boxed letter, else the last "answer is (X)"."""
    boxed = extract_boxed(text)
    if boxed is not None:
        match = _LETTER.match(boxed)
        if match and match.group(1) in letters:
            return match.group(1)
    said = [(m.group(1) or m.group(2)).upper() for m in _ANSWER_IS.finditer(text)]
    said = [letter for letter in said if letter in letters]
    return said[-1] if said else None


def grade(response: str, gold: str, choices: str | None = None) -> Grade:
    """Grade one response against the gold answer.

    With `choices` (the valid letters, e.g. ``"ABCDE"``) the answer is a letter and `gold`
    must be one; otherwise the boxed answer and `gold` are compared with math-verify.
    """
    if choices is not None:
        letter = extract_choice(response, choices)
        return Grade(letter, letter is not None and letter == gold.strip().upper())
    boxed = extract_boxed(response)
    if boxed is None:
        return Grade(None, False)
    return Grade(boxed, equivalent(boxed, gold))


def equivalent(answer: str, gold: str) -> bool:
    """Whether two LaTeX answers are the same mathematics (math-verify), or the same text."""
    if _normalized(answer) == _normalized(gold):
        return True
    try:
        from math_verify import parse, verify  # type: ignore[import-untyped]  # the bench extra
    except ImportError as missing:
        raise ImportError(
            "grading needs math-verify: pip install 'relay-integrations[bench]'",
            name=missing.name,
        ) from missing

    # math-verify bounds its sympy work with SIGALRM, which only the main thread may use
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    gold_parsed = parse(f"${gold}$", parsing_timeout=timeout)
    answer_parsed = parse(f"${answer}$", parsing_timeout=timeout)
    if not gold_parsed or not answer_parsed:
        return False
    return bool(verify(gold_parsed, answer_parsed, timeout_seconds=timeout))


def _normalized(text: str) -> str:
    return re.sub(r"\s+|\\[,;!]|\\(?:text|mathrm)\{([^}]*)\}", r"\1", text).strip().rstrip(".")
