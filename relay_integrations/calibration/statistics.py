"""Post-cue margins, per-cue statistics and the selection rule: pure functions, no I/O.

A :class:`ScoredTrace` is a reasoning text with, for each of its tokens, where the token
starts and the small model's margin p(top1) - p(top2) when predicting it. For every candidate:

1. its occurrences are found by the switcher's own whole-word matcher (:class:`CueSet`);
2. an occurrence's post-cue span runs from the hand-off point to where the switcher's small
   segment would end: the first sentence end (:func:`find_sentence_end`, the runtime's rule),
   the end of the reasoning, or ``max_span_tokens`` tokens, whichever comes first;
3. the occurrence's post-cue margin is the mean margin over the span's tokens;
4. a cue's mean and standard error are taken over its occurrences, because the tokens of one
   span are not independent draws; the global mean is over all reasoning tokens;
5. the cue is selected by :class:`SelectionRule`::

    stats = cue_statistics(scored_traces, DEFAULT_CANDIDATES, SelectionRule(k=1.0))
    stats.selected  # ['Therefore,', 'Now', ...], best mean margin first
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import fmean, stdev

from ..relay.artifact import CueStatistics, SelectionRule
from ..relay.cues import CueSet
from ..relay.sentences import find_sentence_end

_OPENER = "\n"
"""The reasoning follows a line break (``<think>\\n``), so a cue may start it."""


@dataclass(frozen=True)
class ScoredTrace:
    """One reasoning trace as the small model scored it.

    ``token_starts[i]`` is where token ``i`` starts in ``reasoning`` (non-decreasing: a token
    holding the first bytes of a character has no text of its own; the first start may be
    negative when a token straddles the opening), ``margins[i]`` the margin of the small
    model's prediction of that token.
    """

    trace_id: str
    reasoning: str
    token_starts: tuple[int, ...]
    margins: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.token_starts) != len(self.margins):
            raise ValueError(
                f"trace {self.trace_id}: {len(self.token_starts)} token starts "
                f"but {len(self.margins)} margins"
            )
        if any(b < a for a, b in zip(self.token_starts, self.token_starts[1:], strict=False)):
            raise ValueError(f"trace {self.trace_id}: token starts go backwards")


@dataclass(frozen=True)
class Occurrence:
    """One cue occurrence and its post-cue span ``reasoning[handoff:end]``."""

    trace_id: str
    cue: str
    handoff: int
    end: int
    margins: tuple[float, ...]

    @property
    def margin(self) -> float | None:
        """The post-cue margin; None when no token follows the cue (the trace ends there)."""
        return fmean(self.margins) if self.margins else None


@dataclass(frozen=True)
class CalibrationStatistics:
    global_mean_margin: float
    tokens_scored: int
    cues: list[CueStatistics]

    @property
    def selected(self) -> list[str]:
        """The selected cues, highest mean post-cue margin first."""
        chosen = [c for c in self.cues if c.selected and c.mean_margin is not None]
        return [c.cue for c in sorted(chosen, key=lambda c: -(c.mean_margin or 0.0))]


def occurrences(trace: ScoredTrace, cue: CueSet, max_span_tokens: int) -> list[Occurrence]:
    """Every whole-word occurrence of a one-cue set in `trace`, with its post-cue span."""
    text = _OPENER + trace.reasoning
    shift = len(_OPENER)
    found = []
    for match in cue.finditer(text):
        handoff = match.handoff - shift
        end = find_sentence_end(text, match.handoff)
        end = len(trace.reasoning) if end is None else end - shift
        first = bisect.bisect_left(trace.token_starts, handoff)
        last = min(bisect.bisect_left(trace.token_starts, end), first + max_span_tokens)
        found.append(Occurrence(trace.trace_id, match.cue, handoff, end, trace.margins[first:last]))
    return found


def cue_statistics(
    traces: Sequence[ScoredTrace], candidates: Iterable[str], rule: SelectionRule
) -> CalibrationStatistics:
    """Per-candidate statistics against the global mean margin, and which ones `rule` keeps."""
    all_margins = [m for trace in traces for m in trace.margins]
    if not all_margins:
        raise ValueError("no reasoning token was scored; there is nothing to calibrate on")
    global_mean = fmean(all_margins)
    stats = []
    for cue in dict.fromkeys(candidates):
        one_cue = CueSet.from_list([cue])
        found = [o for trace in traces for o in occurrences(trace, one_cue, rule.max_span_tokens)]
        stats.append(_cue_statistics(cue, found, global_mean, rule))
    return CalibrationStatistics(global_mean, len(all_margins), stats)


def _cue_statistics(
    cue: str, found: list[Occurrence], global_mean: float, rule: SelectionRule
) -> CueStatistics:
    scores = [o.margin for o in found if o.margin is not None]
    mean = fmean(scores) if scores else None
    error = stdev(scores) / math.sqrt(len(scores)) if len(scores) >= 2 else None
    threshold = global_mean + rule.k * error if error is not None else None
    selected = (
        len(scores) >= rule.min_occurrences
        and mean is not None
        and threshold is not None
        and mean > global_mean
        and mean >= threshold
    )
    return CueStatistics(
        cue=cue,
        occurrences=len(scores),
        unscored=len(found) - len(scores),
        tokens=sum(len(o.margins) for o in found),
        mean_margin=mean,
        standard_error=error,
        threshold=threshold,
        selected=selected,
    )
