"""The measured runs: a :class:`Load` of generations, at most `concurrency` at once, three
ways.

- ``relay``: :class:`RelaySwitcher` in this process, as an application embeds it;
- ``large alone``: one streamed completion per generation from the large model, through the
  relay's own endpoint client (what the relay is compared with);
- ``serve``: ``relaygen serve`` in a process of its own, streamed chat completions sent to it
  from this one and read with the relay's own HTTP client (its CPU is read from ``/proc``; the
  event-loop lag is the server's own ``relay_event_loop_lag_seconds``).

Each run gets fresh upstreams (:mod:`.upstream`), so no run finds another's prefixes cached.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from benchmarks.proc import cpu_seconds
from benchmarks.server_load.processes import free_port, start_server, wait_healthy
from benchmarks.upstream import stop as stop_process
from relay_integrations.relay import (
    EndpointConfig,
    PromptPath,
    RelayConfig,
    RelayResult,
    RelaySwitcher,
    SamplingConfig,
)
from relay_integrations.server.metrics import watch_loop_lag
from relay_integrations.testing.qwen3_template import render_chat, tokenize
from relay_integrations.upstream import sse
from relay_integrations.upstream.config import ModelRole
from relay_integrations.upstream.endpoint import CompletionRequest, Endpoint

from . import upstream
from .ideal import Turn, turns_of
from .traces import Traces

CUES = "builtin:qwen3-32b--qwen3-1.7b"
BUDGET = 8192
LAG_INTERVAL = 0.005
"""Seconds the event-loop lag timer sleeps between its readings."""


@dataclass(frozen=True)
class Load:
    """`generations` generations, `concurrency` at a time (a new one starts as one ends)."""

    concurrency: int
    generations: int


@dataclass
class Run:
    """What one run measured; a wall is a generation's, from its start to its end."""

    approach: str
    load: Load
    walls: list[float]
    seconds: float  # the whole run, first start to last end
    tokens: int  # written by both models
    cpu_seconds: float  # of the process the relay ran in
    loop_lag_ms: list[float]
    upstreams: dict[str, dict[str, Any]] = field(default_factory=dict)
    turns: list[list[Turn]] = field(default_factory=list)  # per generation
    switches: list[int] = field(default_factory=list)  # per relay generation


@dataclass(frozen=True)
class Setup:
    """What every run serves: the traces, the figures and the two modelled models."""

    traces: Traces
    traces_path: Path
    trace_count: int
    min_tokens: int
    figures: Path
    models: dict[ModelRole, str]  # role -> the figures' model
    step_overhead_ms: float
    logs: Path
    prompt_path: PromptPath = "auto"  # RelayConfig.prompt_path of the relay's runs

    def spec(self, role: ModelRole) -> upstream.UpstreamSpec:
        return upstream.UpstreamSpec(
            role,
            self.figures,
            self.models[role],
            self.traces_path,
            self.trace_count,
            self.min_tokens,
            self.step_overhead_ms,
        )


class LoopLag:
    """How late a timer on this event loop wakes up (ms), while it runs."""

    def __init__(self) -> None:
        self.readings: list[float] = []
        self._task: asyncio.Task[None] | None = None

    def __enter__(self) -> LoopLag:
        watch = watch_loop_lag(lambda late: self.readings.append(late * 1e3), LAG_INTERVAL)
        self._task = asyncio.get_running_loop().create_task(watch)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()


@contextmanager
def upstreams(setup: Setup, roles: Sequence[ModelRole]) -> Iterator[dict[str, Any]]:
    """Fresh upstreams for `roles`: yields their URLs (by role) and, once they are stopped,
    holds their engine reports under ``"engines"``."""
    procs: dict[ModelRole, subprocess.Popen[bytes]] = {}
    urls: dict[ModelRole, str] = {}
    reports: dict[ModelRole, dict[str, Any]] = {}
    with (setup.logs / "upstreams.log").open("ab") as log:
        try:
            for role in roles:
                procs[role], urls[role] = upstream.start(setup.spec(role), log)
            yield {"urls": urls, "engines": reports}
        finally:
            for role, proc in procs.items():
                reports[role] = upstream.stop(proc)


def relay_config(
    urls: dict[str, str], concurrency: int, prompt_path: PromptPath = "auto"
) -> RelayConfig:
    """The relay over the two upstreams, with room for every generation's requests (two
    a generation at a hand-off opened ahead)."""
    limit = max(64, 2 * concurrency)
    return RelayConfig(
        large=EndpointConfig(base_url=urls["large"], model="large", max_concurrency=limit),
        small=EndpointConfig(base_url=urls["small"], model="small", max_concurrency=limit),
        cues=CUES,
        allow_model_mismatch=True,  # the cues' pair, stood in for by the scripted models
        sampling=SamplingConfig(max_tokens=BUDGET),
        prompt_path=prompt_path,
    )


async def _timed(
    load: Load, one: Callable[[int], Awaitable[Any]]
) -> tuple[list[float], list[Any], float, float, list[float]]:
    """Run `one(g)` for every generation g of `load`: walls, results, run seconds, this
    process's CPU seconds, loop lag readings."""
    loop = asyncio.get_running_loop()
    slots = asyncio.Semaphore(load.concurrency)

    async def timed(generation: int) -> tuple[float, Any]:
        async with slots:
            began = loop.time()
            result = await one(generation)
            return loop.time() - began, result

    with LoopLag() as lag:
        cpu, started = time.process_time(), loop.time()
        outcomes = await asyncio.gather(*(timed(g) for g in range(load.generations)))
        seconds, cpu = loop.time() - started, time.process_time() - cpu
    return [w for w, _ in outcomes], [r for _, r in outcomes], seconds, cpu, lag.readings


async def relay_run(setup: Setup, load: Load) -> Run:
    """The relay's generations in this process, after one untimed warm-up."""
    with upstreams(setup, ["large", "small"]) as up:
        async with RelaySwitcher(
            relay_config(up["urls"], load.concurrency, setup.prompt_path)
        ) as relay:
            await relay.generate(setup.traces.messages(load.generations))  # connections

            async def one(generation: int) -> RelayResult:
                return await relay.generate(setup.traces.messages(generation))

            walls, results, seconds, cpu, lag = await _timed(load, one)
    return Run(
        "relay",
        load,
        walls,
        seconds,
        sum(r.completion_tokens for r in results),
        cpu,
        lag,
        up["engines"],
        [turns_of(r) for r in results],
        [r.stats.switches for r in results],
    )


async def large_alone_run(setup: Setup, load: Load) -> Run:
    """Streamed completions of the whole trace by the large model."""
    with upstreams(setup, ["large"]) as up:
        endpoint = Endpoint(
            EndpointConfig(base_url=up["urls"]["large"], model="large", max_concurrency=4096),
            "large",
        )

        async def one(generation: int) -> int:
            prompt = render_chat(setup.traces.messages(generation))
            request = CompletionRequest(prompt=prompt, max_tokens=BUDGET)
            tokens = 0
            async for piece in endpoint.stream_completion(request):
                tokens = piece.completion_tokens or tokens
            return tokens

        try:
            await one(load.generations)
            walls, tokens, seconds, cpu, lag = await _timed(load, one)
        finally:
            await endpoint.aclose()
    turns = [
        [
            Turn(
                "large",
                len(tokenize(render_chat(setup.traces.messages(g)))),
                setup.traces.tokens(g),
            )
        ]
        for g in range(load.generations)
    ]
    return Run("large alone", load, walls, seconds, sum(tokens), cpu, lag, up["engines"], turns)


async def serve_run(setup: Setup, load: Load) -> Run:
    """Streamed chat completions through ``relaygen serve``."""
    with upstreams(setup, ["large", "small"]) as up:
        port = free_port()
        command = serve_command(up["urls"], port, load.concurrency)
        limit = str(max(64, 2 * load.concurrency))
        env = {
            "RELAY_LARGE__MAX_CONCURRENCY": limit,
            "RELAY_SMALL__MAX_CONCURRENCY": limit,
            "RELAY_PROMPT_PATH": setup.prompt_path,
        }
        with (setup.logs / "serve.log").open("ab") as log:
            server = start_server(command, env, log)
            url = f"http://127.0.0.1:{port}"
            chats = aiohttp.ClientSession(
                url,
                connector=aiohttp.TCPConnector(limit=0),  # every generation at once
                timeout=aiohttp.ClientTimeout(sock_read=600),
            )
            try:
                async with httpx.AsyncClient(timeout=60) as client:
                    await wait_healthy(client, url, server)
                    await _chat(chats, setup.traces.messages(load.generations))
                    lag_before = await _loop_lag(client, url)
                    cpu_before = cpu_seconds(server.pid)

                    async def one(generation: int) -> int:
                        return await _chat(chats, setup.traces.messages(generation))

                    walls, tokens, seconds, _, _ = await _timed(load, one)
                    cpu = cpu_seconds(server.pid) - cpu_before
                    lag = _lag_since(lag_before, await _loop_lag(client, url))
            finally:
                await chats.close()
                stop_process(server)
    return Run("serve", load, walls, seconds, sum(tokens), cpu, lag, up["engines"])


def serve_command(urls: dict[str, str], port: int, concurrency: int) -> list[str]:
    return [
        str(Path(sys.executable).parent / "relaygen"),
        "serve",
        *("--large-url", urls["large"], "--large-model", "large"),
        *("--small-url", urls["small"], "--small-model", "small"),
        *("--cues", CUES, "--allow-model-mismatch", "--port", str(port)),
        *("--max-concurrent-generations", str(concurrency + 1)),
        *("--log-level", "warning"),
    ]


async def _chat(client: aiohttp.ClientSession, messages: list[dict[str, str]]) -> int:
    """One streamed chat completion to its end; the completion tokens of its usage. Read with
    aiohttp, as the relay reads its upstreams: httpx, as a load client, cost this process as
    much CPU a chunk as the server spent writing it, and on two cores that slowed the server's
    generations."""
    body = {
        "model": "large",
        "messages": messages,
        "max_tokens": BUDGET,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    tokens = 0
    async with client.post("/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for data in sse.events(response.content.iter_any()):
            if data.startswith(b"{") and b'"usage": {' in data:
                usage = json.loads(data).get("usage")
                tokens = usage["completion_tokens"] if usage else tokens
    return tokens


async def _loop_lag(client: httpx.AsyncClient, url: str) -> dict[float, float]:
    """The server's event-loop lag histogram: cumulative counts by bucket bound (ms)."""
    text = (await client.get(f"{url}/metrics")).text
    counts: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith("relay_event_loop_lag_seconds_bucket{"):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            counts[float(bound) * 1e3] = float(line.rsplit(" ", 1)[1])
    return counts


def _lag_since(before: dict[float, float], after: dict[float, float]) -> list[float]:
    """Readings between two histogram snapshots, each at its bucket's upper bound (ms)."""
    readings: list[float] = []
    below = 0.0
    for bound in sorted(after):
        count = after[bound] - before.get(bound, 0.0)
        readings += [bound] * round(count - below)
        below = count
    return readings
