"""Prometheus metrics of the relay server, on its own registry (one per app)::

metrics = RelayMetrics()
metrics.observe(result)               # tokens, share, switches, segment and total times
body, content_type = metrics.render()  # GET /metrics

With several worker processes (``relaygen serve --workers N``), ``RelayMetrics(multiprocess=
True)`` in each: prometheus_client's multiprocess mode, every process writing its values to
files in ``PROMETHEUS_MULTIPROC_DIR`` (set before prometheus_client is imported: the supervisor
sets it before it starts the workers) and ``GET /metrics`` summing the files of all of them.
A ``worker`` label would not do: a scrape reaches the one worker the kernel hands the
connection to, and would show that worker's counts only. The in-flight gauge sums the workers
alive (``livesum``); the supervisor drops a dead worker's (``mark_process_dead``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector

from ..relay.result import RelayResult

_SECONDS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 3600)
_SHARES = tuple(i / 10 for i in range(1, 11))
_LAG_SECONDS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5)
LOOP_LAG_INTERVAL = 0.05
"""Seconds between two readings of the event loop's lag."""


MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"
"""The variable naming prometheus_client's directory of multiprocess values."""


class RelayMetrics:
    """Requests, errors, tokens per model, large-model share, switches, latencies, in flight.

    `multiprocess`: this process is one of several serving the same port; ``render`` shows the
    sums over all of them (see the module's docstring).
    """

    def __init__(self, multiprocess: bool = False) -> None:
        if multiprocess and not os.path.isdir(os.environ.get(MULTIPROC_DIR, "")):
            raise RuntimeError(
                f"metrics shared by worker processes need {MULTIPROC_DIR} set to a directory "
                "before prometheus_client is imported (relaygen serve --workers N sets it)"
            )
        self.multiprocess = multiprocess
        self.registry = CollectorRegistry()
        self._declare_traffic(self.registry)
        self._declare_generations(self.registry)

    def _declare_traffic(self, r: CollectorRegistry) -> None:
        """The server's own figures: requests, errors, refusals, generations in flight, the
        event loop's lag."""
        self.requests = Counter(
            "relay_requests", "HTTP requests by path and status", ["path", "status"], registry=r
        )
        self.errors = Counter(
            "relay_errors",
            "Failed generations and refused requests by kind",
            ["kind"],
            registry=r,
        )
        self.rejected = Counter(
            "relay_rejected", "Requests refused with 429 at the concurrency limit", registry=r
        )
        self.connections_limited = Counter(
            "relay_connections_limited",
            "Client connections closed by a limit: limit is head (the request head or "
            "body did not arrive within --head-timeout / --body-timeout: 408), send (the "
            "client accepted nothing for --send-timeout; its generation was cancelled), "
            "connections or connections_per_client (one more than --max-connections or "
            "--max-connections-per-client: 503)",
            ["limit"],
            registry=r,
        )
        self.inflight = Gauge(
            "relay_inflight_generations",
            "Generations being written now",
            multiprocess_mode="livesum",  # of the workers alive (one process: its own value)
            registry=r,
        )
        self.loop_lag = Histogram(
            "relay_event_loop_lag_seconds",
            f"How late a timer wakes up on the server's event loop (one every "
            f"{LOOP_LAG_INTERVAL:g} s): a busy loop delays every stream it serves",
            buckets=_LAG_SECONDS,
            registry=r,
        )

    def _declare_generations(self, r: CollectorRegistry) -> None:
        """What the generations did: tokens per model, the large model's share, switches,
        speculative hand-offs, resumed streams, degraded generations, the prompt warm-up, and their
        times."""
        self.tokens = Counter(
            "relay_tokens",
            "Tokens per model; kind is prompt, cached (of prompt) or completion",
            ["model", "kind"],
            registry=r,
        )
        self.large_share = Histogram(
            "relay_large_share",
            "Share of a generation's tokens written by the large model",
            buckets=_SHARES,
            registry=r,
        )
        self.switches = Counter(
            "relay_switches", "Hand-offs of the reasoning to the small model", registry=r
        )
        self.speculative = Counter(
            "relay_speculative_requests",
            "Requests opened ahead of a hand-off (SwitchPolicy.speculative_handoff), by outcome",
            ["outcome"],
            registry=r,
        )
        self.resumes = Counter(
            "relay_resumed_streams",
            "Upstream streams that broke after sending text and went on from the text so far "
            "(a vLLM replica lost mid-request; the log says which server)",
            registry=r,
        )
        self.degraded = Counter(
            "relay_degraded_generations",
            "Generations in which the large model wrote what the small one would have, its "
            "server having failed or being known down (SwitchPolicy.on_small_failure)",
            registry=r,
        )
        self.warm_up_tokens = Counter(
            "relay_warm_up_tokens",
            "Small-model prompt tokens sent when a generation starts to fill its prefix cache "
            "(SwitchPolicy.warm_small_prompt; not in relay_tokens); kind is prompt or cached",
            ["kind"],
            registry=r,
        )
        self.segment_seconds = Histogram(
            "relay_segment_seconds",
            "Wall time of one segment (one model writing without interruption)",
            ["model", "phase"],
            buckets=_SECONDS,
            registry=r,
        )
        self.generation_seconds = Histogram(
            "relay_generation_seconds",
            "End-to-end time of a generation",
            buckets=_SECONDS,
            registry=r,
        )
        self.first_token_seconds = Histogram(
            "relay_time_to_first_token_seconds",
            "Time to the first streamed text of a generation",
            buckets=_SECONDS,
            registry=r,
        )

    async def watch_event_loop(self) -> None:
        """Observe the event loop's lag until cancelled (a task of the server's lifespan)."""
        await watch_loop_lag(self.loop_lag.observe, LOOP_LAG_INTERVAL)

    def observe(self, result: RelayResult) -> None:
        """Record a finished (or partial) generation."""
        for role, used in result.usage.items():
            self.tokens.labels(role, "prompt").inc(used.prompt_tokens)
            self.tokens.labels(role, "cached").inc(used.cached_tokens)
            self.tokens.labels(role, "completion").inc(used.completion_tokens)
        if result.completion_tokens:
            self.large_share.observe(result.stats.large_share)
        self.switches.inc(result.stats.switches)
        self.speculative.labels("used").inc(result.stats.speculative_handoffs)
        self.speculative.labels("closed").inc(result.stats.speculative_misses)
        self.resumes.inc(result.stats.resumes)
        if result.stats.degraded is not None:
            self.degraded.inc()
        if (warm_up := result.stats.warm_up) is not None:
            self.warm_up_tokens.labels("prompt").inc(warm_up.prompt_tokens)
            self.warm_up_tokens.labels("cached").inc(warm_up.cached_tokens)
        for segment in result.segments:
            self.segment_seconds.labels(segment.model, segment.phase).observe(segment.seconds)
        self.generation_seconds.observe(result.stats.total_seconds)
        if result.stats.time_to_first_token is not None:
            self.first_token_seconds.observe(result.stats.time_to_first_token)

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type (`multiprocess`: of all the workers)."""
        if not self.multiprocess:
            return generate_latest(self.registry), CONTENT_TYPE_LATEST
        every_worker = CollectorRegistry()
        MultiProcessCollector(every_worker)  # type: ignore[no-untyped-call]  # not annotated
        return generate_latest(every_worker), CONTENT_TYPE_LATEST


async def watch_loop_lag(observe: Callable[[float], object], interval: float) -> None:
    """Until cancelled: sleep `interval` seconds, then `observe` how late (in seconds) the
    running event loop woke this up. A busy loop delays every stream it serves by as much."""
    loop = asyncio.get_running_loop()
    while True:
        started = loop.time()
        await asyncio.sleep(interval)
        observe(max(loop.time() - started - interval, 0.0))
