"""1. The rates of each model (overhead, prefill, decode) and figures measured once."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import openai
from openai.types import Completion

from relay_integrations.jobs.statistics import median
from relay_integrations.testing import regex_literal
from relay_integrations.upstream.config import ModelRole

from .forcing import Rest, forced_body
from .meters import SENT, WRITTEN
from .servers import Server
from .settings import (
    DECODE_CONTEXT,
    DECODE_LONG,
    DECODE_SHORT,
    PREFILL_LONG,
    PREFILL_SHORT,
    RESUME_NEW,
    SAMPLING,
)


@dataclass
class Timing:
    sent: float
    first: float
    finish: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int

    @property
    def ttft(self) -> float:
        return self.first - self.sent

    @property
    def decode_rate(self) -> float:
        return (self.completion_tokens - 1) / (self.finish - self.first)


_RNG = random.Random()


def random_ids(n: int) -> list[int]:
    """A prompt no cache has seen: random ordinary token ids (no special tokens)."""
    return _RNG.sample(range(1000, 150000), n)


async def open_stream(
    client: openai.AsyncOpenAI,
    server: Server,
    prompt: str | list[int],
    max_tokens: int,
    **extra: Any,
) -> openai.AsyncStream[Completion]:
    """A streamed completion with the paper's sampling, its usage in the last chunk."""
    return await client.completions.create(
        model=server.model,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=SAMPLING["temperature"],
        top_p=SAMPLING["top_p"],
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"top_k": SAMPLING["top_k"], **extra},
    )


async def timed(
    client: openai.AsyncOpenAI, server: Server, prompt: list[int], max_tokens: int, **extra: Any
) -> Timing:
    sent = time.perf_counter()
    stream = await open_stream(client, server, prompt, max_tokens, **extra)
    first = finish = 0.0
    usage = None
    async for chunk in stream:
        now = time.perf_counter()
        if chunk.choices:
            first = first or now
            if chunk.choices[0].finish_reason is not None:
                finish = now
        if chunk.usage is not None:
            usage = chunk.usage
    assert usage is not None
    SENT[server.role] += 1
    WRITTEN[server.role] += usage.completion_tokens
    details = usage.prompt_tokens_details
    cached = (details.cached_tokens or 0) if details else 0
    return Timing(
        sent,
        first,
        finish or time.perf_counter(),
        usage.prompt_tokens,
        cached,
        usage.completion_tokens,
    )


@dataclass
class Rates:
    """One model's rates in one round (seconds; tokens per second), medians of its samples."""

    overhead: float  # o: TTFT of a 1-token prompt, max_tokens=1
    overhead_forced: float  # the same under the round's forcing (its grammar cached)
    prefill: float  # p: PREFILL_LONG never-seen tokens / (TTFT - o)
    decode: float  # d: under the round's forcing, ~900 tokens of context
    overhead_resume: float  # o_res: TTFT - 16/p of 16 new tokens after a cached 1024-token prompt
    samples: dict[str, list[float]]
    quiet: bool = True  # set from the round's foreign load


@dataclass
class Extras:
    """Figures measured once, for the record (not used by the ideal)."""

    decode_unforced: float  # ignore_eos, same method and context as d
    prefill_short: float | None  # PREFILL_SHORT tokens; None: their TTFT was within o
    overhead_regex_cold: float  # a regex's first use: the grammar is compiled
    handoff_penalty: float = 0.0  # a request right after the other server's, minus after a pause
    handoff_penalty_ttft: float = 0.0
    handoff_paused: float = 0.0  # the request's time after a 0.3 s pause


async def total_time(
    client: openai.AsyncOpenAI, server: Server, prompt: list[int], n: int, body: dict[str, Any]
) -> tuple[float, int]:
    """(seconds from sending to the end of the stream, completion tokens)."""
    timing = await timed(client, server, prompt, n, **body)
    return time.perf_counter() - timing.sent, timing.completion_tokens


async def decode_rate(
    client: openai.AsyncOpenAI, server: Server, context: list[int], body: dict[str, Any]
) -> float:
    """Tokens per second from two requests that differ only in length: (n2 - n1) / (T2 - T1).

    Whole-request times, so a stream whose chunks bunch up (a busy API server) does not skew
    it; the same cached context (~900 tokens, as in the relay's requests) for both.
    """
    t1, n1 = await total_time(client, server, context, DECODE_SHORT, body)
    t2, n2 = await total_time(client, server, context, DECODE_LONG, body)
    return (n2 - n1) / (t2 - t1)


async def measure_round(
    client: openai.AsyncOpenAI, server: Server, mode: str, rest: Rest, quick: bool
) -> Rates:
    samples: dict[str, list[float]] = {}

    async def overhead(body: dict[str, Any]) -> float:
        return (await timed(client, server, random_ids(1), 1, **body)).ttft

    async def prefill(o: float) -> tuple[float, float]:
        """(p of a fresh prompt, TTFT of 16 new tokens after it: resuming a cached context)."""
        prompt = random_ids(PREFILL_LONG)
        timing = await timed(client, server, prompt, 1)
        assert timing.cached_tokens == 0, "a random prompt hit the cache"
        resumed = await timed(client, server, prompt + random_ids(RESUME_NEW), 1)
        return timing.prompt_tokens / max(timing.ttft - o, 1e-6), resumed.ttft

    body = forced_body(mode, rest)
    await overhead({})  # the connection
    await overhead(body)  # the grammar (compiled once per server)
    samples["overhead_s"] = [await overhead({}) for _ in range(5)]
    samples["overhead_forced_s"] = [await overhead(body) for _ in range(3)]
    o = median(samples["overhead_s"])
    pairs = [await prefill(o) for _ in range(2)]
    samples["prefill_tok_s"] = [fresh for fresh, _ in pairs]
    p = median(samples["prefill_tok_s"])
    samples["overhead_resume_s"] = [ttft - RESUME_NEW / p for _, ttft in pairs]
    context = random_ids(DECODE_CONTEXT)
    await timed(client, server, context, 1)  # cache it
    samples["decode_tok_s"] = [
        await decode_rate(client, server, context, body) for _ in range(1 if quick else 2)
    ]
    return Rates(
        o,
        median(samples["overhead_forced_s"]),
        median(samples["prefill_tok_s"]),
        median(samples["decode_tok_s"]),
        median(samples["overhead_resume_s"]),
        samples,
    )


async def measure_extras(client: openai.AsyncOpenAI, server: Server, rest: Rest) -> Extras:
    overheads = [(await timed(client, server, random_ids(1), 1)).ttft for _ in range(5)]
    o = median(overheads)
    short = [await timed(client, server, random_ids(PREFILL_SHORT), 1) for _ in range(3)]
    context = random_ids(DECODE_CONTEXT)
    await timed(client, server, context, 1)
    unforced = await decode_rate(client, server, context, {"ignore_eos": True})
    unique = {"structured_outputs": {"regex": regex_literal(rest.text) + uuid.uuid4().hex}}
    cold = (await timed(client, server, random_ids(1), 1, **unique)).ttft
    above_overhead = median([t.ttft for t in short]) - o
    short_rate = PREFILL_SHORT / above_overhead if above_overhead > 0 else None
    return Extras(unforced, short_rate, cold)


async def measure_handoff(
    clients: Mapping[ModelRole, openai.AsyncOpenAI],
    servers: Mapping[ModelRole, Server],
    rest: Rest,
    extras: Mapping[ModelRole, Extras],
    pairs: int,
) -> None:
    """How much slower a request is when it starts right after the other server's request.

    The relay's situation at every hand-off: the other server has just streamed its last
    token, and its processes (API server, engine core; only the model worker is pinned to a
    core) still run for a moment on the 2 cores both servers share. Compared with the same
    request after a 0.3 s pause; 16 forced tokens each, after a cached ~900-token context.
    """
    body = forced_body("tokens", rest)
    contexts = {role: random_ids(DECODE_CONTEXT) for role in servers}
    for role in servers:
        await timed(clients[role], servers[role], contexts[role], 1)
    order: tuple[tuple[ModelRole, ModelRole], ...] = (("large", "small"), ("small", "large"))
    for role, other in order:
        right_after: list[Timing] = []
        paused: list[Timing] = []
        for _ in range(pairs):
            for pause, into in ((0.0, right_after), (0.3, paused)):
                await timed(clients[other], servers[other], contexts[other], DECODE_SHORT, **body)
                if pause:
                    await asyncio.sleep(pause)
                into.append(
                    await timed(clients[role], servers[role], contexts[role], DECODE_SHORT, **body)
                )
        x = extras[role]
        total = [t.finish - t.sent for t in right_after], [t.finish - t.sent for t in paused]
        x.handoff_penalty = median(total[0]) - median(total[1])
        x.handoff_penalty_ttft = median([t.ttft for t in right_after]) - median(
            [t.ttft for t in paused]
        )
        x.handoff_paused = median(total[1])
