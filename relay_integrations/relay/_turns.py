"""The method as a table of turns.

A turn is one model writing until something hands control on (the paper's segment). A
generation walks three turns:

========  ==============================  ===============================  =====================
turn      writer                          ends at                          then
========  ==============================  ===============================  =====================
reason    the large model                 a calibrated cue                 relay
                                          the end of reasoning, the        answer
                                          reasoning budget, its own end
relay     the small model                 the end of its sentence, its     reason
                                          segment cap, a failure
                                          the end of reasoning (if the     answer
                                          policy lets it), the budget
answer    the answer model (the small     the caller's stops, its end      (done)
          one by default)                 a failure of the small model     answer, by the large
========  ==============================  ===============================  =====================

A prompt whose reasoning is closed (``enable_thinking=false``) starts at the answer; any other
starts at reason. A turn not in the table (the budget ran out) ends the generation. Each turn
decides, after each of its requests, what the request's end means (:class:`TurnDecision`),
and may open the next turn's request before the hand-off is certain (its speculative hand-off:
:mod:`._speculative_handoff`)::

    turns = MethodTurns(config, cues)
    turn = turns.first(run)
    while turn is not None:
        segment = ...  # the run plays the turn
        turn = turns.after(turn, segment, run)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from ..upstream.config import ModelRole
from ._speculative_handoff import NextTurn
from .config import Phase, RelayConfig
from .cues import CueSet
from .reasoning import PromptReasoning
from .result import Segment, SegmentEnd
from .sentences import SENTENCE_STOPS, is_sentence_end, may_end_here

TurnName = Literal["reason", "relay", "answer"]


class RunState(Protocol):
    """What the table reads of a generation in progress."""

    @property
    def phase(self) -> Phase: ...
    @property
    def transcript(self) -> str: ...
    @property
    def mode(self) -> PromptReasoning: ...
    @property
    def small_available(self) -> bool: ...
    @property
    def answer_stops(self) -> Sequence[str]: ...
    @property
    def answer_extra_body(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True)
class RequestEnd:
    """How one request ended, as the turn's decision function sees it: the server's finish
    and stop reasons, the turn's tokens so far, and the transcript and phase it left."""

    finish_reason: str | None
    stop_reason: str | int | None
    turn_tokens: int
    transcript: str
    phase: Phase
    pieces: int = 0
    """Stream pieces that carried text."""


@dataclass(frozen=True)
class TurnDecision:
    """What a request's end means for its turn, as a value the turn applies: how the turn
    ended (None: the model writes on), where to cut the transcript first (the hand-off point
    of a cue, the end of a sentence), and the cue that handed off."""

    ended: SegmentEnd | None
    cut: int | None = None
    cue: str | None = None


WRITE_ON = TurnDecision(None)

Decide = Callable[[RequestEnd], TurnDecision]
"""Decides, after each request of a turn, how the turn ended."""

HandoffForecast = Callable[[int], NextTurn | None]
"""Given the turn's tokens once the next one arrives: the turn that follows if that token
confirms a hand-off at the end of the transcript, else None (a speculative hand-off opens its
request then)."""


@dataclass(frozen=True)
class Turn:
    """One row of the table: who writes, where the turn stops, what each request's end means,
    which turn comes next, and where it opens the next turn's request early (its speculative
    hand-off; None when the policy turns it off)."""

    name: TurnName
    writer: Callable[[RunState], ModelRole]
    stops: Callable[[RunState], Sequence[str]]
    decide: Decide
    then: Mapping[SegmentEnd, TurnName]
    cap: int | None = None
    extra_body: Callable[[RunState], Mapping[str, Any]] = field(default=lambda run: {})
    speculative_handoff: Callable[[RunState], HandoffForecast | None] = field(
        default=lambda run: None
    )


class MethodTurns:
    """The three turns for one configuration and cue set, and the walk between them."""

    def __init__(self, config: RelayConfig, cues: CueSet) -> None:
        self.config, self.cues = config, cues
        policy = config.policy
        self.reason = Turn(
            name="reason",
            writer=lambda run: "large",
            stops=self._large_stops,
            decide=self._after_large,
            then={
                "cue": "relay",
                "end_of_reasoning": "answer",
                "reasoning_budget": "answer",
                "stop": "answer",  # it ended without closing the reasoning: answer anyway
            },
            speculative_handoff=self._handoff_at_cue,
        )
        self.relay = Turn(
            name="relay",
            writer=lambda run: "small",
            stops=lambda run: self.reasoning_stops("small"),
            decide=self._after_small,
            then={
                "sentence_end": "reason",
                "segment_cap": "reason",
                "small_ended_reasoning": "reason",
                "stop": "reason",  # end of sequence mid-reasoning: the large model decides
                "failed": "reason",
                "end_of_reasoning": "answer",
                "reasoning_budget": "answer",
            },
            cap=policy.max_small_tokens,
            speculative_handoff=self._handoff_at_sentence_end,
        )
        self.answer = Turn(
            name="answer",
            writer=self._answer_model,
            stops=lambda run: run.answer_stops,
            decide=_after_answer,
            then={"failed": "answer"},  # the small model failed: the large one answers
            extra_body=lambda run: {"include_stop_str_in_output": False, **run.answer_extra_body},
        )

    def first(self, run: RunState) -> Turn:
        return self.reason if run.phase == "reasoning" else self.answer

    def after(self, turn: Turn, segment: Segment, run: RunState) -> Turn | None:
        """The turn after `turn` ended with `segment`; None: the generation is over. The answer
        follows another turn only while the reasoning is open (a model that answered without
        reasoning has written the answer already)."""
        following = turn.then.get(segment.ended_by)
        if following == "answer" and turn is not self.answer and run.phase != "reasoning":
            return None
        return None if following is None else getattr(self, following)

    def reasoning_stops(self, role: ModelRole) -> tuple[str, ...]:
        """The stop strings of `role`'s turns in the reasoning (the end of reasoning, then the
        cues or the sentence ends), most important first: a server that takes only a few gets
        the end of reasoning (the endpoint finds the others past its limit in the stream)."""
        if role == "small":
            return (self.config.markers.end, *SENTENCE_STOPS)
        return (self.config.markers.end, *self.cues.stop_strings)

    def _large_stops(self, run: RunState) -> tuple[str, ...]:
        if run.phase == "answer":  # the model answered without reasoning: no switching
            return ()
        if not run.small_available:
            return (self.config.markers.end,)
        return self.reasoning_stops("large")

    def _answer_model(self, run: RunState) -> ModelRole:
        policy = self.config.policy
        closed = run.mode is PromptReasoning.CLOSED
        role = policy.no_reasoning_model if closed else policy.answer_model
        return role if run.small_available else "large"

    def _handoff_at_cue(self, run: RunState) -> HandoffForecast | None:
        """The relay turn, when the large model's text ends one token short of a cue."""
        policy = self.config.policy
        if not policy.speculative_handoff:
            return None

        def forecast(turn_tokens: int) -> NextTurn | None:
            if run.phase != "reasoning" or not run.small_available:
                return None
            if turn_tokens <= policy.cooldown_tokens:
                return None
            cue = self.cues.pending(run.transcript)
            if cue is None:
                return None
            cap = policy.max_small_tokens
            return NextTurn(
                "small", self.reasoning_stops("small"), cue.completion, cue.confirmed_by, cap
            )

        return forecast

    def _handoff_at_sentence_end(self, run: RunState) -> HandoffForecast | None:
        """The reason turn, when the small model's text ends in a likely sentence end."""
        if not self.config.policy.speculative_handoff:
            return None

        def forecast(turn_tokens: int) -> NextTurn | None:
            if run.phase != "reasoning" or not may_end_here(run.transcript):
                return None
            return NextTurn("large", self._large_stops(run), "", " \n")

        return forecast

    def _after_large(self, end: RequestEnd) -> TurnDecision:
        """A large request ended: at a cue (hand off at its hand-off point, unless it came
        within the cooldown), at the end of reasoning, at the budget, or at its own end."""
        if end.finish_reason == "length":
            return TurnDecision("length")
        if end.stop_reason == self.config.markers.end:
            return TurnDecision("end_of_reasoning")
        if not isinstance(end.stop_reason, str):
            return TurnDecision("stop")
        if end.phase != "reasoning":
            return WRITE_ON  # a cue fired in an answer written without reasoning: write on
        match = self.cues.match_stop(end.transcript, end.stop_reason)
        if match is None or end.turn_tokens <= self.config.policy.cooldown_tokens:
            return WRITE_ON  # not a cue here, or right after taking control: write on
        return TurnDecision("cue", cut=match.handoff, cue=match.cue)

    def _after_small(self, end: RequestEnd) -> TurnDecision:
        """A small request ended: at the end of reasoning (kept only if the policy lets the
        small model end it), at a sentence end (cut to a token boundary), or at its cap."""
        marker, transcript = self.config.markers.end, end.transcript
        if end.stop_reason == marker:
            if self.config.policy.small_may_end_reasoning:
                return TurnDecision("end_of_reasoning")
            return TurnDecision(
                "small_ended_reasoning", cut=len(transcript[: -len(marker)].rstrip())
            )
        if end.stop_reason in SENTENCE_STOPS:
            sentence_ended = is_sentence_end(transcript)
            # write on from a token boundary; "e.g. ", "3. " inside math, ...: the sentence goes on
            cut = len(transcript.rstrip()) if sentence_ended or end.stop_reason.strip() else None
            return TurnDecision("sentence_end" if sentence_ended else None, cut=cut)
        if end.finish_reason == "length":
            capped = end.turn_tokens >= self.config.policy.max_small_tokens
            return TurnDecision("segment_cap" if capped else "length")
        return TurnDecision("stop")  # end of sequence mid-reasoning: the large model decides


def _after_answer(end: RequestEnd) -> TurnDecision:
    return TurnDecision("length" if end.finish_reason == "length" else "stop")
