"""What a relay generation produces: events while it streams, and a result at the end."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field

from ..upstream.config import ModelRole
from .config import Phase

FinishReason = Literal["stop", "length", "error"]
SegmentEnd = Literal[
    "cue",  # the large model wrote a switch cue: the small model takes over
    "sentence_end",  # the small model finished the sentence: the large model resumes
    "segment_cap",  # the small segment reached policy.max_small_tokens
    "end_of_reasoning",  # the reasoning ended (the end marker was written)
    "small_ended_reasoning",  # the small model wrote the end marker; dropped, large resumes
    "stop",  # end of sequence or a user stop sequence
    "length",  # the token budget (or the context window) ran out
    "reasoning_budget",  # policy.max_reasoning_tokens reached: the relay closes the reasoning
    "failed",  # the endpoint failed and the policy moved on without it
]


class ModelUsage(BaseModel):
    """Tokens one model processed over a generation (summed over its requests)."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = Field(
        default=0,
        description="Prompt tokens served from the prefix cache, over the requests that said",
    )
    cache_unreported: int = Field(
        default=0,
        description="Requests that did not say how many prompt tokens the cache served: a "
        "server without --enable-prompt-tokens-details, or a request closed at a stop string "
        "found in the stream",
    )
    completion_tokens: int = 0

    def add(self, prompt: int, cached: int | None, completion: int) -> None:
        self.requests += 1
        self.prompt_tokens += prompt
        if cached is None:
            self.cache_unreported += 1
        else:
            self.cached_tokens += cached
        self.completion_tokens += completion


class Segment(BaseModel):
    """One stretch of text written by one model without interruption."""

    model: ModelRole
    phase: Phase
    text: str
    ended_by: SegmentEnd
    cue: str | None = Field(default=None, description="The cue that ended a large segment")
    usage: ModelUsage = Field(default_factory=ModelUsage)
    seconds: float = 0.0


class RelayStats(BaseModel):
    large_share: float = Field(description="Share of generated tokens written by the large model")
    switches: int = Field(description="Times a cue handed the reasoning to the small model")
    seconds: dict[str, float] = Field(description="Wall time spent in each model's requests")
    total_seconds: float = Field(description="From the call, the prompts' rendering included")
    time_to_first_token: float | None = Field(description="From the call to the first text")
    speculative_handoffs: int = Field(
        default=0, description="Hand-offs whose request was opened before the confirming token"
    )
    speculative_misses: int = Field(
        default=0, description="Requests opened ahead of a hand-off that did not come, closed"
    )
    resumes: int = Field(
        default=0,
        description="Streams that broke after sending text and went on from the text so far "
        "(a vLLM replica lost mid-request; SwitchPolicy.max_resumes)",
    )
    degraded: str | None = Field(
        default=None,
        description="Why the large model wrote what the small one would have (the small "
        "model's server failed, or was known down: SwitchPolicy.on_small_failure='use_large'); "
        "None when both models served as planned",
    )
    warm_up: ModelUsage | None = Field(
        default=None,
        description="The request that put the small model's prompt in its prefix cache when "
        "the generation started (SwitchPolicy.warm_small_prompt), once finished; not in "
        "`usage`, which counts the requests whose text the generation keeps",
    )


class RelayResult(BaseModel):
    """The outcome of one relay generation.

    ``text`` is everything generated, markers included; ``reasoning`` and ``answer`` are
    its two parts without the markers.
    """

    generation_id: str
    text: str
    reasoning: str
    answer: str
    finish_reason: FinishReason
    segments: list[Segment]
    usage: dict[str, ModelUsage]
    stats: RelayStats

    @property
    def completion_tokens(self) -> int:
        return sum(u.completion_tokens for u in self.usage.values())

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens over both models and all requests (a prefix counts once a request)."""
        return sum(u.prompt_tokens for u in self.usage.values())

    @property
    def cached_tokens(self) -> int | None:
        """Of those, the ones the servers' prefix caches served; None when some request did
        not report it (see :attr:`ModelUsage.cache_unreported`), not a misleading 0."""
        if any(u.cache_unreported for u in self.usage.values()):
            return None
        return sum(u.cached_tokens for u in self.usage.values())

    def summary(self) -> dict[str, Any]:
        """What adapters put beside a response: id, large-model share, switches, resumed
        streams, why it ran degraded (None: it did not), time, usage, and who wrote each
        segment (its model, phase, how it ended, its cue and tokens; the text is in the
        response)."""
        return {
            "generation_id": self.generation_id,
            "large_share": self.stats.large_share,
            "switches": self.stats.switches,
            "resumes": self.stats.resumes,
            "degraded": self.stats.degraded,
            "seconds": self.stats.total_seconds,
            "time_to_first_token": self.stats.time_to_first_token,
            "usage": {role: usage.model_dump() for role, usage in self.usage.items()},
            "segments": [
                {
                    "model": s.model,
                    "phase": s.phase,
                    "ended_by": s.ended_by,
                    "cue": s.cue,
                    "tokens": s.usage.completion_tokens,
                }
                for s in self.segments
            ],
        }

    @property
    def reasoning_tokens(self) -> int:
        """Tokens written in the reasoning phase, by both models."""
        return sum(s.usage.completion_tokens for s in self.segments if s.phase == "reasoning")


@dataclass(frozen=True, slots=True)
class TextDelta:
    """New visible text (markers excluded), tagged with who wrote it and in which phase."""

    text: str
    model: ModelRole
    phase: Phase


@dataclass(frozen=True, slots=True)
class SegmentDone:
    """A segment ended; control passes on (or the generation ends)."""

    segment: Segment


@dataclass(frozen=True, slots=True)
class RelayDone:
    """The last event of a stream."""

    result: RelayResult


RelayEvent = TextDelta | SegmentDone | RelayDone
