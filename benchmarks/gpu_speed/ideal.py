"""The ideal time of a workload: the same engines with no client at all.

Each generation is the turns it took (which model, the prompt tokens that model had not
cached, the tokens written); the turns go to :class:`~relay_integrations.testing.gpu_speed.Engine`
instances on a virtual clock, each turn arriving the instant the previous one ended, as many
generations at a time as measured. What the relay adds to a generation is its wall time minus
this::

    walls = ideal_walls(latencies, [[Turn("large", 120, 40), Turn("small", 9, 12)], ...])
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from relay_integrations.relay import RelayResult
from relay_integrations.testing.gpu_speed import Engine, LatencyModel, VirtualClockLoop
from relay_integrations.upstream.config import ModelRole


@dataclass(frozen=True)
class Turn:
    """One model writing: its uncached prompt tokens, then `tokens` tokens."""

    role: ModelRole
    uncached: int
    tokens: int


def turns_of(result: RelayResult) -> list[Turn]:
    """The turns of a relay generation, from its segments (a segment's requests as one)."""
    return [
        Turn(
            segment.model,
            segment.usage.prompt_tokens - (segment.usage.cached_tokens or 0),
            segment.usage.completion_tokens,
        )
        for segment in result.segments
        if segment.usage.requests
    ]


def ideal_walls(
    latencies: Mapping[ModelRole, LatencyModel],
    generations: Sequence[Sequence[Turn]],
    concurrency: int,
) -> list[float]:
    """Seconds each generation takes on the engines alone, from its start to its end, with
    `concurrency` of them at a time (in order, each starting as one ends)."""

    async def main() -> list[float]:
        engines = {role: Engine(latency) for role, latency in latencies.items()}
        slots = asyncio.Semaphore(concurrency)
        walls = await asyncio.gather(*(_generation(engines, turns, slots) for turns in generations))
        for engine in engines.values():
            await engine.aclose()
        return list(walls)

    return VirtualClockLoop.run(main())


async def _generation(
    engines: Mapping[ModelRole, Engine], turns: Sequence[Turn], slots: asyncio.Semaphore
) -> float:
    loop = asyncio.get_running_loop()
    async with slots:
        began = loop.time()
        for turn in turns:
            request = engines[turn.role].admit(turn.uncached)
            for index in range(turn.tokens):
                await request.take_token(last=index == turn.tokens - 1)
            Engine.close(request)
        return loop.time() - began
