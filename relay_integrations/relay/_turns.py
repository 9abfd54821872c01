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
starts at reason. A turn not in the table (the budget ran out) ends the generation. A
:class:`Turn` is a row of values (its writer, its stops, its cap, its successors, where it may
hand off early); :class:`MethodTurns` reads them for a generation in progress: who writes, the
stop strings, what each request's end means (:class:`TurnDecision`), and the turn a confirmed
hand-off leads to, whose request may be opened before it is certain (the speculative hand-off:
:mod:`._speculative_handoff`)::

    turns = MethodTurns(config, cues)
    turn = turns.first(run)
    while turn is not None:
        segment = ...  # the run plays the turn: turns.writer(turn, run), turns.stops(turn, run)
        turn = turns.after(turn, segment, run)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from ..upstream.config import ModelRole
from .config import Phase, RelayConfig
from .cues import CueSet
from .reasoning import PromptReasoning
from .result import Segment, SegmentEnd
from .sentences import SENTENCE_STOPS, is_sentence_end, may_end_here

TurnName = Literal["reason", "relay", "answer"]
Writer = Literal["large", "small", "answer model"]
"""Who writes a turn; "answer model": the policy's (``answer_model``, or
``no_reasoning_model`` when the prompt closed the reasoning), the large one once the small one
has failed."""
StopSet = Literal["cues", "sentence ends", "answer stops"]
"""Where a turn's requests stop: the end of reasoning and the cues (none once the model
answered without reasoning; no cues once the small model has failed), the end of reasoning
and the sentence ends, or the caller's stops."""
EarlyHandoff = Literal["at a cue", "at a sentence end"]
"""Where a turn may open the next turn's request one token early."""


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
    room: int = 0
    """Tokens the writer may still write in the phase the request left (the budget, its
    context window, the reasoning limit and the answer's reserve)."""
    spent: SegmentEnd = "length"
    """Why there is no room, when there is none: the budget or context, or the reasoning
    limit (``reasoning_budget``)."""


@dataclass(frozen=True)
class TurnDecision:
    """What a request's end means for its turn, as a value the turn applies: how the turn
    ended (None: the model writes on), where to cut the transcript first (the hand-off point
    of a cue, the end of a sentence), and the cue that handed off."""

    ended: SegmentEnd | None
    cut: int | None = None
    cue: str | None = None


WRITE_ON = TurnDecision(None)


@dataclass(frozen=True)
class Turn:
    """One row of the table: who writes, where its requests stop, at most how many tokens it
    writes, which turn follows each way it ends, and where it may open the next turn's
    request early (None: nowhere, or the policy turns the speculative hand-off off)."""

    name: TurnName
    writer: Writer
    stops: StopSet
    then: Mapping[SegmentEnd, TurnName]
    cap: int | None = None
    early_handoff: EarlyHandoff | None = None


@dataclass(frozen=True)
class Upcoming:
    """The turn that follows if the hand-off at the end of the text is confirmed, and what
    confirms it: `completion`, what the next token must write (a cue's comma), or nothing;
    `confirmed_by`, characters that confirm it when the text goes on with one of them (none:
    the stop string fires once the completion is written)."""

    turn: Turn
    completion: str
    confirmed_by: str


class MethodTurns:
    """The three turns for one configuration and cue set, and the walk between them."""

    def __init__(self, config: RelayConfig, cues: CueSet) -> None:
        self.config, self.cues = config, cues
        policy = config.policy
        early = policy.speculative_handoff
        self.reason = Turn(
            name="reason",
            writer="large",
            stops="cues",
            then={
                "cue": "relay",
                "end_of_reasoning": "answer",
                "reasoning_budget": "answer",
                "stop": "answer",  # it ended without closing the reasoning: answer anyway
            },
            early_handoff="at a cue" if early else None,
        )
        self.relay = Turn(
            name="relay",
            writer="small",
            stops="sentence ends",
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
            early_handoff="at a sentence end" if early else None,
        )
        self.answer = Turn(
            name="answer",
            writer="answer model",
            stops="answer stops",
            then={"failed": "answer"},  # the small model failed: the large one answers
        )
        self._decisions = {
            "reason": self._after_large,
            "relay": self._after_small,
            "answer": _after_answer,
        }

    def first(self, run: RunState) -> Turn:
        return self.reason if run.phase == "reasoning" else self.answer

    def after(self, turn: Turn, segment: Segment, run: RunState) -> Turn | None:
        """The turn after `turn` ended with `segment`; None: the generation is over. The answer
        follows another turn only while the reasoning is open (a model that answered without
        reasoning has written the answer already)."""
        following = turn.then.get(segment.ended_by)
        if following == "answer" and turn is not self.answer and run.phase != "reasoning":
            return None
        return None if following is None else self.named(following)

    def named(self, name: TurnName) -> Turn:
        return {"reason": self.reason, "relay": self.relay, "answer": self.answer}[name]

    # --- a row's values, read for a generation in progress -------------------------------

    def writer(self, turn: Turn, run: RunState) -> ModelRole:
        """The model that writes `turn` now."""
        if turn.writer != "answer model":
            return turn.writer
        policy = self.config.policy
        closed = run.mode is PromptReasoning.CLOSED
        role = policy.no_reasoning_model if closed else policy.answer_model
        return role if run.small_available else "large"

    def stops(self, turn: Turn, run: RunState) -> tuple[str, ...]:
        """The stop strings of `turn`'s requests now, most important first."""
        if turn.stops == "answer stops":
            return tuple(run.answer_stops)
        if turn.stops == "sentence ends":
            return self.reasoning_stops("small")
        if run.phase == "answer":  # the model answered without reasoning: no switching
            return ()
        if not run.small_available:
            return (self.config.markers.end,)
        return self.reasoning_stops("large")

    def extra_body(self, turn: Turn, run: RunState) -> Mapping[str, Any]:
        """The request fields of `turn` beyond the generation's (the answer's: the caller's
        stops left out of the text, a forced format)."""
        if turn.stops == "answer stops":
            return {"include_stop_str_in_output": False, **run.answer_extra_body}
        return {}

    def decide(self, turn: Turn, end: RequestEnd) -> TurnDecision:
        """What the end of one of `turn`'s requests means for the turn."""
        return self._decisions[turn.name](end)

    def upcoming(self, turn: Turn, run: RunState, turn_tokens: int) -> Upcoming | None:
        """Given `turn`'s tokens once the next one arrives: the turn that follows if that
        token confirms a hand-off at the end of the transcript, else None (a speculative
        hand-off opens that turn's request then)."""
        if turn.early_handoff is None or run.phase != "reasoning":
            return None
        if turn.early_handoff == "at a sentence end":
            return Upcoming(self.reason, "", " \n") if may_end_here(run.transcript) else None
        if not run.small_available or turn_tokens <= self.config.policy.cooldown_tokens:
            return None
        cue = self.cues.pending(run.transcript)
        return None if cue is None else Upcoming(self.relay, cue.completion, cue.confirmed_by)

    def reasoning_stops(self, role: ModelRole) -> tuple[str, ...]:
        """The stop strings of `role`'s turns in the reasoning (the end of reasoning, then the
        cues or the sentence ends), most important first: a server that takes only a few gets
        the end of reasoning (the endpoint finds the others past its limit in the stream)."""
        if role == "small":
            return (self.config.markers.end, *SENTENCE_STOPS)
        return (self.config.markers.end, *self.cues.stop_strings)

    # --- what a request's end means --------------------------------------------------------

    def _after_large(self, end: RequestEnd) -> TurnDecision:
        """A large request ended: at a cue (hand off at its hand-off point, unless it came
        within the cooldown), at the end of reasoning, at the budget, or at its own end."""
        if end.finish_reason == "length":
            return _out_of_allowance(end)
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
            return TurnDecision("segment_cap") if capped else _out_of_allowance(end)
        return TurnDecision("stop")  # end of sequence mid-reasoning: the large model decides


def _after_answer(end: RequestEnd) -> TurnDecision:
    return _out_of_allowance(end) if end.finish_reason == "length" else TurnDecision("stop")


def _out_of_allowance(end: RequestEnd) -> TurnDecision:
    """A request wrote all it was allowed. Room left means the phase changed while it ran (a
    model that answered without reasoning is no longer held to the answer's reserve): the
    turn writes on. Otherwise the turn ends for the reason the room ran out."""
    if end.pieces > 0 and end.room > 0:
        return WRITE_ON
    return TurnDecision(end.spent)
