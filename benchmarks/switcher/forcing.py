"""Forcing the tiny random models to write the trace: the plain regex or its canonical tokens."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from relay_integrations.testing import forcing, regex_literal

from .servers import Tokenizer
from .traces import Trace


@dataclass(frozen=True)
class Rest:
    """The rest of a trace from one point: its text, canonical token ids, and a logit bias."""

    text: str
    ids: list[int]
    bias: dict[str, int]  # canonical ids, longer tokens favoured more


def canonical_bias(ids: Sequence[int], pieces: Sequence[str]) -> dict[str, int]:
    """+100 for a token of 16 or more bytes, 6 less for each byte shorter (at least +10).

    Under the regex mask the model may only write the rest of the text; among the tokens that
    fit, the canonical ones win, and of those the longest, which is the canonical split of
    the text (checked: a ~340-token trace comes out token for token). The byte-level BPE
    pieces (``token_strs``) have one character a byte.
    """
    return {
        str(i): 100 - 6 * (16 - min(max(len(p), 1), 16)) for i, p in zip(ids, pieces, strict=True)
    }


@dataclass
class TokenForcing:
    """Forces the rest of the trace in its canonical tokens (see `canonical_bias`).

    ``rests`` maps a transcript length (a possible hand-off point) to the rest from there;
    anywhere else it falls back to the plain regex and counts it.
    """

    trace: str
    rests: dict[int, Rest]
    fallbacks: int = 0

    def body(self, transcript: str) -> dict[str, Any]:
        if not self.trace.startswith(transcript):
            return {}  # a request opened ahead of a hand-off the trace does not make
        rest = self.rests.get(len(transcript))
        if rest is None:
            self.fallbacks += 1
            return {"structured_outputs": {"regex": regex_literal(self.trace[len(transcript) :])}}
        return {"structured_outputs": {"regex": regex_literal(rest.text)}, "logit_bias": rest.bias}


async def make_rest(tok: Tokenizer, text: str) -> Rest:
    ids, pieces = await tok.ids_and_pieces(text)
    return Rest(text, ids, canonical_bias(ids, pieces))


async def token_rests(tok: Tokenizer, trace: str) -> dict[int, Rest]:
    """The rest of `trace` from every place a segment can start."""
    points = {0}
    points.update(m.end() for m in re.finditer(r"[.,?!]|Now|</think>", trace))
    return {p: await make_rest(tok, trace[p:]) for p in sorted(points) if p < len(trace)}


Forcer = Callable[[str], dict[str, Any]]  # transcript so far -> request fields


def forcer(mode: str, trace: Trace, rests: dict[int, Rest]) -> tuple[Forcer, TokenForcing]:
    tokens = TokenForcing(trace.text, rests)
    if mode == "tokens":
        return tokens.body, tokens
    regex = forcing(trace.text)
    return (lambda transcript: dict(regex("large", "reasoning", transcript))), tokens


def forced_body(mode: str, rest: Rest) -> dict[str, Any]:
    body: dict[str, Any] = {"structured_outputs": {"regex": regex_literal(rest.text)}}
    return {**body, "logit_bias": rest.bias} if mode == "tokens" else body
