"""The long prompt of each context length, and the trace the models are forced to write::

    text = source_text(Path("/work/shared/data/math500.jsonl"))  # or a built-in text
    messages, tokens = await sized_messages(http, server, text, 4096)  # prompt of ~4096 tokens

The user message is MATH-500 problems, numbered, one after another (repeated from the start
when the file runs out), cut so that the rendered chat is just under the length asked (within 3%); the large server's ``/tokenize`` counts it. Without the file, a built-in
deterministic text of numbered sentences takes its place.
"""

from __future__ import annotations

import json
from itertools import count
from pathlib import Path
from typing import Any

import httpx

from .servers import Server

MATH500 = Path("/work/shared/data/math500.jsonl")

CUES = ["Therefore,", "Now"]
TRACE = (
    "<think>\nThe user gives a long list of problems and asks about the first one. I read the "
    "first problem carefully before doing anything else. Therefore, the first step is to "
    "restate what it asks. The problem wants a point in polar coordinates. Now I recall how "
    "polar coordinates are defined from the origin. The radius is the distance from the origin "
    "to the point. Therefore, the radius here is three units. The angle is measured from the "
    "positive x axis. Now the point lies on the positive y axis. The angle is a quarter turn."
    "\n</think>\n\nThe point is (3, pi/2) in polar coordinates."
)
"""What every generation writes: four cues ("Therefore," twice, "Now" twice), each a switch
(the small model writes to the sentence's end), then the answer."""
SWITCHES = 4

QUESTION = "\n\nSolve only the first problem above and give its answer in polar coordinates."


def source_text(path: Path = MATH500) -> list[str]:
    """The problems the long prompt is made of: MATH-500's, or built-in sentences."""
    if path.is_file():
        lines = path.read_text().splitlines()
        return [json.loads(line)["problem"] for line in lines if line.strip()]
    return [
        f"A shop sells {n} boxes of {n % 7 + 2} pencils each; how many pencils is that?"
        for n in range(1, 200)
    ]


def user_message(problems: list[str], characters: int) -> str:
    """Numbered problems, cycling, cut at `characters` characters, then the question."""
    parts: list[str] = []
    size = 0
    for n in count():
        if size >= characters:
            break
        parts.append(f"Problem {n + 1}: {problems[n % len(problems)]}\n")
        size += len(parts[-1])
    return "".join(parts)[:characters] + QUESTION


def messages_of(user: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": user}]


async def prompt_tokens(http: httpx.AsyncClient, server: Server, user: str) -> int:
    """The rendered chat's tokens, by the server's own template and tokenizer."""
    body = {"model": server.model, "messages": messages_of(user), "add_generation_prompt": True}
    response = await http.post(server.root + "/tokenize", json=body)
    response.raise_for_status()
    tokens: int = response.json()["count"]
    return tokens


async def sized_messages(
    http: httpx.AsyncClient, server: Server, problems: list[str], tokens: int
) -> tuple[list[dict[str, Any]], int]:
    """The chat whose prompt is `tokens` long (within 3%, never longer), and its
    measured length: the characters are scaled by the measured tokens a character until the
    prompt fits."""
    characters = tokens * 3
    for _ in range(8):
        user = user_message(problems, characters)
        measured = await prompt_tokens(http, server, user)
        if tokens * 0.97 <= measured <= tokens:
            return messages_of(user), measured
        characters = int(characters * tokens * 0.985 / measured)
    raise RuntimeError(f"no prompt of about {tokens} tokens: the last was {measured}")
