"""5. The client's own CPU cost against the scripted upstream (in its own process)."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel

from benchmarks.proc import cpu_seconds
from benchmarks.upstream import CUES
from relay_integrations.jobs.statistics import percentile
from relay_integrations.relay import (
    EndpointConfig,
    RelayConfig,
    RelayResult,
    RelaySwitcher,
    SwitchPolicy,
)

from .meters import CpuMeter, log
from .results import Medians
from .settings import TICK

# plain words, no cue: the scripted answer restates the sentence, so it grows with the question
WORDS = [
    *("apple", "river", "stone", "cloud", "maple", "garden", "silver", "window", "candle"),
    *("harbor", "meadow", "pencil", "ribbon", "forest", "lantern", "marble", "orchard"),
    *("pebble", "saddle", "thistle", "valley", "willow", "anchor", "basket", "copper"),
]


def question(words: int) -> str:
    body = " ".join(WORDS[i % len(WORDS)] for i in range(words))
    return f"Please describe the list {body}."


DEFAULT_LIMIT = EndpointConfig.model_fields["max_concurrency"].default  # 64
GC_THRESHOLD = 20_000  # a raised first threshold of the collector (Python's default: 700)


def fake_switcher(
    url: str, cues: list[str], concurrency: int = DEFAULT_LIMIT, stop_limit: int | None = None
) -> RelaySwitcher:
    """A relay over the scripted upstream; `stop_limit`: the endpoints' max_stop_strings
    (the stop strings past it are found in the stream)."""
    return RelaySwitcher(
        RelayConfig(
            large=EndpointConfig(
                base_url=url,
                model="large",
                max_concurrency=concurrency,
                max_stop_strings=stop_limit,
            ),
            small=EndpointConfig(
                base_url=url,
                model="small",
                max_concurrency=concurrency,
                max_stop_strings=stop_limit,
            ),
            cues=cues,
            policy=SwitchPolicy(cooldown_tokens=0),
        )
    )


class Fit(BaseModel):
    """cpu = a*tokens + b*switches + c*generations, fitted by least squares."""

    cpu_per_token_us: float
    cpu_per_switch_ms: float
    cpu_per_generation_ms: float
    r_squared: float
    max_relative_residual: float


class Cell(BaseModel):
    """One cell of the fit (a cue set and a question length), per generation."""

    switches_per_gen: float
    tokens_per_gen: float
    requests_per_gen: float
    cpu_ms_per_gen: float
    wall_ms_per_gen: float
    generations: int


@dataclass
class Tally:
    """What one cell's generations took and did, summed over the rounds."""

    cpu: float = 0.0
    wall: float = 0.0
    tokens: int = 0
    switches: int = 0
    gens: int = 0
    reqs: int = 0

    def add(self, cpu: float, wall: float, results: Sequence[RelayResult]) -> None:
        self.cpu += cpu
        self.wall += wall
        self.tokens += sum(x.completion_tokens for x in results)
        self.switches += sum(x.stats.switches for x in results)
        self.gens += len(results)
        self.reqs += sum(u.requests for x in results for u in x.usage.values())

    def cell(self) -> Cell:
        return Cell(
            switches_per_gen=self.switches / self.gens,
            tokens_per_gen=self.tokens / self.gens,
            requests_per_gen=self.reqs / self.gens,
            cpu_ms_per_gen=1e3 * self.cpu / self.gens,
            wall_ms_per_gen=1e3 * self.wall / self.gens,
            generations=self.gens,
        )


class RunFigures(Medians):
    """The figures of concurrent generations (of one run, or medians over runs)."""

    wall_s: float
    client_cpu_s: float
    upstream_cpu_s: float
    client_cpu_ms_per_generation: float
    gc_s: float
    gc_max_ms: float
    others_cores: float
    errors: float
    switches_ok: float
    tokens: float
    ticks: float
    lateness_max_ms: float
    lateness_p99_ms: float
    lateness_p50_ms: float
    idle_lateness_max_ms: float


class ConcurrentRun(RunFigures):
    """One run of concurrent generations (counts as counts, and its first error)."""

    errors: int
    switches_ok: int  # generations with 2 switches
    tokens: int
    ticks: int
    first_error: str


class ConcurrentLevel(BaseModel):
    """The runs of one number of concurrent generations and endpoint limit."""

    generations: int
    limit: int
    gc_threshold: int | None  # None: Python's own
    runs: list[ConcurrentRun]
    median: RunFigures


class ClientCosts(BaseModel):
    """Step 5: the fit (and with stops found in the stream), and concurrent generations."""

    fit: Fit
    cells: list[Cell]
    stop_limit: int | None = None
    fit_detection: Fit | None = None
    cells_detection: list[Cell] | None = None
    concurrent: list[ConcurrentLevel]


async def client_costs(
    url: str,
    fake_pid: int,
    rounds: int,
    per_cell: int,
    concurrent: int,
    concurrent_runs: int,
    stop_limit: int | None = None,
) -> ClientCosts:
    fit, cells = await cpu_fit(url, rounds, per_cell)
    detection: tuple[Fit, list[Cell]] | None = None
    if stop_limit is not None:
        log(f"client CPU fit with max_stop_strings={stop_limit} (stops found in the stream)")
        detection = await cpu_fit(url, rounds, per_cell, stop_limit)
    levels = (
        await concurrency_levels(url, fake_pid, concurrent, concurrent_runs)
        if concurrent_runs > 0
        else []
    )
    return ClientCosts(
        fit=fit,
        cells=cells,
        stop_limit=stop_limit,
        fit_detection=detection[0] if detection else None,
        cells_detection=detection[1] if detection else None,
        concurrent=levels,
    )


async def cpu_fit(
    url: str, rounds: int, per_cell: int, stop_limit: int | None = None
) -> tuple[Fit, list[Cell]]:
    """cpu = a*tokens + b*switches + c*generations over 9 cells, by least squares."""
    cue_sets = {2: CUES, 1: ["Now"], 0: ["Zebra"]}
    lengths = [4, 100, 300]
    switchers = {k: fake_switcher(url, cues, stop_limit=stop_limit) for k, cues in cue_sets.items()}
    cells: dict[tuple[int, int], Tally] = {}
    try:
        for relay in switchers.values():  # warm-up: imports, connections, pydantic
            for words in lengths:
                await relay.generate([{"role": "user", "content": question(words)}])
        for r in range(rounds):
            log(f"client CPU fit: round {r + 1}/{rounds}")
            for k, relay in switchers.items():
                for words in lengths:
                    chat = [{"role": "user", "content": question(words)}]
                    cpu0, wall0 = time.process_time(), time.perf_counter()
                    results = [await relay.generate(chat) for _ in range(per_cell)]
                    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
                    cells.setdefault((k, words), Tally()).add(cpu, wall, results)
    finally:
        await asyncio.gather(*(s.aclose() for s in switchers.values()))
    rows = list(cells.values())
    return least_squares(rows), [c.cell() for c in rows]


def least_squares(rows: Sequence[Tally]) -> Fit:
    design = np.array([[c.tokens, c.switches, c.gens] for c in rows], dtype=float)
    target = np.array([c.cpu for c in rows], dtype=float)
    coef, *_ = np.linalg.lstsq(design, target, rcond=None)
    fitted = design @ coef
    ss_res = float(np.sum((target - fitted) ** 2))
    ss_tot = float(np.sum((target - target.mean()) ** 2))
    return Fit(
        cpu_per_token_us=float(coef[0]) * 1e6,
        cpu_per_switch_ms=float(coef[1]) * 1e3,
        cpu_per_generation_ms=float(coef[2]) * 1e3,
        r_squared=1 - ss_res / ss_tot if ss_tot else float("nan"),
        max_relative_residual=float(np.max(np.abs(target - fitted) / target)),
    )


async def concurrency_levels(
    url: str, fake_pid: int, concurrent: int, concurrent_runs: int
) -> list[ConcurrentLevel]:
    # (generations, the endpoints' max_concurrency, gc threshold 0 or None for Python's 700)
    variants: list[tuple[int, int, int | None]] = [
        (n, n, None) for n in sorted({n for n in (100, 300) if n < concurrent} | {concurrent})
    ]
    variants += [(concurrent, DEFAULT_LIMIT, None), (concurrent, concurrent, GC_THRESHOLD)]
    by_level = []
    for n, limit, threshold in variants:
        runs = []
        for r in range(concurrent_runs):
            log(
                f"{n} concurrent generations, {limit} requests in flight per endpoint at most, "
                f"gc threshold {threshold or gc.get_threshold()[0]}: run {r + 1}/{concurrent_runs}"
            )
            runs.append(await concurrent_generations(url, fake_pid, n, limit, threshold))
        by_level.append(
            ConcurrentLevel(
                generations=n,
                limit=limit,
                gc_threshold=threshold,
                runs=runs,
                median=RunFigures.median_of(runs),
            )
        )
    return by_level


@contextmanager
def collector_timer(threshold: int | None) -> Iterator[list[float]]:
    """Seconds spent in Python's cyclic garbage collector, one entry a collection; the
    collector's first threshold set to `threshold` meanwhile (None: left as it is)."""
    spans: list[float] = []
    started = 0.0

    def callback(phase: str, info: dict[str, Any]) -> None:
        nonlocal started
        if phase == "start":
            started = time.perf_counter()
        else:
            spans.append(time.perf_counter() - started)

    old = gc.get_threshold()
    if threshold is not None:
        gc.set_threshold(threshold, *old[1:])
    gc.callbacks.append(callback)
    try:
        yield spans
    finally:
        gc.callbacks.remove(callback)
        gc.set_threshold(*old)


async def concurrent_generations(
    url: str, fake_pid: int, count: int, limit: int, gc_threshold: int | None
) -> ConcurrentRun:
    relay = fake_switcher(url, CUES, concurrency=limit)
    meter = CpuMeter()
    late: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        while not stop.is_set():
            before = time.perf_counter()
            await asyncio.sleep(TICK)
            late.append(time.perf_counter() - before - TICK)

    try:
        await relay.generate([{"role": "user", "content": question(4)}])  # warm
        chats = [[{"role": "user", "content": f"{question(4)} Item {i}."}] for i in range(count)]
        tick = asyncio.create_task(ticker())
        await asyncio.sleep(0.1)
        idle = list(late)
        late.clear()
        since = meter.start()
        fake0, cpu0, wall0 = cpu_seconds(fake_pid), time.process_time(), time.perf_counter()
        with collector_timer(gc_threshold) as collections:
            results = await asyncio.gather(
                *(relay.generate(c) for c in chats), return_exceptions=True
            )
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        fake = cpu_seconds(fake_pid) - fake0
        foreign = max(0.0, meter.foreign(since) - fake)
        stop.set()
        await tick
    finally:
        await relay.aclose()
    errors = [r for r in results if isinstance(r, BaseException)]
    ok = [r for r in results if not isinstance(r, BaseException)]
    return ConcurrentRun(
        wall_s=wall,
        client_cpu_s=cpu,
        upstream_cpu_s=fake,
        client_cpu_ms_per_generation=1e3 * cpu / count,
        gc_s=sum(collections),
        gc_max_ms=1e3 * max(collections, default=0.0),
        others_cores=foreign / wall,
        errors=len(errors),
        first_error=repr(errors[0]) if errors else "",
        switches_ok=sum(1 for r in ok if r.stats.switches == 2),
        tokens=sum(r.completion_tokens for r in ok),
        ticks=len(late),
        lateness_max_ms=1e3 * max(late, default=0.0),
        lateness_p99_ms=1e3 * percentile(late, 0.99),
        lateness_p50_ms=1e3 * percentile(late, 0.5),
        idle_lateness_max_ms=1e3 * max(idle, default=0.0),
    )
