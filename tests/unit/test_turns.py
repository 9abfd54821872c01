"""The table of turns (relay/_turns.py), driven directly: every row of the table in the module
docstring, each way each turn ends (what a request's end means for its turn) and what follows
it, the values a row gives a generation in progress (writer, stops, request fields), and the
turn a confirmed hand-off leads to. No server: a run's state is a plain value."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from relay_integrations.relay import CueSet, EndpointConfig, RelayConfig, SwitchPolicy
from relay_integrations.relay._turns import (
    WRITE_ON,
    MethodTurns,
    RequestEnd,
    Turn,
    TurnDecision,
    TurnName,
)
from relay_integrations.relay.config import Phase
from relay_integrations.relay.reasoning import PromptReasoning
from relay_integrations.relay.result import Segment, SegmentEnd
from relay_integrations.relay.sentences import SENTENCE_STOPS

CUES = CueSet.from_list(["Therefore,", "Now"])
END = "</think>"


@dataclass
class Run:
    """A generation in progress, as the table reads it."""

    phase: Phase = "reasoning"
    transcript: str = "<think>\nLet me see."
    mode: PromptReasoning = PromptReasoning.MODEL_OPENS
    small_available: bool = True
    answer_stops: Sequence[str] = ("###",)
    answer_extra_body: Mapping[str, Any] = field(default_factory=dict)


def method(**policy: Any) -> MethodTurns:
    config = RelayConfig(
        large=EndpointConfig(base_url="http://large:8000/v1", model="large"),
        small=EndpointConfig(base_url="http://small:8000/v1", model="small"),
        cues=list(CUES.cues),
        policy=SwitchPolicy.model_validate({"cooldown_tokens": 2, **policy}),
    )
    return MethodTurns(config, CUES)


def segment(model: str, ended_by: SegmentEnd) -> Segment:
    return Segment(model=model, phase="reasoning", text="", ended_by=ended_by)


def end(
    transcript: str,
    stop_reason: str | int | None = None,
    finish_reason: str | None = "stop",
    turn_tokens: int = 10,
    phase: Phase = "reasoning",
    room: int = 0,
    spent: SegmentEnd = "length",
) -> RequestEnd:
    return RequestEnd(
        finish_reason, stop_reason, turn_tokens, transcript, phase, 3, room=room, spent=spent
    )


# --- the rows of the table: each (turn, end) and what follows ---------------------------------

TABLE: list[tuple[TurnName, SegmentEnd, TurnName | None]] = [
    ("reason", "cue", "relay"),
    ("reason", "end_of_reasoning", "answer"),
    ("reason", "reasoning_budget", "answer"),
    ("reason", "stop", "answer"),
    ("reason", "length", None),
    ("relay", "sentence_end", "reason"),
    ("relay", "segment_cap", "reason"),
    ("relay", "small_ended_reasoning", "reason"),
    ("relay", "stop", "reason"),
    ("relay", "failed", "reason"),
    ("relay", "end_of_reasoning", "answer"),
    ("relay", "reasoning_budget", "answer"),
    ("relay", "length", None),
    ("answer", "stop", None),
    ("answer", "length", None),
    ("answer", "failed", "answer"),
]


@pytest.mark.parametrize(("name", "ended_by", "following"), TABLE)
def test_each_end_of_each_turn_leads_where_the_table_says(
    name: TurnName, ended_by: SegmentEnd, following: TurnName | None
) -> None:
    turns = method()
    turn = turns.named(name)
    after = turns.after(turn, segment(turns.writer(turn, Run()), ended_by), Run())
    assert (after.name if after else None) == following


def test_the_table_lists_every_way_out_of_every_turn() -> None:
    turns = method()
    for name in ("reason", "relay", "answer"):
        turn = turns.named(name)
        listed = {ended for row, ended, following in TABLE if row == name and following}
        assert set(turn.then) == listed, name


def test_a_model_that_answered_without_reasoning_gets_no_second_answer() -> None:
    """The answer follows another turn only while the reasoning is open."""
    turns = method()
    answered = Run(phase="answer")
    assert turns.after(turns.reason, segment("large", "stop"), answered) is None
    assert turns.after(turns.relay, segment("small", "end_of_reasoning"), answered) is None
    failed = turns.after(turns.answer, segment("small", "failed"), answered)
    assert failed is turns.answer  # the large model answers instead


def test_the_first_turn_is_reason_unless_the_prompt_closed_the_reasoning() -> None:
    turns = method()
    assert turns.first(Run()) is turns.reason
    assert turns.first(Run(phase="answer", mode=PromptReasoning.CLOSED)) is turns.answer


def test_the_rows_are_values() -> None:
    turns = method(max_small_tokens=64)
    assert turns.reason == Turn(
        "reason", "large", "cues", turns.reason.then, early_handoff="at a cue"
    )
    assert (turns.relay.writer, turns.relay.stops, turns.relay.cap) == (
        "small",
        "sentence ends",
        64,
    )
    assert (turns.answer.writer, turns.answer.stops) == ("answer model", "answer stops")
    off = method(speculative_handoff=False)
    assert off.reason.early_handoff is None and off.relay.early_handoff is None


# --- what each request's end means ----------------------------------------------------------

REASON_ENDS: list[tuple[RequestEnd, TurnDecision]] = [
    (end("x. Now", finish_reason="length"), TurnDecision("length")),
    (end("x.", finish_reason="length", spent="reasoning_budget"), TurnDecision("reasoning_budget")),
    # the allowance ran out but room is left (it answered without reasoning): write on
    (end("x.", finish_reason="length", phase="answer", room=50), WRITE_ON),
    (end(f"x.\n{END}", stop_reason=END), TurnDecision("end_of_reasoning")),
    (end("x.", stop_reason=None), TurnDecision("stop")),  # end of sequence
    (end("x.", stop_reason=151645), TurnDecision("stop")),  # a stop token
    # a cue's stop string holds its right boundary; the hand-off is after the boundary
    (end("Let me see. Now ", stop_reason=" Now "), TurnDecision("cue", cut=15, cue="Now")),
    (end("It is. Therefore,", stop_reason=" Therefore,"), TurnDecision("cue", 17, "Therefore,")),
    (end("Let me see. Now ", stop_reason=" Now ", turn_tokens=2), WRITE_ON),  # the cooldown
    (end("The answer. Now ", stop_reason=" Now ", phase="answer"), WRITE_ON),  # no reasoning
    (end("x. Nowhere", stop_reason="Nowhere"), WRITE_ON),  # not one of the cue stops
]


@pytest.mark.parametrize(("request_end", "decision"), REASON_ENDS)
def test_each_end_of_a_large_request(request_end: RequestEnd, decision: TurnDecision) -> None:
    turns = method()
    assert turns.decide(turns.reason, request_end) == decision


SMALL_ENDS: list[tuple[dict[str, Any], RequestEnd, TurnDecision]] = [
    ({}, end(f"x. It is so.{END}", stop_reason=END), TurnDecision("small_ended_reasoning", 12)),
    ({"small_may_end_reasoning": True}, end(f"x.{END}", END), TurnDecision("end_of_reasoning")),
    ({}, end("x. It is 4. ", stop_reason=". "), TurnDecision("sentence_end", cut=11)),
    ({}, end("x. It is e.g. ", stop_reason=". "), TurnDecision(None, cut=13)),  # not an end
    ({}, end("x. It is 4.\n", stop_reason=".\n"), TurnDecision("sentence_end", cut=11)),
    ({}, end("x. So", finish_reason="length", turn_tokens=128), TurnDecision("segment_cap")),
    ({}, end("x. So", finish_reason="length", turn_tokens=20), TurnDecision("length")),
    (
        {},
        end("x. So", finish_reason="length", turn_tokens=20, spent="reasoning_budget"),
        TurnDecision("reasoning_budget"),
    ),
    ({}, end("x. So", stop_reason=None), TurnDecision("stop")),
]


@pytest.mark.parametrize(("policy", "request_end", "decision"), SMALL_ENDS)
def test_each_end_of_a_small_request(
    policy: dict[str, Any], request_end: RequestEnd, decision: TurnDecision
) -> None:
    turns = method(**policy)
    assert turns.decide(turns.relay, request_end) == decision


@pytest.mark.parametrize(
    ("finish", "ended"), [("length", "length"), ("stop", "stop"), (None, "stop")]
)
def test_each_end_of_an_answer_request(finish: str | None, ended: SegmentEnd) -> None:
    turns = method()
    request_end = end("The answer is 4.", finish_reason=finish, phase="answer")
    assert turns.decide(turns.answer, request_end) == TurnDecision(ended)


def test_a_request_out_of_allowance_with_room_left_writes_on_and_one_with_no_text_ends() -> None:
    turns = method()
    room_left = end("The answer", finish_reason="length", phase="answer", room=10)
    assert turns.decide(turns.answer, room_left) == WRITE_ON
    wrote_nothing = RequestEnd("length", None, 0, "", "answer", pieces=0, room=10)
    assert turns.decide(turns.answer, wrote_nothing) == TurnDecision("length")


# --- a row's values for a run in progress ----------------------------------------------------


def test_writers() -> None:
    turns = method()
    assert turns.writer(turns.reason, Run()) == "large"
    assert turns.writer(turns.relay, Run()) == "small"
    assert turns.writer(turns.answer, Run()) == "small"  # the policy's answer model
    assert turns.writer(turns.answer, Run(small_available=False)) == "large"
    closed = Run(phase="answer", mode=PromptReasoning.CLOSED)
    assert turns.writer(turns.answer, closed) == "large"  # the no-reasoning model
    assert method(answer_model="large").writer(method().answer, Run()) == "large"


def test_stops_and_request_fields() -> None:
    turns = method()
    assert turns.stops(turns.reason, Run()) == (END, *CUES.stop_strings)
    assert turns.stops(turns.reason, Run(small_available=False)) == (END,)
    assert turns.stops(turns.reason, Run(phase="answer")) == ()
    assert turns.stops(turns.relay, Run()) == (END, *SENTENCE_STOPS)
    assert turns.stops(turns.answer, Run()) == ("###",)
    assert turns.extra_body(turns.reason, Run()) == {}
    answer = Run(answer_extra_body={"structured_outputs": {"json_object": True}})
    assert turns.extra_body(turns.answer, answer) == {
        "include_stop_str_in_output": False,
        "structured_outputs": {"json_object": True},
    }


# --- the turn a confirmed hand-off leads to --------------------------------------------------


def test_a_pending_cue_leads_to_the_relay_turn() -> None:
    turns = method()
    at_now = turns.upcoming(turns.reason, Run(transcript="x. Now"), turn_tokens=5)
    assert at_now is not None and at_now.turn is turns.relay
    assert (at_now.completion, at_now.confirmed_by) == ("", " \n")
    comma = turns.upcoming(turns.reason, Run(transcript="x. Therefore"), turn_tokens=5)
    assert comma is not None and (comma.completion, comma.confirmed_by) == (",", "")
    assert turns.upcoming(turns.reason, Run(transcript="x. Now"), turn_tokens=2) is None
    assert turns.upcoming(turns.reason, Run(transcript="x. No"), turn_tokens=5) is None
    gone = Run(transcript="x. Now", small_available=False)
    assert turns.upcoming(turns.reason, gone, turn_tokens=5) is None


def test_a_likely_sentence_end_leads_to_the_reason_turn() -> None:
    turns = method()
    sentence = "x. It is four."
    ended = turns.upcoming(turns.relay, Run(transcript=sentence), turn_tokens=3)
    assert ended is not None and ended.turn is turns.reason
    assert (ended.completion, ended.confirmed_by) == ("", " \n")
    assert turns.upcoming(turns.relay, Run(transcript="x. It is"), turn_tokens=3) is None
    decimal = Run(transcript="x. It is 4.")  # maybe 4.5
    assert turns.upcoming(turns.relay, decimal, turn_tokens=3) is None
    answer = Run(transcript=sentence, phase="answer")
    assert turns.upcoming(turns.relay, answer, turn_tokens=3) is None
    assert turns.upcoming(turns.answer, Run(transcript=sentence), turn_tokens=3) is None
    off = method(speculative_handoff=False)
    assert off.upcoming(off.relay, Run(transcript=sentence), turn_tokens=3) is None
