"""The calibration statistics and the selection rule, on hand-computed examples."""

from __future__ import annotations

import math

import pytest

from relay_integrations.calibration.candidates import DEFAULT_CANDIDATES
from relay_integrations.calibration.statistics import (
    ScoredTrace,
    cue_statistics,
    occurrences,
)
from relay_integrations.relay import CueSet
from relay_integrations.relay.artifact import SelectionRule


def scored(trace_id: str, tokens: list[tuple[str, float]]) -> ScoredTrace:
    """A trace from (token text, margin) pairs; token starts follow from the texts."""
    starts, pos = [], 0
    for text, _ in tokens:
        starts.append(pos)
        pos += len(text)
    return ScoredTrace(
        trace_id,
        "".join(t for t, _ in tokens),
        tuple(starts),
        tuple(m for _, m in tokens),
    )


def spans(trace: ScoredTrace, cue: str, cap: int = 128):
    return [(o.handoff, o.end, o.margins) for o in occurrences(trace, CueSet.from_list([cue]), cap)]


TRACE = scored(
    "t",
    [
        ("First", 0.1),
        (" step", 0.2),
        (".", 0.3),
        (" Therefore", 0.4),
        (",", 0.5),
        (" x", 0.6),
        (" is", 0.7),
        (" 3", 0.8),
        (".", 0.9),
        ("5", 0.1),
        (" here", 0.2),
        (".", 0.3),
        (" Done", 0.4),
        (".", 0.5),
    ],
)


def test_the_span_runs_from_the_handoff_to_the_runtime_sentence_end() -> None:
    # A cue hands off after its right boundary, unless that is a space: "Therefore" followed
    # by a comma hands off after the comma, like its stop string at run time. "3.5" is not a
    # sentence end, "here." is.
    text = TRACE.reasoning
    expected = [(text.index(",") + 1, text.index("here.") + 5, (0.6, 0.7, 0.8, 0.9, 0.1, 0.2, 0.3))]
    assert spans(TRACE, "Therefore") == expected
    assert spans(TRACE, "Therefore,") == expected


def test_the_span_is_capped_like_the_small_segment() -> None:
    assert spans(TRACE, "Therefore,", cap=2)[0][2] == (0.6, 0.7)


def test_a_cue_at_the_very_end_of_a_trace_is_counted_but_not_scored() -> None:
    trace = scored(
        "end", [("It", 0.2), (" holds", 0.4), (".", 0.6), (" Therefore", 0.8), (",", 1.0)]
    )
    assert spans(trace, "Therefore,") == [(len(trace.reasoning), len(trace.reasoning), ())]
    stats = cue_statistics([trace], ["Therefore,"], SelectionRule()).cues[0]
    assert (stats.occurrences, stats.unscored, stats.tokens, stats.mean_margin) == (0, 1, 0, None)


def test_a_span_without_a_sentence_end_runs_to_the_end_of_the_reasoning() -> None:
    trace = scored("open", [("Now", 0.5), (" add", 0.1), (" one", 0.3)])
    # "Now" opens the reasoning: it follows the opener's line break, as at run time.
    assert spans(trace, "Now") == [(3, len(trace.reasoning), (0.1, 0.3))]


def test_overlapping_spans_each_count_their_own_tokens() -> None:
    trace = scored(
        "overlap",
        [
            ("We", 0.0),
            (" add", 0.0),
            (" then", 0.9),
            (" then", 0.3),
            (" we", 0.6),
            (" stop", 0.9),
            (".", 0.0),
        ],
    )
    first, second = spans(trace, "then")
    assert first[2] == (0.3, 0.6, 0.9, 0.0)
    assert second[2] == (0.6, 0.9, 0.0)
    stats = cue_statistics([trace], ["then"], SelectionRule(min_occurrences=2)).cues[0]
    assert stats.occurrences == 2 and stats.tokens == 7
    assert stats.mean_margin == pytest.approx((0.45 + 0.5) / 2)


def test_cues_match_whole_words_only() -> None:
    trace = scored(
        "words", [("I", 0.1), (" know", 0.2), (" Nowhere", 0.3), (" now", 0.4), (" it", 0.5)]
    )
    assert spans(trace, "now") == [(len("I know Nowhere now"), len(trace.reasoning), (0.5,))]
    assert spans(trace, "Now") == []


def test_statistics_and_selection_on_hand_computed_figures() -> None:
    # Three traces; cue "Thus," occurs three times with post-cue margins 0.9, 0.8, 0.7.
    traces = [
        scored(
            "a",
            [
                ("Thus", 0.1),
                (",", 0.1),
                (" yes", 0.9),
                (".", 0.9),
                (" But", 0.1),
                (" no", 0.2),
                (".", 0.0),
            ],
        ),
        scored("b", [("Thus", 0.1), (",", 0.1), (" ok", 0.8), (".", 0.8)]),
        scored(
            "c", [("Thus", 0.1), (",", 0.1), (" so", 0.7), (".", 0.7), (" Wait", 0.1), (",", 0.1)]
        ),
        scored("none", [("No", 0.2), (" cue", 0.2), (" here", 0.2), (".", 0.2)]),
    ]
    stats = cue_statistics(
        traces, ["Thus,", "But", "Wait,", "Hmm"], SelectionRule(k=1.0, min_occurrences=2)
    )
    all_margins = [m for t in traces for m in t.margins]
    assert stats.tokens_scored == 21
    assert stats.global_mean_margin == pytest.approx(sum(all_margins) / 21)
    assert stats.global_mean_margin == pytest.approx(6.7 / 21)
    thus, but, wait, hmm = stats.cues
    # mean 0.8; stdev of (0.9, 0.8, 0.7) is 0.1, so SE = 0.1 / sqrt(3)
    assert thus.occurrences == 3 and thus.tokens == 6
    assert thus.mean_margin == pytest.approx(0.8)
    assert thus.standard_error == pytest.approx(0.1 / math.sqrt(3))
    assert thus.threshold == pytest.approx(6.7 / 21 + 0.1 / math.sqrt(3))
    assert thus.selected
    # one occurrence only: no standard error, never selected
    assert (but.occurrences, but.standard_error, but.selected) == (1, None, False)
    assert but.mean_margin == pytest.approx(0.1)
    # "Wait," ends trace c: counted, not scored
    assert (wait.occurrences, wait.unscored, wait.selected) == (0, 1, False)
    assert (hmm.occurrences, hmm.unscored, hmm.mean_margin) == (0, 0, None)
    assert stats.selected == ["Thus,"]


def test_the_rule_needs_k_standard_errors_above_the_global_mean() -> None:
    # post-cue margins 0.6 and 0.8: mean 0.7, stdev 0.1414, SE 0.1; global mean 4.5 / 10
    traces = [
        scored("a", [("Now", 0.2), (" a", 0.6), (".", 0.6), (" x", 0.3), (" y", 0.3)]),
        scored("b", [("Now", 0.2), (" b", 0.8), (".", 0.8), (" z", 0.6), (" w", 0.1)]),
    ]
    base = cue_statistics(traces, ["Now"], SelectionRule(k=1.0, min_occurrences=2))
    assert base.global_mean_margin == pytest.approx(0.45)
    cue = base.cues[0]
    assert cue.mean_margin == pytest.approx(0.7)
    assert cue.standard_error == pytest.approx(0.1)
    assert cue.selected  # 0.7 >= 0.45 + 1 * 0.1
    assert cue_statistics(traces, ["Now"], SelectionRule(k=2.4, min_occurrences=2)).cues[0].selected
    assert (
        not cue_statistics(traces, ["Now"], SelectionRule(k=2.6, min_occurrences=2))
        .cues[0]
        .selected
    )
    assert (
        not cue_statistics(traces, ["Now"], SelectionRule(k=1.0, min_occurrences=3))
        .cues[0]
        .selected
    )


def test_a_cue_equal_to_the_global_mean_is_not_selected_even_with_zero_error() -> None:
    traces = [scored(i, [("Now", 0.5), (" a", 0.5), (".", 0.5)]) for i in "ab"]
    cue = cue_statistics(traces, ["Now"], SelectionRule(k=0.0, min_occurrences=2)).cues[0]
    assert cue.standard_error == 0.0 and not cue.selected


def test_no_scored_token_is_an_error_that_says_so() -> None:
    with pytest.raises(ValueError, match="no reasoning token"):
        cue_statistics([scored("empty", [])], DEFAULT_CANDIDATES, SelectionRule())


def test_a_scored_trace_rejects_misaligned_tokens() -> None:
    with pytest.raises(ValueError, match="2 token starts but 1 margins"):
        ScoredTrace("bad", "ab", (0, 1), (0.5,))
    with pytest.raises(ValueError, match="go backwards"):
        ScoredTrace("bad", "ab", (1, 0), (0.5, 0.5))
