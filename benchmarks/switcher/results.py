"""What a run measured, and the figures summarized from it, as typed values.

:class:`EngineResult` is what steps 1-4 return (the traces, the rates of every round, the
generations with their requests as sent); :class:`Summary` and its parts are the medians the
report prints and ``--json`` writes (pydantic: ``model_dump()``), with :class:`RunFacts` (the
machine, the servers, the command).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self

from pydantic import BaseModel

from benchmarks.machine import MachineFacts
from relay_integrations.jobs.statistics import median
from relay_integrations.upstream.config import ModelRole

from .rates import Extras, Rates
from .recording import Generation


class Spread(BaseModel, frozen=True):
    """The median of some values, and their range."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        """Of at least one value."""
        return cls(median=median(values), low=min(values), high=max(values))

    @classmethod
    def of_any(cls, values: Sequence[float]) -> Spread | None:
        """`of`, or None when there are no values."""
        return cls.of(values) if values else None

    def __str__(self) -> str:
        return f"{self.median:.3f} [{self.low:.3f}-{self.high:.3f}]"


class TraceInfo(BaseModel, frozen=True):
    """One trace the models are forced to write."""

    name: str
    chars: int
    tokens: int
    cues: int


@dataclass(frozen=True)
class Round:
    """The rates of both models measured before one round's generations."""

    mode: str
    run: int
    rates: dict[ModelRole, Rates]
    foreign_cores: float  # cores other processes used meanwhile
    foreign_requests: int  # requests the servers served for others meanwhile
    foreign_tokens: int


@dataclass
class EngineResult:
    """Steps 1-4 on the real engine: what the analysis and the report read."""

    modes: list[str]
    variants: list[str]  # the variants run next to the default relay and the authors' loop
    traces: list[TraceInfo]
    extras: dict[ModelRole, Extras]
    rounds: list[Round]
    generations: list[Generation]
    rendering: dict[str, str]  # what the server renders for the authors' requests, by case


class RunFacts(BaseModel):
    """The machine and the command, and what of the run the report's header names."""

    machine: MachineFacts
    servers: str
    runs: int
    prompt_tokens: int | None  # median of the relay's first prompts (None: no relay runs)


RATE_KEYS = ("overhead", "overhead_forced", "overhead_resume", "prefill", "decode")


class ModelRates(BaseModel):
    """One model's rates over the rounds of one forcing (see :class:`~.rates.Rates`)."""

    overhead: Spread
    overhead_forced: Spread
    overhead_resume: Spread
    prefill: Spread
    decode: Spread

    @classmethod
    def over(cls, rates: Sequence[Rates]) -> ModelRates:
        return cls.model_validate(
            {key: Spread.of([getattr(r, key) for r in rates]) for key in RATE_KEYS}
        )


class Medians(BaseModel):
    """Figures (all numbers) of which :meth:`median_of` takes each one's median."""

    @classmethod
    def median_of(cls, parts: Sequence[Self]) -> Self:
        """Each figure's median over `parts` (at least one)."""
        return cls.model_validate(
            {key: median([getattr(p, key) for p in parts]) for key in cls.model_fields}
        )


class Breakdown(Medians):
    """Where the wall time of a relay generation goes (seconds; see ``analysis.breakdown``)."""

    wall: float
    ideal: float
    excess: float
    requests: float
    rendering: float
    ttft_sum: float
    ttft_predicted: float
    decoding_sum: float
    decoding_predicted: float
    models_lookups: float
    in_requests: float
    between_requests: float
    request_fixed_costs: float
    grammar_per_request: float
    excess_prefill: float
    handoff_interference: float
    resume_overheads: float
    residual: float
    lookahead_tokens: float
    lookahead_seconds: float


class RelayFigures(BaseModel):
    """Medians over the relay's runs of one trace (ratio_range: the lowest and highest)."""

    wall: float
    ideal: float
    ratio: float
    ratio_range: tuple[float, float]
    requests: float
    switches: float
    prefilled: float
    min_text: float
    large_share: float
    completion: float
    text_ok: bool


class ReplayFigures(BaseModel):
    """The relay's requests replayed without the switcher (medians; see replay.py)."""

    back_to_back: float
    paused: float
    relay_over_replay: float
    interference: float  # back to back / paused
    paused_over_ideal: float
    same_tokens: bool


class ReplayShapes(BaseModel):
    """The requests back to back through plain httpx, in each raw shape."""

    seconds: dict[str, float]  # by shape (and the endpoint's back_to_back), medians
    ratios: dict[str, Spread]  # by the label of SHAPE_RATIOS


class AuthorsFigures(BaseModel):
    """Medians over the published loop's runs of one trace, and its ratios to the relay
    paired by run."""

    wall: float
    ideal: float
    ratio: float
    requests: float
    switches: float
    prefilled: float
    min_text: float
    models_lookups: float
    completion: float
    text_ok: bool
    divergence: str
    over_relay_wall: float
    over_relay_prefill: float
    over_relay_wall_range: tuple[float, float]


class AloneFigures(BaseModel):
    """The large model alone writing the trace (medians), and the speedups over it."""

    wall: float
    ideal: float
    ratio: float
    completion: float
    speedup_relay: float
    speedup_authors: float | None


class TraceSummary(BaseModel):
    """Everything measured on one trace under one forcing."""

    relay: RelayFigures
    canonical_share: float
    foreign_cores: float
    foreign_cores_max: float
    foreign_requests: int
    disturbed_runs: int
    runs: int
    fallbacks: int
    replay: ReplayFigures | None
    replay_shapes: ReplayShapes | None
    relay_breakdown: Breakdown
    authors: AuthorsFigures | None
    alone: AloneFigures | None


class ModeSummary(BaseModel):
    """The rates and every trace under one forcing, and figures over all its relay runs."""

    rates: dict[ModelRole, ModelRates]
    traces: dict[str, TraceSummary]
    ratio_median: float
    relay_over_replay_median: float | None
    ratio_quiet: float | None
    quiet_runs: int
    rates_foreign_cores: float
    speed_ratio: float
    max_excess_text: int
    excess_median: float
    authors_max_excess_text: int
    requests_over_block_text: int
    prompt_mismatches: int
    requests: int


class Summary(BaseModel):
    """The figures of a run, by forcing."""

    by_mode: dict[str, ModeSummary]
