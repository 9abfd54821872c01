"""What is measured beside the streams of the server rounds: the relay's VmRSS (sampled), how
long a ``GET /metrics`` takes, and the CPU time of the three processes and of the machine."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

import httpx

from ..proc import cpu_seconds, machine_busy_seconds, memory_mb
from .figures import CpuSeconds

T = TypeVar("T")
SAMPLE_EVERY = 0.05  # seconds between VmRSS samples
PROBE_EVERY = 0.25  # seconds between GET /metrics


class Periodic:
    """Calls `tick` every `every` seconds (after each tick) from when started until stopped."""

    every: float

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def tick(self) -> None:
        raise NotImplementedError

    async def _run(self) -> None:
        while True:
            await self.tick()
            await asyncio.sleep(self.every)


class RssSampler(Periodic):
    """Samples a process's VmRSS every 50 ms while started (and once when stopped); keeps the
    peak."""

    every = SAMPLE_EVERY

    def __init__(self, pid: int) -> None:
        super().__init__()
        self.pid = pid
        self.peak = 0.0
        self.samples = 0

    async def stop(self) -> None:
        await super().stop()
        self._sample()

    async def tick(self) -> None:
        self._sample()

    def _sample(self) -> None:
        self.peak = max(self.peak, memory_mb(self.pid)["VmRSS"])
        self.samples += 1


class MetricsProbe(Periodic):
    """Times a ``GET /metrics`` every 250 ms while started: how long the server takes to answer
    a request that needs no upstream, i.e. how far behind its event loop is."""

    every = PROBE_EVERY

    def __init__(self, client: httpx.AsyncClient, url: str) -> None:
        super().__init__()
        self.client = client
        self.url = f"{url}/metrics"
        self.seconds: list[float] = []

    async def tick(self) -> None:
        started = time.perf_counter()
        await self.client.get(self.url)
        self.seconds.append(time.perf_counter() - started)


def inflight_generations(metrics: str) -> float:
    """``relay_inflight_generations`` of a ``/metrics`` text (nan when it is not there)."""
    for line in metrics.splitlines():
        if line.startswith("relay_inflight_generations "):
            return float(line.split()[-1])
    return float("nan")


class ServerMeters:
    """What is measured around each server round: the relay's VmRSS while it runs and after it,
    ``GET /metrics`` while it runs, and the CPU seconds it took (summed over the rounds)."""

    def __init__(self, relay_pid: int, upstream_pid: int, probe: MetricsProbe) -> None:
        self.relay_pid = relay_pid
        self.upstream_pid = upstream_pid
        self.rss = RssSampler(relay_pid)
        self.probe = probe
        self.cpu = CpuSeconds()
        self.rss_after_round: list[float] = []

    async def measure(self, server_round: Awaitable[T]) -> T:
        """Await `server_round` (not started yet), measuring it."""
        before = self._cpu_so_far()
        self.rss.start()
        self.probe.start()
        result = await server_round
        await self.probe.stop()
        await self.rss.stop()
        self.cpu = self.cpu.plus(before, self._cpu_so_far())
        self.rss_after_round.append(memory_mb(self.relay_pid)["VmRSS"])
        return result

    def _cpu_so_far(self) -> CpuSeconds:
        return CpuSeconds(
            relay=cpu_seconds(self.relay_pid),
            upstream=cpu_seconds(self.upstream_pid),
            client=time.process_time(),
            machine=machine_busy_seconds(),
        )
