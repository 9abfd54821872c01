"""The run: single requests each way, then load rounds alternating between the server path
and the in-process path, measured, into `Figures`."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

import httpx

from relay_integrations.jobs.progress import Progress
from relay_integrations.relay import EndpointConfig, RelayConfig, RelaySwitcher, SwitchPolicy

from ..proc import memory_mb
from .client_shards import DEFAULT_SHARD_SIZE, ClientShards
from .figures import (
    CpuFigures,
    Figures,
    LoadFigures,
    MemoryFigures,
    PerPath,
    Sample,
    SingleFigures,
    Summary,
    errors,
)
from .processes import CUES, Processes, wait_healthy
from .sampling import MetricsProbe, ServerMeters, inflight_generations
from .settings import Settings
from .streams import via_core, via_server

CLIENT_SHARD = DEFAULT_SHARD_SIZE  # streams one of this process's httpx clients carries at once

One = Callable[[int], Awaitable[Sample]]
"""One generation (its number picks the question) by one path."""
PathName = Literal["server", "core"]


async def timed(n: int, one: One, bar: Progress) -> tuple[list[Sample], float]:
    """`n` generations started at once; their samples and the wall time of the whole batch."""

    async def run(i: int) -> Sample:
        sample = await one(i)
        bar.advance()
        return sample

    started = time.perf_counter()
    samples = await asyncio.gather(*(run(i) for i in range(n)))
    return list(samples), time.perf_counter() - started


async def sequential(n: int, one: One, warmup: int = 3) -> list[Sample]:
    for i in range(warmup):
        await one(i)
    return [await one(i) for i in range(n)]


class StreamClient(httpx.AsyncClient):
    """An httpx client that `ClientShards` can close (it calls ``close()``, as on openai's)."""

    async def close(self) -> None:
        await self.aclose()


def core_config(upstream_url: str, endpoint_concurrency: int) -> RelayConfig:
    """The in-process relay, configured as ``relaygen serve`` is."""
    return RelayConfig(
        large=EndpointConfig(
            base_url=upstream_url, model="large", max_concurrency=endpoint_concurrency
        ),
        small=EndpointConfig(
            base_url=upstream_url, model="small", max_concurrency=endpoint_concurrency
        ),
        cues=CUES,
        policy=SwitchPolicy(cooldown_tokens=0),
    )


@dataclass
class Rounds:
    """The samples and wall times of the load rounds, per path."""

    samples: dict[PathName, list[Sample]] = field(
        default_factory=lambda: {"server": [], "core": []}
    )
    walls: dict[PathName, list[float]] = field(default_factory=lambda: {"server": [], "core": []})

    def add(self, path: PathName, samples: list[Sample], wall: float) -> None:
        self.samples[path] += samples
        self.walls[path].append(wall)

    def per_path(self) -> tuple[PerPath[list[Sample]], PerPath[list[float]]]:
        return (
            PerPath(server=self.samples["server"], core=self.samples["core"]),
            PerPath(server=self.walls["server"], core=self.walls["core"]),
        )


async def load_rounds(
    settings: Settings, server_one: One, core_one: One, meters: ServerMeters
) -> Rounds:
    """`settings.rounds` rounds of `settings.concurrency` generations at once on each path,
    the first path alternating; the server rounds measured by `meters`."""
    n = settings.concurrency
    rounds = Rounds()
    total = settings.rounds * n
    with Progress("server", total) as server_bar, Progress("core  ", total) as core_bar:
        for r in range(settings.rounds):
            order: tuple[PathName, PathName] = (
                ("server", "core") if r % 2 == 0 else ("core", "server")
            )
            for path in order:
                if path == "server":
                    samples, wall = await meters.measure(timed(n, server_one, server_bar))
                else:
                    samples, wall = await timed(n, core_one, core_bar)
                rounds.add(path, samples, wall)
                await asyncio.sleep(0.5)
    return rounds


def client_limits(settings: Settings) -> httpx.Limits:
    """The connection limits of each of this process's clients."""
    return httpx.Limits(
        max_connections=CLIENT_SHARD + 1,
        max_keepalive_connections=CLIENT_SHARD + 1,
        keepalive_expiry=settings.keepalive_expiry,
    )


def stream_clients(settings: Settings) -> ClientShards[StreamClient]:
    """The clients the streams go through: at most CLIENT_SHARD requests each, as the relay's
    own upstream requests do (one httpx client holding 200 kept-alive connections probes every
    idle one for each request it places, which held a burst back by ~3 s in this process)."""
    limits, timeout = client_limits(settings), httpx.Timeout(settings.timeout)
    return ClientShards(lambda: StreamClient(limits=limits, timeout=timeout), CLIENT_SHARD)


async def benchmark(settings: Settings, processes: Processes) -> Figures:
    """Single requests and load rounds against the running relay and in-process."""
    url, pid = processes.relay_url, processes.relay.pid
    limits, timeout = client_limits(settings), httpx.Timeout(settings.timeout)
    streams = stream_clients(settings)
    async with (
        httpx.AsyncClient(limits=limits, timeout=timeout) as client,
        httpx.AsyncClient(timeout=timeout) as probe_client,
    ):
        await wait_healthy(client, url, processes.relay)
        await asyncio.sleep(0.5)
        idle = memory_mb(pid)["VmRSS"]
        config = core_config(processes.upstream_url, settings.endpoint_concurrency)
        async with RelaySwitcher(config) as switcher:

            async def server_one(i: int) -> Sample:
                async with streams.lease() as leased:
                    return await via_server(leased, url, i)

            async def core_one(i: int) -> Sample:
                return await via_core(switcher, i)

            print(
                f"single requests: {settings.sequential} sequential each way ...", file=sys.stderr
            )
            single_server = await sequential(settings.sequential, server_one)
            single_core = await sequential(settings.sequential, core_one)
            after_warmup = memory_mb(pid)["VmRSS"]
            meters = ServerMeters(pid, processes.upstream.pid, MetricsProbe(probe_client, url))
            rounds = await load_rounds(settings, server_one, core_one, meters)

        await asyncio.sleep(1.0)
        after_load = memory_mb(pid)
        metrics = (await client.get(f"{url}/metrics")).text
        await streams.aclose()
    samples, walls = rounds.per_path()
    memory = MemoryFigures(
        idle=idle,
        after_single_requests=after_warmup,
        peak_rss_sampled=meters.rss.peak,
        rss_samples=meters.rss.samples,
        hwm_at_end=after_load["VmHWM"],
        after_each_server_round=meters.rss_after_round,
        after_load_1s=after_load["VmRSS"],
        peak_above_idle_per_stream=(meters.rss.peak - idle) / settings.concurrency,
    )
    return Figures(
        single=SingleFigures.of(PerPath(server=single_server, core=single_core)),
        load=LoadFigures.of(samples, walls),
        memory_mb=memory,
        cpu_during_server_rounds=CpuFigures.of(meters.cpu, sum(walls.server), len(samples.server)),
        metrics_probe_seconds=Summary.of(meters.probe.seconds),
        relay_inflight_after_load=inflight_generations(metrics),
        errors=errors(samples.server + samples.core),
        samples=samples,
    )
