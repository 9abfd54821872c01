"""The calibration pipeline: traces in, a cue-set artifact with its statistics out.

::

    async with Calibrator(small=EndpointConfig(base_url=..., model="qwen3-1.7b"),
                          large=EndpointConfig(base_url=..., model="qwen3-32b")) as calibrator:
        problems = ProblemSet.load("amc23.jsonl")
        traces = await calibrator.write_traces(problems, TraceFile("traces.jsonl"), samples=4)
        outcome = await calibrator.calibrate(traces, problems, sampling=calibrator.sampling)
    save_artifact(outcome.artifact, "cues.json")

With ready traces and no large server, pass ``large=None`` and name the model that wrote them
with ``large_identity=ModelIdentity(model="Qwen/Qwen3-32B")``.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .. import __version__
from ..jobs.concurrency import run_bounded
from ..jobs.datasets import ProblemSet
from ..jobs.progress import Progress
from ..relay.artifact import (
    CalibrationRecord,
    CalibrationSet,
    CueArtifact,
    ModelIdentity,
    ModelPair,
    SelectionRule,
    TraceSampling,
)
from ..relay.closing import AsyncClosing
from ..relay.config import ReasoningMarkers
from ..upstream.answers import Tokenized
from ..upstream.config import EndpointConfig, SamplingConfig
from ..upstream.endpoint import Endpoint
from ..upstream.errors import RelayError
from ..upstream.rendering import CachingRenderer, PromptRenderer, ServerChatTemplate
from .candidates import DEFAULT_CANDIDATES
from .scoring import TraceScorer
from .statistics import CalibrationStatistics, ScoredTrace, cue_statistics
from .traces import RequestFields, Trace, TraceFile, write_traces

TOKENIZER_PROBE = "Tokenizer probe: Therefore, 3.5% of naïve café-goers wrote <think> 42\n\n"
"""Text whose token ids fingerprint a tokenizer (``ModelIdentity.tokenizer``)."""


class NoCueSelected(RelayError):
    """No candidate passed the selection rule; ``record`` still holds every figure."""

    def __init__(self, record: CalibrationRecord) -> None:
        rule = record.selection
        super().__init__(
            f"no candidate cue passed the selection rule (k={rule.k:g}, at least "
            f"{rule.min_occurrences} occurrences) over {record.calibration_set.traces} traces; "
            "use more traces, a lower k or fewer minimum occurrences"
        )
        self.record = record


@dataclass(frozen=True)
class CalibrationOutcome:
    artifact: CueArtifact
    statistics: CalibrationStatistics
    skipped: list[str]
    """Ids of traces with no reasoning text (the model never opened its reasoning)."""


class Calibrator(AsyncClosing):
    """Writes traces on the large endpoint, scores them on the small one, selects the cues."""

    def __init__(
        self,
        *,
        small: EndpointConfig,
        large: EndpointConfig | None = None,
        renderer: PromptRenderer | None = None,
        candidates: Iterable[str] = DEFAULT_CANDIDATES,
        rule: SelectionRule | None = None,
        sampling: SamplingConfig | None = None,
        markers: ReasoningMarkers | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        concurrency: int = 8,
        show_progress: bool = True,
    ) -> None:
        self.small = Endpoint(small, "small")
        self.large = Endpoint(large, "large") if large is not None else None
        self.renderer = CachingRenderer(renderer or ServerChatTemplate())  # once per problem
        self.candidates = tuple(dict.fromkeys(candidates))
        self.rule = rule or SelectionRule()
        self.sampling = sampling or SamplingConfig()
        self.markers = markers or ReasoningMarkers()
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.concurrency = concurrency
        self.show_progress = show_progress
        self.seconds = 0.0
        """Wall time spent writing traces and calibrating, recorded in the artifact."""

    async def aclose(self) -> None:
        await asyncio.gather(*(e.aclose() for e in (self.small, self.large) if e is not None))

    async def write_traces(
        self,
        problems: ProblemSet,
        out: TraceFile,
        *,
        samples: int = 4,
        request_fields: RequestFields | None = None,
    ) -> list[Trace]:
        """``samples`` traces per problem from the large model, resumable through `out`."""
        if self.large is None:
            raise RelayError("writing traces needs the large endpoint; pass large=...")
        started = time.monotonic()
        try:
            with self._progress("traces", len(problems.rows) * samples) as progress:
                return await write_traces(
                    self.large,
                    self.renderer,
                    problems,
                    out,
                    samples=samples,
                    sampling=self.sampling,
                    markers=self.markers,
                    concurrency=self.concurrency,
                    chat_template_kwargs=self.chat_template_kwargs,
                    request_fields=request_fields,
                    progress=progress,
                )
        finally:
            self.seconds += time.monotonic() - started

    async def score(self, traces: list[Trace]) -> tuple[list[ScoredTrace], list[str]]:
        """Every trace with reasoning scored by the small model (in trace order), and the ids
        of those without reasoning."""
        scorer = TraceScorer(self.small, self.renderer, self.markers, self.chat_template_kwargs)
        usable = [t for t in traces if t.reasoning.strip()]
        skipped = [t.id for t in traces if not t.reasoning.strip()]
        with self._progress("scoring", len(usable)) as progress:

            async def score(trace: Trace) -> ScoredTrace:
                scored = await scorer.score(trace)
                progress.advance()
                return scored

            return await run_bounded(score, usable, self.concurrency), skipped

    async def calibrate(
        self,
        traces: list[Trace],
        problems: ProblemSet,
        *,
        sampling: SamplingConfig | None = None,
        samples: int = 1,
        large_identity: ModelIdentity | None = None,
    ) -> CalibrationOutcome:
        """Score `traces`, compute every candidate's statistics and build the artifact.

        ``sampling`` and ``samples`` describe how the traces were written (None: ready
        traces). The large model is identified by its endpoint unless `large_identity` is
        given.
        """
        started = time.monotonic()
        scored, skipped = await self.score(traces)
        if not scored:
            raise RelayError("none of the traces has reasoning text; there is nothing to score")
        statistics = cue_statistics(scored, self.candidates, self.rule)
        self.seconds += time.monotonic() - started
        record = CalibrationRecord(
            calibration_set=CalibrationSet(
                name=problems.name,
                size=len(problems.rows),
                sha256=problems.sha256,
                traces=len(scored),
                trace_source="generated" if sampling is not None else "file",
            ),
            sampling=_trace_sampling(sampling, samples),
            selection=self.rule,
            tokens_scored=statistics.tokens_scored,
            global_mean_margin=statistics.global_mean_margin,
            candidates=statistics.cues,
            seconds=round(self.seconds, 1),
        )
        if not statistics.selected:
            raise NoCueSelected(record)
        small = await _identity(self.small)
        large = large_identity or await _identity(self.large)
        artifact = CueArtifact(
            model_pair=ModelPair(large=large, small=small),
            cues=statistics.selected,
            source=(
                f"relaygen calibrate: {len(scored)} traces of {problems.name}, margins of the "
                "small model, mean post-cue margin >= global mean + k standard errors"
            ),
            created_at=datetime.now(UTC),
            package_version=__version__,
            calibration=record,
        )
        return CalibrationOutcome(artifact, statistics, skipped)

    def _progress(self, label: str, total: int) -> Progress:
        return Progress(label, total, stream=None if self.show_progress else io.StringIO())


async def _identity(endpoint: Endpoint | None) -> ModelIdentity:
    if endpoint is None:
        raise RelayError("name the model that wrote the traces (large_identity=...)")
    info = await endpoint.model_info()
    body = {"model": endpoint.config.model, "prompt": TOKENIZER_PROBE, "add_special_tokens": False}
    ids = (await endpoint.post_json("/tokenize", body, Tokenized)).tokens
    fingerprint = hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16]
    return ModelIdentity(
        model=info.root or info.id, served_name=info.id, tokenizer=f"probe-sha256:{fingerprint}"
    )


def _trace_sampling(sampling: SamplingConfig | None, samples: int) -> TraceSampling | None:
    if sampling is None:
        return None
    return TraceSampling(
        samples_per_problem=samples,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        max_tokens=sampling.max_tokens,
        seed=sampling.seed,
    )
