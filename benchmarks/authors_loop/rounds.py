"""The runs: every approach on every trace, under each forcing, paired by run::

    rounds = Rounds(servers, with_stream=False)
    await rounds.token_rests(TRACES)  # the token forcing's, and the traces' lengths
    measured = await rounds.run(modes=["tokens", "regex"], traces=TRACES, runs=10)
    await rounds.aclose()

Under each forcing an untimed generation of every approach on every trace comes first
(connections, the servers' grammar compilation); then each run takes the traces in turn and
on each the approaches back to back, the order rotating by one from trace to trace and run to
run. The authors' loop is synchronous (the openai SDK's blocking client), in a thread.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Mapping, Sequence

import httpx
import openai

from relay_integrations.relay import ModelRole

from .approaches import Generation, Relay, authors_generate
from .forcing import Rest, forcer, token_rests
from .meter import CpuMeter
from .pairing import Measured
from .servers import Server, tokenize
from .traces import Trace

_STARTED = time.monotonic()


def log(message: str) -> None:
    print(f"[{time.monotonic() - _STARTED:6.0f}s] {message}", file=sys.stderr, flush=True)


class Rounds:
    """The relay (and, `with_stream`, the relay finding its stops in the stream) and the
    authors' loop over the two servers, with the meter of what others did meanwhile."""

    def __init__(self, servers: Mapping[ModelRole, Server], with_stream: bool) -> None:
        self.servers = servers
        self.relays = [Relay(servers, limit) for limit in ([None, 1] if with_stream else [None])]
        self.clients = {
            role: openai.OpenAI(base_url=s.url, api_key="EMPTY", timeout=3600)
            for role, s in servers.items()
        }
        self.approaches = [*(r.name for r in self.relays), "authors"]
        self.rests: dict[str, dict[int, Rest]] = {}
        self.meter = CpuMeter()

    async def aclose(self) -> None:
        await asyncio.gather(*(r.aclose() for r in self.relays))
        for client in self.clients.values():
            client.close()

    async def token_rests(self, traces: Sequence[Trace]) -> dict[str, int]:
        """The token forcing's rests of each trace; each trace's tokens (both servers must
        tokenize it alike, or the forcing would differ)."""
        async with httpx.AsyncClient(timeout=120) as http:
            counts = {}
            for trace in traces:
                ids = [(await tokenize(http, s, trace.text))[0] for s in self.servers.values()]
                assert ids[0] == ids[1], "the two servers tokenize the trace differently"
                counts[trace.name] = len(ids[0])
                self.rests[trace.name] = await token_rests(http, self.servers["large"], trace.text)
        return counts

    async def generate(self, approach: str, trace: Trace, mode: str) -> Generation:
        force = forcer(mode, trace, self.rests.get(trace.name, {}))
        for relay in self.relays:
            if relay.name == approach:
                return await relay.generate(trace, force)
        return await asyncio.to_thread(authors_generate, self.clients, trace, force)

    async def measure(self, approach: str, trace: Trace, mode: str, run: int) -> Measured:
        since = self.meter.start()
        gen = await self.generate(approach, trace, mode)
        cores = self.meter.foreign(since) / gen.wall
        log(
            f"{mode:6} {trace.name:6} run {run + 1} {approach:7} {gen.wall:6.2f} s, "
            f"{gen.requests} requests, {gen.switches} switches, others used {cores:.2f} cores"
            + ("" if gen.text_ok else "  (text differs from the trace)")
        )
        return Measured(mode, trace.name, run, gen, cores)

    async def run(self, modes: Sequence[str], traces: Sequence[Trace], runs: int) -> list[Measured]:
        measured = []
        for mode in modes:
            log(f"{mode} forcing: warm-up, one generation per trace and approach")
            for trace in traces:
                for approach in self.approaches:
                    await self.generate(approach, trace, mode)
            for run in range(runs):
                for i, trace in enumerate(traces):
                    k = (run + i) % len(self.approaches)
                    for approach in self.approaches[k:] + self.approaches[:k]:
                        measured.append(await self.measure(approach, trace, mode, run))
        return measured
