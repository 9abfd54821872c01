"""Scoring a trace with the small model: its margin on every reasoning token, in one prefill.

The text scored is exactly what the small model sees at run time: the chat rendered by the
same :class:`PromptRenderer` as the switcher's (the server's own chat template by default),
the reasoning opener, then the reasoning. One ``/v1/completions`` request with
``prompt_logprobs=2`` returns, at every position, the two likeliest tokens; the margin there
is p(top1) - p(top2) in probability space. ``return_token_ids`` names the token at each
position, and its decoded text places it in the reasoning::

    scorer = TraceScorer(Endpoint(config.small, "small"), ServerChatTemplate())
    scored = await scorer.score(trace)        # a ScoredTrace
    scored.margins[:3], scored.token_starts[:3]
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from ..relay.config import ReasoningMarkers
from ..relay.reasoning import PromptReasoning
from ..upstream.answers import Detokenized, Tokenized
from ..upstream.endpoint import Endpoint
from ..upstream.errors import RelayError
from ..upstream.rendering import ChatInput, PromptRenderer
from .statistics import ScoredTrace
from .traces import Trace


class ScoringError(RelayError):
    """The small model's scores cannot be lined up with the trace; says where and why."""


@dataclass(frozen=True)
class ScoringText:
    """The text the small model scores, and where its reasoning starts."""

    text: str
    reasoning_start: int


class TraceScorer:
    """Scores traces on one small endpoint (requests run concurrently up to its limit)."""

    def __init__(
        self,
        endpoint: Endpoint,
        renderer: PromptRenderer,
        markers: ReasoningMarkers | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.renderer = renderer
        self.markers = markers or ReasoningMarkers()
        self.chat_template_kwargs = dict(chat_template_kwargs or {})

    async def scoring_text(self, trace: Trace) -> ScoringText:
        """The rendered chat, the opener the small model would see, then the reasoning."""
        chat = ChatInput(trace.messages, None, self.chat_template_kwargs)
        prompt = (await self.renderer.render(self.endpoint, chat)).text
        mode = PromptReasoning.of(prompt, self.markers)
        if mode is PromptReasoning.CLOSED:
            raise ScoringError(
                "the small model's chat template closes the reasoning in the prompt; "
                "calibrate with thinking enabled"
            )
        if mode is PromptReasoning.MODEL_OPENS:
            opener = self.markers.start + "\n"
        else:
            opener = "" if prompt.endswith(("\n", " ")) else "\n"
        text = prompt + opener + trace.reasoning
        return ScoringText(text, len(text) - len(trace.reasoning))

    async def score(self, trace: Trace) -> ScoredTrace:
        """The margin of every reasoning token of `trace`.

        A trace longer than the small model's context window is scored up to the window.
        """
        target = await self.scoring_text(trace)
        ids = await self._token_ids(target.text)
        text = target.text
        window = (await self.endpoint.model_info()).max_model_len
        if window is not None and len(ids) >= window:
            ids = ids[: window - 1]  # room for the one token the request must generate
            text = await self._detokenize(ids)
        response = await self.endpoint.post_json(
            "/v1/completions",
            {
                "model": self.endpoint.config.model,
                "prompt": ids,
                "max_tokens": 1,
                "temperature": 0.0,
                "prompt_logprobs": 2,
                "return_token_ids": True,
            },
            _ScoredPrompt,
        )
        return _line_up(trace.id, text, target.reasoning_start, ids, response)

    async def _token_ids(self, text: str) -> list[int]:
        body = {"model": self.endpoint.config.model, "prompt": text, "add_special_tokens": False}
        return (await self.endpoint.post_json("/tokenize", body, Tokenized)).tokens

    async def _detokenize(self, ids: list[int]) -> str:
        body = {"model": self.endpoint.config.model, "tokens": ids}
        return (await self.endpoint.post_json("/detokenize", body, Detokenized)).prompt


class _TokenLogprob(BaseModel):
    logprob: float
    rank: int
    decoded_token: str | None = None


class _ScoredChoice(BaseModel):
    prompt_logprobs: list[dict[str, _TokenLogprob] | None] | None = None
    prompt_token_ids: list[int] | None = None


class _ScoredPrompt(BaseModel):
    """The answer of a one-token completion with ``prompt_logprobs``: each prompt token's
    top log-probabilities (the first token's: None)."""

    choices: list[_ScoredChoice] = Field(min_length=1)


def _line_up(
    trace_id: str, text: str, reasoning_start: int, ids: list[int], response: _ScoredPrompt
) -> ScoredTrace:
    """Token starts (in reasoning coordinates) and margins of the tokens in the reasoning."""
    choice = response.choices[0]
    logprobs = choice.prompt_logprobs
    echoed = choice.prompt_token_ids or ids
    if not logprobs or len(logprobs) != len(ids) or list(echoed) != ids:
        raise ScoringError(
            f"trace {trace_id}: the server returned {len(logprobs or [])} prompt logprobs for "
            f"{len(ids)} prompt tokens; it must be vLLM with prompt_logprobs support"
        )
    pieces: list[str] = []
    margins: list[float] = []
    for position in range(1, len(ids)):  # position 0 has no prediction
        entry = logprobs[position] or {}
        actual = entry.get(str(ids[position]))
        piece = actual.decoded_token if actual is not None else None
        if piece is None:
            raise ScoringError(f"trace {trace_id}: token {position} came back without its text")
        pieces.append(piece)
        margins.append(_margin(entry))
    decoded = "".join(pieces)
    if not text.endswith(decoded):
        same = 0
        while same < min(len(text), len(decoded)) and text[-1 - same] == decoded[-1 - same]:
            same += 1
        near = text[max(len(text) - same - 20, 0) : len(text) - same + 1]
        raise ScoringError(
            f"trace {trace_id}: the decoded tokens do not spell the scored text; they differ "
            f"{same} characters before its end, at {near!r}"
        )
    start = len(text) - len(decoded)
    starts, kept = [], []
    for piece, margin in zip(pieces, margins, strict=True):
        end = start + len(piece)
        if end > reasoning_start:  # the token holds reasoning text
            starts.append(start - reasoning_start)
            kept.append(margin)
        start = end
    reasoning = text[reasoning_start:]
    return ScoredTrace(trace_id, reasoning, tuple(starts), tuple(kept))


def _margin(entry: Mapping[str, _TokenLogprob]) -> float:
    """p(top1) - p(top2) from one position's top-2 log-probabilities (found by rank)."""
    by_rank = {info.rank: info.logprob for info in entry.values()}
    top1 = math.exp(by_rank[1])
    top2 = math.exp(by_rank[2]) if 2 in by_rank else 0.0
    return top1 - top2
