"""Load benchmark of ``relaygen serve``: many concurrent streams against a fast scripted upstream.

    .venv/bin/python scripts/bench_server_load.py                      # 200 streams x 3 rounds
    .venv/bin/python scripts/bench_server_load.py --concurrency 50 --json /tmp/load-50.json
    .venv/bin/python scripts/bench_server_load.py --token-delay 0.005 --rounds 5

A benchmark, not a test: it prints figures measured side by side in one run, and exits 1 only
when a response was wrong (an error, no finish chunk, no ``[DONE]``, empty content) or a
generation slot of the relay stayed taken. Three processes take part:

* the upstream: the scripted vLLM of the tests (``tests/fakes/capable_model.capable_server``,
  models "large" and "small", ``--token-delay`` seconds per token), in its own process (this
  script run with ``--upstream``), so that its pure-Python streaming does not share an event
  loop with the relay. It remembers only its last 32 prompts there (the fake scans all it has
  seen on every request, which would slow it down as the run goes on);
* the relay: the real CLI, ``relaygen serve ... --cues '["Therefore,", "Now"]'``, with
  ``RELAY_POLICY__COOLDOWN_TOKENS=0`` (2 switches per generation) and each endpoint's
  ``max_concurrency`` raised to the load (``--endpoint-concurrency``; the default 64 would queue
  the streams inside the relay);
* this process: httpx clients of at most 32 streams each that send the streams and parse the
  SSE themselves (``ClientShards``, as the relay's own upstream requests; one client holding
  200 kept-alive connections held a burst back by ~3 s in this process), and
  the in-process comparison (a ``RelaySwitcher`` running ``stream_chat``, no HTTP).

Per streamed request it records the client's total time and time to the first content or
reasoning text, and the final chunk's ``relay.seconds`` and ``relay.time_to_first_token`` (the
relay's own clock, which starts when the server calls the relay, prompt rendering included).
"Added latency" is the client's total minus ``relay.seconds`` of the same request: HTTP, SSE
framing and JSON, and waiting for a busy event loop. The same generations
run in-process (rounds alternate between the two paths), so the server's overhead shows both as
that difference and as the ratio of the two paths' total times. Memory is the relay process's
VmRSS (sampled every 50 ms during the server rounds) and VmHWM, from ``/proc/<pid>/status``;
a ``GET /metrics`` every 250 ms during the server rounds shows how far behind the relay's event
loop is. Also printed: the CPU time of the three processes during the server rounds, the
relay's ``relay_inflight_generations`` after the load (0 unless slots leaked), and the first
lines the relay logged at warning level or above.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import IO, Any

import httpx
import scripted_upstream
from scripted_upstream import cpu_seconds, stop

from relay_integrations.core import EndpointConfig, RelayConfig, RelaySwitcher, SwitchPolicy
from relay_integrations.core.chat import (
    ChatRequest,
    ChatResponse,
    ContentDelta,
    ReasoningDelta,
    stream_chat,
)
from relay_integrations.core.client_shards import DEFAULT_SHARD_SIZE, ClientShards
from relay_integrations.jobs.progress import Progress

CUES = ["Therefore,", "Now"]  # tests.fakes.capable_model.CAPABLE_CUES
EXPECTED_SWITCHES = 2  # the capable model's reasoning has one "Therefore," and one "Now"
SAMPLE_EVERY = 0.05  # seconds between VmRSS samples
CLIENT_SHARD = DEFAULT_SHARD_SIZE  # streams one of this process's httpx clients carries at once
KEEP_PROMPTS = 32  # prompts the fake upstream remembers for its cached-token figures


# --- processes ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def server_command(upstream: str, port: int, max_generations: int) -> list[str]:
    relaygen = Path(sys.executable).parent / "relaygen"
    return [
        str(relaygen),
        "serve",
        *("--large-url", upstream, "--large-model", "large"),
        *("--small-url", upstream, "--small-model", "small"),
        *("--cues", json.dumps(CUES)),
        *("--port", str(port)),
        *("--max-concurrent-generations", str(max_generations)),
        *("--log-level", "warning"),
    ]


def server_env(endpoint_concurrency: int) -> dict[str, str]:
    """What the relay reads beside its flags (inherited RELAY_* variables are dropped)."""
    return {
        "RELAY_POLICY__COOLDOWN_TOKENS": "0",
        "RELAY_LARGE__MAX_CONCURRENCY": str(endpoint_concurrency),
        "RELAY_SMALL__MAX_CONCURRENCY": str(endpoint_concurrency),
    }


def start_server(
    command: list[str], env: dict[str, str], log: IO[bytes]
) -> subprocess.Popen[bytes]:
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    return subprocess.Popen(command, env={**inherited, **env}, stdout=log, stderr=log)


async def wait_healthy(client: httpx.AsyncClient, url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"relaygen serve exited with {proc.returncode}")
        try:
            if (await client.get(f"{url}/health")).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.1)
    raise RuntimeError("relaygen serve did not answer /health with 200 within 60 s")


# --- /proc ----------------------------------------------------------------------------------


def memory_mb(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM of `pid`, in MB (MiB)."""
    fields: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def machine_busy_seconds() -> float:
    """CPU time all processes of the machine used so far (all cores; idle and iowait left out)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class RssSampler:
    """Samples a process's VmRSS every 50 ms while started; keeps the peak."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0.0
        self.samples = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._sample()

    def _sample(self) -> None:
        self.peak = max(self.peak, memory_mb(self.pid)["VmRSS"])
        self.samples += 1

    async def _run(self) -> None:
        while True:
            self._sample()
            await asyncio.sleep(SAMPLE_EVERY)


class MetricsProbe:
    """Times a ``GET /metrics`` every 250 ms while started: how long the server takes to answer
    a request that needs no upstream, i.e. how far behind its event loop is."""

    def __init__(self, client: httpx.AsyncClient, url: str) -> None:
        self.client = client
        self.url = f"{url}/metrics"
        self.seconds: list[float] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            started = time.perf_counter()
            await self.client.get(self.url)
            self.seconds.append(time.perf_counter() - started)
            await asyncio.sleep(0.25)


# --- one generation, two ways ---------------------------------------------------------------


@dataclass
class Sample:
    """One generation as its client saw it, and as the relay timed it."""

    total: float
    ttft: float | None = None  # to the first content or reasoning text
    relay_seconds: float | None = None
    relay_ttft: float | None = None
    switches: int | None = None
    tokens: int | None = None
    error: str | None = None

    @property
    def added(self) -> float | None:
        return None if self.relay_seconds is None else self.total - self.relay_seconds

    @property
    def ttft_added(self) -> float | None:
        if self.ttft is None or self.relay_ttft is None:
            return None
        return self.ttft - self.relay_ttft


def messages(i: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"What is {i % 90 + 10} * 7?"}]


async def via_server(client: httpx.AsyncClient, url: str, i: int) -> Sample:
    """One streamed chat completion through the relay server (raw SSE)."""
    body = {"model": "large", "messages": messages(i), "stream": True}
    started = time.perf_counter()
    first: float | None = None
    relay: dict[str, Any] | None = None
    finish, done, content, failure = None, False, 0, None
    connected = False  # a new TCP connection, not one kept alive from an earlier request

    async def trace(event: str, info: dict[str, Any]) -> None:
        nonlocal connected
        connected = connected or event.startswith("connection.connect_tcp")

    try:
        async with client.stream(
            "POST", f"{url}/v1/chat/completions", json=body, extensions={"trace": trace}
        ) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                return Sample(
                    time.perf_counter() - started,
                    error=f"HTTP {response.status_code}: {text[:200]}",
                )
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: ") :]
                if data == "[DONE]":
                    done = True
                    continue
                chunk = json.loads(data)
                if "error" in chunk:
                    failure = f"error event: {json.dumps(chunk['error'])[:200]}"
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    if first is None and (delta.get("content") or delta.get("reasoning")):
                        first = time.perf_counter() - started
                    content += len(delta.get("content") or "")
                    finish = choice.get("finish_reason") or finish
                relay = chunk.get("relay", relay)
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        on = "a new" if connected else "a kept-alive"
        failure = f"{type(exc).__name__} {str(exc)!r} on {on} connection"
    total = time.perf_counter() - started
    if failure is None:
        missing = [
            name
            for name, ok in (
                ("finish chunk", finish is not None),
                ("relay field", relay is not None),
                ("content", content > 0),
                ("[DONE]", done),
            )
            if not ok
        ]
        failure = f"incomplete stream: no {', no '.join(missing)}" if missing else None
    sample = Sample(total, first, error=failure)
    if relay is not None:
        sample.relay_seconds = relay.get("seconds")
        sample.relay_ttft = relay.get("time_to_first_token")
        sample.switches = relay.get("switches")
        usage = relay.get("usage") or {}
        sample.tokens = sum(u.get("completion_tokens", 0) for u in usage.values())
    return sample


async def via_core(switcher: RelaySwitcher, i: int) -> Sample:
    """The same generation with the in-process core (``stream_chat``, as the server runs it)."""
    started = time.perf_counter()
    first: float | None = None
    response: ChatResponse | None = None
    try:
        request = ChatRequest(messages(i), sampling=switcher.config.sampling)
        async for event in stream_chat(switcher, request):
            if isinstance(event, ReasoningDelta | ContentDelta):
                if first is None and event.text:
                    first = time.perf_counter() - started
            elif isinstance(event, ChatResponse):
                response = event
    except Exception as exc:
        return Sample(time.perf_counter() - started, error=f"{type(exc).__name__}: {exc}")
    total = time.perf_counter() - started
    if response is None or not response.content:
        return Sample(total, first, error="no response or empty content")
    stats = response.result.stats
    return Sample(
        total,
        first,
        relay_seconds=stats.total_seconds,
        relay_ttft=stats.time_to_first_token,
        switches=stats.switches,
        tokens=response.result.completion_tokens,
    )


# --- figures --------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile, linearly interpolated between the closest ranks."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary(values: Sequence[float | None]) -> dict[str, float]:
    present = [v for v in values if v is not None]
    return {
        "n": len(present),
        "p50": percentile(present, 50),
        "p99": percentile(present, 99),
        "max": max(present) if present else float("nan"),
        "mean": sum(present) / len(present) if present else float("nan"),
    }


def path_figures(samples: list[Sample]) -> dict[str, Any]:
    ok = [s for s in samples if s.error is None]
    return {
        "total": summary([s.total for s in ok]),
        "ttft": summary([s.ttft for s in ok]),
        "relay_seconds": summary([s.relay_seconds for s in ok]),
        "relay_ttft": summary([s.relay_ttft for s in ok]),
        "added": summary([s.added for s in ok]),
        "ttft_added": summary([s.ttft_added for s in ok]),
        "switches": dict(Counter(s.switches for s in ok)),
        "mean_tokens": summary([s.tokens for s in ok])["mean"],
        "errors": len(samples) - len(ok),
    }


def ms(value: float) -> str:
    return f"{value * 1000:9.1f}"


# --- the run --------------------------------------------------------------------------------


async def timed(
    n: int, one: Callable[[int], Awaitable[Sample]], bar: Progress
) -> tuple[list[Sample], float]:
    """`n` generations started at once; their samples and the wall time of the whole batch."""

    async def run(i: int) -> Sample:
        sample = await one(i)
        bar.advance()
        return sample

    started = time.perf_counter()
    samples = await asyncio.gather(*(run(i) for i in range(n)))
    return list(samples), time.perf_counter() - started


async def sequential(
    n: int, one: Callable[[int], Awaitable[Sample]], warmup: int = 3
) -> list[Sample]:
    for i in range(warmup):
        await one(i)
    return [await one(i) for i in range(n)]


class StreamClient(httpx.AsyncClient):
    """An httpx client that `ClientShards` can close (it calls ``close()``, as on openai's)."""

    async def close(self) -> None:
        await self.aclose()


async def benchmark(
    args: argparse.Namespace,
    url: str,
    upstream: str,
    server: subprocess.Popen[bytes],
    upstream_pid: int,
) -> dict[str, Any]:
    n = args.concurrency
    limits = httpx.Limits(
        max_connections=CLIENT_SHARD + 1,
        max_keepalive_connections=CLIENT_SHARD + 1,
        keepalive_expiry=args.keepalive_expiry,
    )
    timeout = httpx.Timeout(args.timeout)
    # The streams go through clients of at most CLIENT_SHARD requests each, as the relay's own
    # upstream requests do: one httpx client holding 200 kept-alive connections probes every
    # idle one for each request it places, which held a burst back by ~3 s in this process.
    streams = ClientShards(lambda: StreamClient(limits=limits, timeout=timeout), CLIENT_SHARD)
    async with (
        httpx.AsyncClient(limits=limits, timeout=timeout) as client,
        httpx.AsyncClient(timeout=timeout) as probe_client,
    ):
        await wait_healthy(client, url, server)
        await asyncio.sleep(0.5)
        idle = memory_mb(server.pid)

        config = RelayConfig(
            large=EndpointConfig(
                base_url=upstream, model="large", max_concurrency=args.endpoint_concurrency
            ),
            small=EndpointConfig(
                base_url=upstream, model="small", max_concurrency=args.endpoint_concurrency
            ),
            cues=CUES,
            policy=SwitchPolicy(cooldown_tokens=0),
        )
        async with RelaySwitcher(config) as switcher:

            async def http_one(i: int) -> Sample:
                async with streams.lease() as leased:
                    return await via_server(leased, url, i)

            async def core_one(i: int) -> Sample:
                return await via_core(switcher, i)

            print(f"single requests: {args.sequential} sequential each way ...", file=sys.stderr)
            single_server = await sequential(args.sequential, http_one)
            single_core = await sequential(args.sequential, core_one)
            after_warmup = memory_mb(server.pid)

            sampler = RssSampler(server.pid)
            probe = MetricsProbe(probe_client, url)
            loaded: dict[str, list[Sample]] = {"server": [], "core": []}
            walls: dict[str, list[float]] = {"server": [], "core": []}
            cpu = {"relay": 0.0, "upstream": 0.0, "client": 0.0, "machine": 0.0}
            rss_after_round: list[float] = []
            total = args.rounds * n
            with Progress("server", total) as server_bar, Progress("core  ", total) as core_bar:
                for r in range(args.rounds):
                    order = ("server", "core") if r % 2 == 0 else ("core", "server")
                    for path in order:
                        if path == "server":
                            before = (
                                cpu_seconds(server.pid),
                                cpu_seconds(upstream_pid),
                                time.process_time(),
                                machine_busy_seconds(),
                            )
                            sampler.start()
                            probe.start()
                            samples, wall = await timed(n, http_one, server_bar)
                            await probe.stop()
                            await sampler.stop()
                            cpu["relay"] += cpu_seconds(server.pid) - before[0]
                            cpu["upstream"] += cpu_seconds(upstream_pid) - before[1]
                            cpu["client"] += time.process_time() - before[2]
                            cpu["machine"] += machine_busy_seconds() - before[3]
                            rss_after_round.append(memory_mb(server.pid)["VmRSS"])
                        else:
                            samples, wall = await timed(n, core_one, core_bar)
                        loaded[path] += samples
                        walls[path].append(wall)
                        await asyncio.sleep(0.5)

        await asyncio.sleep(1.0)
        after_load = memory_mb(server.pid)
        metrics = (await client.get(f"{url}/metrics")).text
        await streams.aclose()
    inflight = next(
        (
            float(line.split()[-1])
            for line in metrics.splitlines()
            if line.startswith("relay_inflight_generations ")
        ),
        float("nan"),
    )
    server_wall = sum(walls["server"])
    return {
        "single": {
            "server": path_figures(single_server),
            "core": path_figures(single_core),
            "errors": [s.error for s in single_server + single_core if s.error],
        },
        "load": {
            "server": path_figures(loaded["server"]),
            "core": path_figures(loaded["core"]),
            "wall_seconds": walls,
            "generations_per_second": {
                path: len(loaded[path]) / sum(walls[path]) for path in ("server", "core")
            },
        },
        "memory_mb": {
            "idle": idle["VmRSS"],
            "after_single_requests": after_warmup["VmRSS"],
            "peak_rss_sampled": sampler.peak,
            "rss_samples": sampler.samples,
            "hwm_at_end": after_load["VmHWM"],
            "after_each_server_round": rss_after_round,
            "after_load_1s": after_load["VmRSS"],
            "peak_above_idle_per_stream": (sampler.peak - idle["VmRSS"]) / n,
        },
        "cpu_during_server_rounds": {
            "wall_seconds": server_wall,
            "seconds": cpu,
            "utilisation": {k: v / server_wall for k, v in cpu.items()},
            "relay_ms_per_generation": 1000 * cpu["relay"] / max(len(loaded["server"]), 1),
            "other_processes_cores": (
                cpu["machine"] - cpu["relay"] - cpu["upstream"] - cpu["client"]
            )
            / server_wall,
        },
        "metrics_probe_seconds": summary(probe.seconds),
        "relay_inflight_after_load": inflight,
        "errors": [s.error for s in loaded["server"] + loaded["core"] if s.error],
        "samples": {path: [asdict(s) for s in loaded[path]] for path in ("server", "core")},
    }


def report(figures: dict[str, Any], facts: dict[str, Any], args: argparse.Namespace) -> None:
    n, rounds = args.concurrency, args.rounds
    print(f"machine   {facts['cpus']} CPUs, {facts['platform']}, Python {facts['python']}")
    print(f"load avg  {facts['loadavg_before']} (before)  {facts['loadavg_after']} (after)")
    print(f"command   {facts['command']}")
    print(f"relay     {facts['relay_env']} {facts['relay_command']}")
    print(f"upstream  scripted capable model, {args.token_delay} s/token, own process\n")

    single = figures["single"]
    print(f"Single request, nothing else running (p50 of {args.sequential} sequential)")
    print(f"  {'':28}{'total ms':>9}{'ttft ms':>9}{'relay s':>9}{'added':>9}")
    for path, label in (("server", "server (HTTP)"), ("core", "in-process core")):
        f = single[path]
        print(
            f"  {label:28}{ms(f['total']['p50'])}{ms(f['ttft']['p50'])}"
            f"{ms(f['relay_seconds']['p50'])}{ms(f['added']['p50'])}"
        )
    diff = single["server"]["total"]["p50"] - single["core"]["total"]["p50"]
    print(f"  {'server - core':28}{ms(diff)}\n")

    load = figures["load"]
    print(f"Load: {n} concurrent streams x {rounds} rounds ({n * rounds} generations per path)")
    print(f"  {'ms':38}{'p50':>9}{'p99':>9}{'max':>9}")
    rows = (
        ("server", "total", "server: client total"),
        ("server", "relay_seconds", "server: relay seconds"),
        ("server", "added", "server: added (total - seconds)"),
        ("server", "ttft", "server: client TTFT"),
        ("server", "relay_ttft", "server: relay TTFT"),
        ("server", "ttft_added", "server: TTFT added"),
        ("core", "total", "core: total"),
        ("core", "relay_seconds", "core: relay seconds"),
        ("core", "added", "core: total - seconds"),
        ("core", "ttft", "core: TTFT"),
    )
    for path, key, label in rows:
        f = load[path][key]
        print(f"  {label:38}{ms(f['p50'])}{ms(f['p99'])}{ms(f['max'])}")
    s, c = load["server"]["total"], load["core"]["total"]
    print(f"  {'server/core total (ratio)':38}{s['p50'] / c['p50']:9.2f}{s['p99'] / c['p99']:9.2f}")
    rate = load["generations_per_second"]
    print(f"  generations/s: server {rate['server']:.1f}, core {rate['core']:.1f}")
    print(
        f"  switches per generation: server {load['server']['switches']}, core "
        f"{load['core']['switches']}; tokens/generation {load['server']['mean_tokens']:.0f}\n"
    )

    mem = figures["memory_mb"]
    print("Memory of the relay server process (MB)")
    print(f"  idle after startup VmRSS        {mem['idle']:8.1f}")
    print(f"  after the single requests       {mem['after_single_requests']:8.1f}")
    print(
        f"  peak VmRSS during load          {mem['peak_rss_sampled']:8.1f}  ({mem['rss_samples']} samples)"
    )
    print(f"  VmHWM at end                    {mem['hwm_at_end']:8.1f}")
    print(f"  per concurrent stream above idle{mem['peak_above_idle_per_stream']:8.3f}")
    rounds_rss = ", ".join(f"{v:.1f}" for v in mem["after_each_server_round"])
    print(f"  VmRSS after each server round   {rounds_rss}")
    print(f"  VmRSS 1 s after the load        {mem['after_load_1s']:8.1f}\n")

    cpu = figures["cpu_during_server_rounds"]
    use = cpu["utilisation"]
    print(
        f"CPU during the server rounds ({cpu['wall_seconds']:.1f} s): relay {use['relay']:.0%}, "
        f"upstream {use['upstream']:.0%}, this client {use['client']:.0%} of one core; "
        f"relay {cpu['relay_ms_per_generation']:.1f} ms CPU per generation; the machine's "
        f"other processes used {cpu['other_processes_cores']:.2f} of its "
        f"{os.cpu_count()} cores meanwhile"
    )
    lag = figures["metrics_probe_seconds"]
    print(
        f"GET /metrics during the server rounds ({lag['n']} probes): p50 {lag['p50'] * 1000:.0f} "
        f"ms, max {lag['max'] * 1000:.0f} ms (how far behind the relay's event loop is)"
    )
    print(f"relay_inflight_generations after the load: {figures['relay_inflight_after_load']:g}")
    errors = figures["errors"] + figures["single"]["errors"]
    print(f"errors: {len(errors)}")
    for message, count in Counter(errors).most_common(10):
        print(f"  {count} x {message}")


def machine_facts(args: argparse.Namespace) -> dict[str, Any]:
    versions = {p: metadata.version(p) for p in ("httpx", "starlette", "uvicorn", "openai")}
    return {
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": versions,
        "loadavg_before": Path("/proc/loadavg").read_text().split()[:3],
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, default=200, help="streams at once (200)")
    parser.add_argument("--rounds", type=int, default=3, help="load rounds per path (3)")
    parser.add_argument("--token-delay", type=float, default=0.002, help="upstream s/token")
    parser.add_argument("--sequential", type=int, default=20, help="single requests each way")
    parser.add_argument(
        "--endpoint-concurrency",
        type=int,
        help="the relay's max_concurrency per endpoint (default: --concurrency)",
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="client timeout, seconds")
    parser.add_argument(
        "--keepalive-expiry",
        type=float,
        default=5.0,
        help="seconds the client keeps an idle connection (httpx's default, 5; uvicorn closes "
        "one idle for 5 s)",
    )
    parser.add_argument("--json", type=Path, help="write all figures and samples here")
    parser.add_argument("--upstream", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.endpoint_concurrency is None:
        args.endpoint_concurrency = args.concurrency
    return args


def main() -> int:
    args = parse_args()
    if args.upstream:
        scripted_upstream.serve(args.token_delay, KEEP_PROMPTS)
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the children are stopped
    facts = machine_facts(args)
    with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp:
        relay_log = Path(tmp, "relay.log")
        with Path(tmp, "upstream.log").open("wb") as upstream_log, relay_log.open("wb") as log:
            figures = run(args, facts, upstream_log, log, relay_log)
    failed = (
        figures["errors"]
        or figures["single"]["errors"]
        or figures["relay_inflight_after_load"] != 0
    )
    return 1 if failed else 0


def run(
    args: argparse.Namespace,
    facts: dict[str, Any],
    upstream_log: IO[bytes],
    log: IO[bytes],
    relay_log: Path,
) -> dict[str, Any]:
    """Start both processes, measure, report; the processes are stopped whatever happens."""
    upstream_proc: subprocess.Popen[bytes] | None = None
    server: subprocess.Popen[bytes] | None = None
    try:
        upstream_proc, upstream = scripted_upstream.start(
            [__file__, "--upstream", "--token-delay", str(args.token_delay)], upstream_log
        )
        port = free_port()
        command = server_command(upstream, port, max(1000, args.concurrency))
        env = server_env(args.endpoint_concurrency)
        facts["relay_command"] = shlex.join(command)
        facts["relay_env"] = " ".join(f"{k}={v}" for k, v in env.items())
        server = start_server(command, env, log)
        url = f"http://127.0.0.1:{port}"
        figures = asyncio.run(benchmark(args, url, upstream, server, upstream_proc.pid))
        facts["loadavg_after"] = Path("/proc/loadavg").read_text().split()[:3]
        report(figures, facts, args)
    except Exception:
        log.flush()
        tail = relay_log.read_text(errors="replace").splitlines()[-20:]
        print("relay log (last lines):", *tail, sep="\n  ", file=sys.stderr)
        raise
    finally:
        stop(server)
        stop(upstream_proc)
    log.flush()
    lines = relay_log.read_text(errors="replace").splitlines()
    figures["relay_log_lines"] = len(lines)
    if lines:
        print(f"relay log: {len(lines)} lines at warning and above; the first ones:")
        for line in lines[:5]:
            print(f"  {line[:300]}")
    if args.json:
        record = {"facts": facts, "args": {**vars(args), "json": str(args.json)}, **figures}
        args.json.write_text(json.dumps(record, indent=1))
        print(f"figures written to {args.json}")
    return figures


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted; the upstream and the relay were stopped", file=sys.stderr)
        sys.exit(130)
