"""The texts the GPU-speed models write, one per generation, and the prompt that asks for it.

A traces file is JSON Lines: rows with ``text`` (a whole trace, ``<think>...</think>`` and
the answer, as ``relaygen calibrate`` records a large model's traces), or rows with
``solution`` and ``answer`` (MATH-500's worked solutions: the solution becomes the reasoning,
a one-sentence answer follows). Generation ``g`` asks ``Problem #g: ...`` and gets trace
``g mod len(traces)``, so no two generations share a prompt (nor a prefix-cache entry)::

    traces = load_traces(Path("math500.jsonl"), count=40, min_tokens=150)
    traces.messages(7)                   # the chat of generation 7
    traces.respond(prompt, body)         # what a scripted model writes after `prompt`
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relay_integrations.testing.qwen3_template import ASSISTANT, tokenize

_NUMBER = re.compile(r"Problem #(\d+):")
AHEAD_CHARACTERS = 8
"""How far past the trace a prompt may go: the relay opens the next model's request one token
ahead of a likely hand-off (a cue's confirming comma or space), and the trace may go on
otherwise. Such a request writes nothing here (a real model would write on, and the relay
would close it unused); a prompt further off the trace is an error."""


def trace_text(row: dict[str, Any]) -> str:
    """A row's trace: its ``text``, or its worked solution as the reasoning."""
    if "text" in row:
        return str(row["text"])
    answer = f"The answer is $\\boxed{{{row['answer']}}}$."
    return f"<think>\n{row['solution'].strip()}\n</think>\n\n{answer}"


@dataclass(frozen=True)
class Traces:
    """The questions and the traces written for them."""

    questions: list[str]
    texts: list[str]

    def messages(self, generation: int) -> list[dict[str, str]]:
        question = self.questions[generation % len(self.questions)]
        return [{"role": "user", "content": f"Problem #{generation}: {question}"}]

    def text(self, generation: int) -> str:
        return self.texts[generation % len(self.texts)]

    def tokens(self, generation: int) -> int:
        """The tokens of generation `generation`'s trace (by the scripted tokenizer)."""
        return len(tokenize(self.text(generation)))

    def respond(self, prompt: str, body: dict[str, Any]) -> str:
        """The rest of the trace after what the prompt's generation has written so far."""
        number = _NUMBER.search(prompt)
        if number is None:
            raise ValueError("the prompt names no 'Problem #N:'")
        trace = self.text(int(number[1]))
        written = prompt.split(ASSISTANT, 1)[1] if ASSISTANT in prompt else ""
        if trace.startswith(written):
            return trace[len(written) :]
        pairs = enumerate(zip(trace, written, strict=False))
        kept = next((i for i, (a, b) in pairs if a != b), len(trace))
        if len(written) - kept <= AHEAD_CHARACTERS:
            return ""  # a hand-off opened ahead that the trace does not make: closed unused
        raise ValueError(f"the transcript left the trace after {kept} characters")


def load_traces(path: Path, count: int, min_tokens: int) -> Traces:
    """The first `count` rows of `path` whose trace has at least `min_tokens` tokens."""
    questions, texts = [], []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        text = trace_text(row)
        if len(tokenize(text)) >= min_tokens:
            questions.append(str(row.get("problem") or row.get("question") or ""))
            texts.append(text)
        if len(texts) == count:
            break
    if not texts:
        raise ValueError(f"{path} has no trace of at least {min_tokens} tokens")
    return Traces(questions, texts)
