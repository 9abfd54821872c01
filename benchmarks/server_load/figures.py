"""The typed results of a run: one `Sample` a generation, and the figures made of them (what
the report prints and ``--json`` writes, as `Record`)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from pydantic import BaseModel

from relay_integrations.jobs.statistics import percentile

from ..machine import MachineFacts
from .settings import Settings

T = TypeVar("T")


@dataclass
class Sample:
    """One generation as its client saw it, and as the relay timed it."""

    total: float
    ttft: float | None = None  # to the first content or reasoning text
    relay_seconds: float | None = None
    relay_ttft: float | None = None
    switches: int | None = None
    tokens: int | None = None
    error: str | None = None

    @property
    def added(self) -> float | None:
        return None if self.relay_seconds is None else self.total - self.relay_seconds

    @property
    def ttft_added(self) -> float | None:
        if self.ttft is None or self.relay_ttft is None:
            return None
        return self.ttft - self.relay_ttft


def errors(samples: Iterable[Sample]) -> list[str]:
    """The errors of the samples that failed."""
    return [s.error for s in samples if s.error]


class PerPath(BaseModel, Generic[T]):
    """One figure of each path: through the server (HTTP) and with the in-process core."""

    server: T
    core: T


class Summary(BaseModel):
    """The distribution of one figure (nan where nothing was measured)."""

    n: int
    p50: float
    p99: float
    max: float
    mean: float

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Summary:
        present = [v for v in values if v is not None]
        return cls(
            n=len(present),
            p50=percentile(present, 0.5),
            p99=percentile(present, 0.99),
            max=max(present) if present else math.nan,
            mean=sum(present) / len(present) if present else math.nan,
        )


class PathFigures(BaseModel):
    """The figures of the successful generations of one path (seconds)."""

    total: Summary
    ttft: Summary
    relay_seconds: Summary
    relay_ttft: Summary
    added: Summary
    ttft_added: Summary
    switches: dict[int | None, int]
    """How many generations switched how many times."""
    mean_tokens: float
    errors: int
    """Generations that failed (left out of the figures)."""

    @classmethod
    def of(cls, samples: Sequence[Sample]) -> PathFigures:
        ok = [s for s in samples if s.error is None]
        return cls(
            total=Summary.of(s.total for s in ok),
            ttft=Summary.of(s.ttft for s in ok),
            relay_seconds=Summary.of(s.relay_seconds for s in ok),
            relay_ttft=Summary.of(s.relay_ttft for s in ok),
            added=Summary.of(s.added for s in ok),
            ttft_added=Summary.of(s.ttft_added for s in ok),
            switches=dict(Counter(s.switches for s in ok)),
            mean_tokens=Summary.of(s.tokens for s in ok).mean,
            errors=len(samples) - len(ok),
        )


class SingleFigures(BaseModel):
    """Single requests, one after the other, nothing else running."""

    server: PathFigures
    core: PathFigures
    errors: list[str]

    @classmethod
    def of(cls, samples: PerPath[list[Sample]]) -> SingleFigures:
        return cls(
            server=PathFigures.of(samples.server),
            core=PathFigures.of(samples.core),
            errors=errors(samples.server + samples.core),
        )


class LoadFigures(BaseModel):
    """The load rounds: `concurrency` generations at once, `rounds` times each path."""

    server: PathFigures
    core: PathFigures
    wall_seconds: PerPath[list[float]]
    """Of each round."""
    generations_per_second: PerPath[float]

    @classmethod
    def of(cls, samples: PerPath[list[Sample]], walls: PerPath[list[float]]) -> LoadFigures:
        return cls(
            server=PathFigures.of(samples.server),
            core=PathFigures.of(samples.core),
            wall_seconds=walls,
            generations_per_second=PerPath(
                server=len(samples.server) / sum(walls.server),
                core=len(samples.core) / sum(walls.core),
            ),
        )


class MemoryFigures(BaseModel):
    """The relay server process's memory, MB (MiB)."""

    idle: float
    """VmRSS after startup."""
    after_single_requests: float
    peak_rss_sampled: float
    """The highest VmRSS sampled during the server rounds."""
    rss_samples: int
    hwm_at_end: float
    """VmHWM after the load."""
    after_each_server_round: list[float]
    after_load_1s: float
    peak_above_idle_per_stream: float


class CpuSeconds(BaseModel):
    """CPU seconds of the relay, the upstream, this client and the whole machine."""

    relay: float = 0.0
    upstream: float = 0.0
    client: float = 0.0
    machine: float = 0.0

    def plus(self, before: CpuSeconds, after: CpuSeconds) -> CpuSeconds:
        """These seconds and those used from `before` to `after`."""
        used = {k: getattr(after, k) - getattr(before, k) for k in CpuSeconds.model_fields}
        return CpuSeconds.model_validate({k: getattr(self, k) + v for k, v in used.items()})

    def per(self, seconds: float) -> CpuSeconds:
        """Each divided by `seconds`: of a wall time, the share of one core used."""
        return CpuSeconds.model_validate({k: v / seconds for k, v in self.model_dump().items()})


class CpuFigures(BaseModel):
    """CPU time during the server rounds."""

    wall_seconds: float
    seconds: CpuSeconds
    utilisation: CpuSeconds
    relay_ms_per_generation: float
    other_processes_cores: float
    """Cores the machine's other processes used meanwhile."""

    @classmethod
    def of(cls, seconds: CpuSeconds, wall: float, generations: int) -> CpuFigures:
        others = _others(seconds)
        return cls(
            wall_seconds=wall,
            seconds=seconds,
            utilisation=seconds.per(wall),
            relay_ms_per_generation=1000 * seconds.relay / max(generations, 1),
            other_processes_cores=others / wall,
        )


class Figures(BaseModel):
    """All that one run measured."""

    single: SingleFigures
    load: LoadFigures
    memory_mb: MemoryFigures
    cpu_during_server_rounds: CpuFigures
    metrics_probe_seconds: Summary
    relay_inflight_after_load: float
    """``relay_inflight_generations`` of ``/metrics`` after the load (nan: not found)."""
    errors: list[str]
    """Of the load rounds."""
    samples: PerPath[list[Sample]]
    """Of the load rounds."""

    @property
    def failed(self) -> bool:
        """Whether a response was wrong or a generation slot leaked."""
        return bool(self.errors or self.single.errors or self.relay_inflight_after_load != 0)


class Record(BaseModel):
    """What ``--json`` writes: the machine, the relay's command, the settings, the figures."""

    facts: MachineFacts
    relay_command: list[str]
    relay_env: dict[str, str]
    settings: Settings
    figures: Figures
    relay_log_lines: int


class WorkerCountFigures(BaseModel):
    """One relay of a ``--workers`` run: ``relaygen serve --workers N`` under the load rounds."""

    workers: int
    generations: int
    wall_seconds: float
    """Of its rounds."""
    generations_per_second: float
    cpu: CpuSeconds
    """During its rounds: ``relay`` is its whole process tree (the supervisor and the workers)."""
    cpu_ms_per_generation: float
    """Of its process tree."""
    busiest_process_share: float
    """The share of the tree's CPU its busiest process used (1/N: spread evenly)."""
    utilisation: CpuSeconds
    """Cores each used during its rounds."""
    other_processes_cores: float
    """Cores the machine's other processes used meanwhile."""
    total: Summary
    """A stream's total time, as its client saw it."""
    errors: list[str]

    @classmethod
    def of(
        cls,
        workers: int,
        samples: Sequence[Sample],
        wall: float,
        cpu: CpuSeconds,
        per_process: Iterable[float],
    ) -> WorkerCountFigures:
        """`per_process`: the CPU seconds of each process of the relay's tree."""
        ok = [s for s in samples if s.error is None]
        others = _others(cpu)
        return cls(
            workers=workers,
            generations=len(ok),
            wall_seconds=wall,
            generations_per_second=len(ok) / wall,
            cpu=cpu,
            cpu_ms_per_generation=1000 * cpu.relay / max(len(ok), 1),
            busiest_process_share=max(per_process, default=0.0) / max(cpu.relay, 1e-9),
            utilisation=cpu.per(wall),
            other_processes_cores=others / wall,
            total=Summary.of(s.total for s in ok),
            errors=errors(samples),
        )


class WorkersRecord(BaseModel):
    """What ``--json`` writes for a ``--workers`` run."""

    facts: MachineFacts
    relay_commands: list[list[str]]
    relay_env: dict[str, str]
    settings: Settings
    figures: list[WorkerCountFigures]


def _others(cpu: CpuSeconds) -> float:
    """The machine's CPU seconds not used by the relay, the upstream or the client. /proc
    counts in ticks of 10 ms, so over a second or two the difference of the sums can fall a
    tick or two below zero: that is none."""
    return max(0.0, cpu.machine - cpu.relay - cpu.upstream - cpu.client)
