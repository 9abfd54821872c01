"""``--workers 1,2,4``: the same load against ``relaygen serve --workers N`` for each N, side by
side in one run::

    python -m benchmarks server-load --workers 1,2,4 --quick

One upstream process and one relay per worker count, all started together, each on its own
port. After a warm-up round each, `rounds` rounds in which every relay in turn (the order
rotating from round to round) serves `concurrency` streams at once, so that whatever else runs
on the machine weighs on each alike. Per relay: generations/s over its rounds' wall time, CPU
seconds per generation of its whole process tree (the supervisor and its workers, from
``/proc``), the share of that CPU its busiest process used, and the cores the upstream, this
client and the machine's other processes used meanwhile. The upstream and this client are one
process each whatever N is: on a machine with few cores they, not the relay, may set the pace.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx

from relay_integrations.jobs.progress import Progress

from ..proc import cpu_seconds, machine_busy_seconds, tree_cpu_seconds
from .figures import CpuSeconds, Sample, WorkerCountFigures
from .load import stream_clients, timed
from .processes import Relay
from .settings import Settings
from .streams import via_server


@dataclass
class CpuReading:
    """CPU seconds so far: of each process of a relay's tree, and the sums of `CpuSeconds`."""

    tree: dict[int, float]
    seconds: CpuSeconds

    @classmethod
    def now(cls, relay_pid: int, upstream_pid: int) -> CpuReading:
        tree = tree_cpu_seconds(relay_pid)
        seconds = CpuSeconds(
            relay=sum(tree.values()),
            upstream=cpu_seconds(upstream_pid),
            client=time.process_time(),
            machine=machine_busy_seconds(),
        )
        return cls(tree, seconds)


@dataclass
class Measured:
    """What one relay's rounds added up to."""

    samples: list[Sample] = field(default_factory=list)
    wall: float = 0.0
    cpu: CpuSeconds = field(default_factory=CpuSeconds)
    per_process: dict[int, float] = field(default_factory=dict)

    def add(
        self, samples: list[Sample], wall: float, before: CpuReading, after: CpuReading
    ) -> None:
        self.samples += samples
        self.wall += wall
        self.cpu = self.cpu.plus(before.seconds, after.seconds)
        for pid, seconds in after.tree.items():
            used = seconds - before.tree.get(pid, 0.0)
            self.per_process[pid] = self.per_process.get(pid, 0.0) + used

    def figures(self, workers: int) -> WorkerCountFigures:
        per_process = self.per_process.values()
        return WorkerCountFigures.of(workers, self.samples, self.wall, self.cpu, per_process)


async def compare(
    settings: Settings, relays: list[Relay], upstream_pid: int
) -> list[WorkerCountFigures]:
    """The warm-up and the measured rounds; the figures of each relay, in `relays`' order."""
    async with httpx.AsyncClient(timeout=settings.timeout) as client:
        for relay in relays:
            await relay.wait_serving(client)
    streams = {relay.workers: stream_clients(settings) for relay in relays}

    def one(relay: Relay) -> Callable[[int], Awaitable[Sample]]:
        async def stream(i: int) -> Sample:
            async with streams[relay.workers].lease() as leased:
                return await via_server(leased, relay.url, i)

        return stream

    n = settings.concurrency
    measured = {relay.workers: Measured() for relay in relays}
    try:
        with Progress("warm-up", n * len(relays)) as bar:
            for relay in relays:
                await timed(n, one(relay), bar)
        with Progress("rounds ", settings.rounds * n * len(relays)) as bar:
            for r in range(settings.rounds):
                for relay in relays[r % len(relays) :] + relays[: r % len(relays)]:
                    before = CpuReading.now(relay.process.pid, upstream_pid)
                    samples, wall = await timed(n, one(relay), bar)
                    after = CpuReading.now(relay.process.pid, upstream_pid)
                    measured[relay.workers].add(samples, wall, before, after)
                    await asyncio.sleep(0.5)
    finally:
        for shards in streams.values():
            await shards.aclose()
    return [measured[relay.workers].figures(relay.workers) for relay in relays]
