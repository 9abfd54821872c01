"""Summary figures per mode, from graded records.

pass@1 is the mean over problems of each problem's share of correct samples; its standard
error is over problems (the unit that was sampled): ``stdev(per-problem means) / sqrt(P)``.
Latency is the caller's wall time per generation; the speedup of a mode is the mean latency of
``large`` divided by its own. Modes write different lengths, so each also has its time per
written token (all its seconds over all its tokens), and the relay's has a prediction beside it:
``s * large + (1 - s) * small``, the two models' own times per token weighted by the relay's
large-model share ``s`` (the ``s + (1 - s)/r`` of ``docs/benchmarks.md``, in milliseconds). The
large-model share is token-weighted over all generations::

    summaries = summarize(records)
    summaries["relay"].pass_at_1, summaries["relay"].speedup
    summaries["relay"].ms_per_token, summaries["relay"].predicted_ms_per_token
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable

from pydantic import BaseModel

from ..jobs.statistics import percentile
from .generate import MODES, BenchRecord, Mode


class ModeSummary(BaseModel):
    mode: Mode
    problems: int
    generations: int
    errors: int
    pass_at_1: float
    pass_at_1_se: float
    mean_seconds: float
    p90_seconds: float
    speedup: float | None
    ms_per_token: float | None
    predicted_ms_per_token: float | None = None
    large_share: float
    switches_per_generation: float
    tokens_per_generation: dict[str, float]


def summarize(records: Iterable[BenchRecord]) -> dict[Mode, ModeSummary]:
    """One summary per mode that was run; failed generations are counted, not graded (a mode
    whose every generation failed has a summary with no generations and its errors)."""
    by_mode: dict[Mode, list[BenchRecord]] = defaultdict(list)
    errors: dict[Mode, int] = defaultdict(int)
    for record in latest(records):
        if record.error is None:
            by_mode[record.mode].append(record)
        else:
            errors[record.mode] += 1
    summaries = {
        mode: _summary(mode, by_mode[mode], errors[mode])
        for mode in MODES
        if by_mode[mode] or errors[mode]
    }
    if "large" in summaries and summaries["large"].generations:
        baseline = summaries["large"].mean_seconds
        for summary in summaries.values():
            summary.speedup = baseline / summary.mean_seconds if summary.mean_seconds else None
    if "relay" in summaries:
        summaries["relay"].predicted_ms_per_token = _predicted_ms_per_token(summaries)
    return summaries


def _predicted_ms_per_token(summaries: dict[Mode, ModeSummary]) -> float | None:
    """The relay's time per token if each model wrote its share at its own speed alone."""
    large, small = summaries.get("large"), summaries.get("small")
    if large is None or small is None or large.ms_per_token is None or small.ms_per_token is None:
        return None
    share = summaries["relay"].large_share
    return share * large.ms_per_token + (1 - share) * small.ms_per_token


def latest(records: Iterable[BenchRecord]) -> list[BenchRecord]:
    """The last record of each (mode, problem, sample): a rerun replaces a failed one."""
    return list({record.key: record for record in records}.values())


def _summary(mode: Mode, records: list[BenchRecord], errors: int) -> ModeSummary:
    if not records:
        return ModeSummary(
            mode=mode,
            problems=0,
            generations=0,
            errors=errors,
            pass_at_1=0.0,
            pass_at_1_se=0.0,
            mean_seconds=0.0,
            p90_seconds=0.0,
            speedup=None,
            ms_per_token=None,
            large_share=0.0,
            switches_per_generation=0.0,
            tokens_per_generation={},
        )
    per_problem: dict[str, list[bool]] = defaultdict(list)
    for record in records:
        per_problem[record.problem_id].append(record.correct)
    means = [sum(c) / len(c) for c in per_problem.values()]
    se = statistics.stdev(means) / math.sqrt(len(means)) if len(means) > 1 else 0.0
    seconds = [r.seconds for r in records]
    tokens: dict[str, float] = defaultdict(float)
    for record in records:
        for role, count in record.completion_tokens.items():
            tokens[role] += count / len(records)
    written = sum(sum(r.completion_tokens.values()) for r in records)
    large = sum(r.completion_tokens.get("large", 0) for r in records)
    return ModeSummary(
        mode=mode,
        problems=len(per_problem),
        generations=len(records),
        errors=errors,
        pass_at_1=sum(means) / len(means),
        pass_at_1_se=se,
        mean_seconds=sum(seconds) / len(seconds),
        p90_seconds=percentile(seconds, 0.9),
        speedup=None,
        ms_per_token=1000 * sum(seconds) / written if written else None,
        large_share=large / written if written else 0.0,
        switches_per_generation=sum(r.switches for r in records) / len(records),
        tokens_per_generation=dict(tokens),
    )
