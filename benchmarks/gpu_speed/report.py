"""The figures of one concurrency level, the table, the JSON and the plot."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel

from relay_integrations.jobs.plotting import pyplot
from relay_integrations.jobs.statistics import percentile
from relay_integrations.testing.gpu_speed import LatencyModel
from relay_integrations.upstream.config import ModelRole

from .ideal import ideal_walls
from .runs import Run

KEEPING_UP = 1.05
"""relay / ideal above this: the relay process no longer keeps up with the upstreams."""


class Level(BaseModel):
    """Everything measured at one concurrency, per generation unless named otherwise."""

    concurrency: int
    generations: int
    ideal_s: float  # the relay's turns on the engines alone
    relay_s: float
    large_ideal_s: float
    large_alone_s: float
    serve_s: float | None
    large_share: float
    switches: float
    speedup: float  # large alone / relay, measured
    ideal_speedup: float  # the same from the ideal times
    relay_over_ideal: float
    serve_over_ideal: float | None
    large_alone_over_ideal: float
    relay_cpu_s: float
    relay_cpu_ms_per_1k_tokens: float
    relay_core_share: float
    relay_lag_p50_ms: float
    relay_lag_p99_ms: float
    serve_cpu_s: float | None
    serve_core_share: float | None
    serve_lag_p99_ms: float | None  # a bucket bound of the server's histogram
    relay_tokens_per_s: float
    upstream_lag_p99_ms: float  # the worst engine of the relay run: did the upstreams keep up?
    requests: dict[str, float] = {}  # a relay generation's requests by route, both upstreams
    start_requests: float = 0.0  # a relay generation's requests up to its first completion's


def level(
    latencies: Mapping[ModelRole, LatencyModel], relay: Run, large: Run, serve: Run | None
) -> Level:
    load = relay.load
    sent, start = requests_of(relay)
    ideal = ideal_walls(latencies, relay.turns, load.concurrency)
    large_ideal = ideal_walls(latencies, large.turns, load.concurrency)
    written = [sum(t.tokens for t in turns) for turns in relay.turns]
    by_large = [sum(t.tokens for t in turns if t.role == "large") for turns in relay.turns]
    mean = statistics.fmean
    return Level(
        concurrency=load.concurrency,
        generations=load.generations,
        ideal_s=mean(ideal),
        relay_s=mean(relay.walls),
        large_ideal_s=mean(large_ideal),
        large_alone_s=mean(large.walls),
        serve_s=mean(serve.walls) if serve else None,
        large_share=sum(by_large) / sum(written),
        switches=mean(relay.switches),
        speedup=mean(large.walls) / mean(relay.walls),
        ideal_speedup=mean(large_ideal) / mean(ideal),
        relay_over_ideal=mean(relay.walls) / mean(ideal),
        serve_over_ideal=mean(serve.walls) / mean(ideal) if serve else None,
        large_alone_over_ideal=mean(large.walls) / mean(large_ideal),
        relay_cpu_s=relay.cpu_seconds / load.generations,
        relay_cpu_ms_per_1k_tokens=relay.cpu_seconds / relay.tokens * 1e6,
        relay_core_share=relay.cpu_seconds / relay.seconds,
        relay_lag_p50_ms=percentile(relay.loop_lag_ms, 0.5),
        relay_lag_p99_ms=percentile(relay.loop_lag_ms, 0.99),
        serve_cpu_s=serve.cpu_seconds / load.generations if serve else None,
        serve_core_share=serve.cpu_seconds / serve.seconds if serve else None,
        serve_lag_p99_ms=percentile(serve.loop_lag_ms, 0.99)
        if serve and serve.loop_lag_ms
        else None,
        relay_tokens_per_s=relay.tokens / relay.seconds,
        upstream_lag_p99_ms=max(e["lag_ms"]["p99"] for e in relay.upstreams.values()),
        requests=sent,
        start_requests=start,
    )


def requests_of(relay: Run) -> tuple[dict[str, float], float]:
    """A relay generation's requests by route (both upstreams, the untimed first generation
    counted too), and those it sends up to its first completion: each chat rendered (and, on
    the text path, detokenized), then the large model's first completion."""
    generations = relay.load.generations + 1
    routes: dict[str, float] = {}
    renders = 0
    for engine in relay.upstreams.values():
        renders += engine.get("renders", 0)
        for route, count in engine.get("requests", {}).items():
            routes[route] = routes.get(route, 0) + count / generations
    start = renders / generations + routes.get("/detokenize", 0.0) + 1
    return dict(sorted(routes.items())), start


def requests_lines(levels: Sequence[Level]) -> list[str]:
    """A line per level: the requests a generation sends, and how many before its first
    token (the start burst when every generation starts at once)."""
    return [
        f"{x.concurrency} at once: a generation sends "
        + ", ".join(f"{route} {count:.2f}" for route, count in x.requests.items())
        + f"; {x.start_requests:.2f} up to its first completion"
        for x in levels
    ]


def _cell(value: float | None, form: str) -> str:
    return "-" if value is None else format(value, form)


def table(levels: Sequence[Level]) -> str:
    """The Markdown table of the levels."""
    head = (
        "| generations at once | large alone s | relay s | ideal s | speed-up (ideal) "
        "| relay / ideal | serve / ideal | relay CPU ms / 1k tokens | CPU share of a core "
        "| loop lag p50 / p99 ms | serve loop lag p99 ms | tokens/s | upstream lag p99 ms |"
    )
    lines = [head, "|" + " --- |" * head.count(" | ") + " --- |"]
    for x in levels:
        lines.append(
            f"| {x.concurrency} | {x.large_alone_s:.2f} | {x.relay_s:.2f} | {x.ideal_s:.2f} "
            f"| x{x.speedup:.3f} (x{x.ideal_speedup:.3f}) | {x.relay_over_ideal:.3f} "
            f"| {_cell(x.serve_over_ideal, '.3f')} | {x.relay_cpu_ms_per_1k_tokens:.1f} "
            f"| {x.relay_core_share:.2f} | {x.relay_lag_p50_ms:.1f} / {x.relay_lag_p99_ms:.1f} "
            f"| {_cell(x.serve_lag_p99_ms, '.0f')} | {x.relay_tokens_per_s:.0f} "
            f"| {x.upstream_lag_p99_ms:.1f} |"
        )
    return "\n".join(lines)


def keeps_up_to(levels: Sequence[Level]) -> str:
    """The sentence on where one relay process stops keeping up."""
    behind = [x for x in levels if x.relay_over_ideal > KEEPING_UP]
    if not behind:
        return f"one relay process kept relay / ideal <= {KEEPING_UP} at every level measured"
    first = behind[0]
    return (
        f"one relay process fell behind (relay / ideal {first.relay_over_ideal:.3f} > "
        f"{KEEPING_UP}) at {first.concurrency} generations at once"
    )


def plot(levels: Sequence[Level], path: Path) -> None:
    """Speed-up over the large model alone, measured and ideal, by concurrency."""
    plt = pyplot()
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    xs = [x.concurrency for x in levels]
    left.plot(xs, [x.ideal_speedup for x in levels], "o--", label="ideal (no client cost)")
    left.plot(xs, [x.speedup for x in levels], "o-", label="relay (RelaySwitcher)")
    served = [(x.concurrency, x.large_alone_s / x.serve_s) for x in levels if x.serve_s]
    if served:
        left.plot(*zip(*served, strict=True), "s-", label="relaygen serve")
    left.set(
        xscale="log", xlabel="generations at once", ylabel="speed-up over the large model alone"
    )
    left.axhline(1.0, color="grey", linewidth=0.8)
    left.legend()
    right.plot(xs, [x.relay_over_ideal for x in levels], "o-", label="relay / ideal")
    right.axhline(KEEPING_UP, color="red", linewidth=0.8, linestyle=":", label="1.05")
    right.set(xscale="log", xlabel="generations at once", ylabel="wall time / ideal")
    right.legend()
    figure.suptitle("The relay at simulated H200 speed (Qwen3-32B + Qwen3-1.7B step times)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
