"""The generations: each context length, each prompt path, and the large model alone::

    async with Runs(servers) as runs:
        measured = await runs.run(lengths=[1024, 4096], generations=3, problems=problems)
        measured.generations, measured.costs  # the generations; what single requests cost

For each length the prompt is sized, then one untimed generation of each column warms the
servers' prefix caches (the prompt is the same every generation) and compiles the forcing's
grammars; then each round runs "text" and "tokens" (the order flipping round by round, so
that drift hits both alike) and the large model alone. Each generation is metered on its own:
each API server's CPU time (``/proc/<pid>/stat``, its EngineCore child left out) and the
requests and request bytes each server counted (vLLM's ``/metrics``, every route:
``/tokenize`` and ``/detokenize`` too), read before and after it. Last, at each length, what
one request of each kind costs the large API server (:mod:`.probes`).
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.proc import cpu_seconds
from relay_integrations.relay import (
    EndpointConfig,
    ModelRole,
    RelayConfig,
    RelaySwitcher,
    SamplingConfig,
)
from relay_integrations.testing import forced, forcing

from .context import CUES, SWITCHES, TRACE, sized_messages
from .figures import ALONE, PATHS, Generation, Measured
from .probes import request_costs
from .servers import Server

MAX_TOKENS = 1024  # the trace is ~130 canonical tokens; the regex lets the model spell it in more

_STARTED = time.monotonic()


def log(message: str) -> None:
    print(f"[{time.monotonic() - _STARTED:6.0f}s] {message}", file=sys.stderr, flush=True)


def relay_config(servers: Mapping[ModelRole, Server], path: str) -> RelayConfig:
    def endpoint(role: ModelRole) -> EndpointConfig:
        return EndpointConfig(base_url=servers[role].url, model=servers[role].model)

    return RelayConfig(
        large=endpoint("large"),
        small=endpoint("small"),
        cues=CUES,
        sampling=SamplingConfig(max_tokens=MAX_TOKENS),
        prompt_path=path,
    )


class Counted:
    """What the servers have counted so far: requests by route, and request bytes."""

    def __init__(self, http: httpx.AsyncClient, servers: Mapping[ModelRole, Server]) -> None:
        self.http = http
        self.servers = servers

    async def read(self) -> dict[ModelRole, tuple[Counter[str], int]]:
        """Each server's requests by route and its requests' body bytes so far (``/metrics``
        itself is not counted)."""
        counted = {}
        for role, server in self.servers.items():
            response = await self.http.get(server.root + "/metrics")
            response.raise_for_status()
            routes: Counter[str] = Counter()
            sent = 0
            for family in text_string_to_metric_families(response.text):
                for sample in family.samples:
                    if sample.name == "http_requests_total":
                        routes[sample.labels["handler"]] += int(sample.value)
                    elif sample.name == "http_request_size_bytes_sum":
                        sent += int(sample.value)
            counted[role] = (routes, sent)
        return counted


class Runs:
    """The relays of both paths over the two servers (each reused by every generation, as
    in production), and the meters."""

    def __init__(self, servers: Mapping[ModelRole, Server]) -> None:
        self.servers = servers
        self.relays = {path: RelaySwitcher(relay_config(servers, path)) for path in PATHS}
        self.http = httpx.AsyncClient(timeout=600)
        self.counted = Counted(self.http, servers)

    async def __aenter__(self) -> Runs:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for relay in self.relays.values():
            await relay.aclose()
        await self.http.aclose()

    async def write(self, path: str, messages: list[dict[str, Any]]) -> tuple[str, int]:
        """One generation of column `path`: its text and switches."""
        if path == ALONE:
            return await self.alone(messages), 0
        result = await forced(self.relays[path], TRACE).generate(messages)
        return result.text, result.stats.switches

    async def alone(self, messages: list[dict[str, Any]]) -> str:
        """The large model writing the trace in one chat completion, forced as the relay's
        requests are."""
        large = self.servers["large"]
        body = {
            "model": large.model,
            "messages": messages,
            "max_tokens": MAX_TOKENS,
            **forcing(TRACE)("large", "reasoning", ""),
        }
        response = await self.http.post(large.url + "/chat/completions", json=body)
        response.raise_for_status()
        text: str = response.json()["choices"][0]["message"]["content"]
        return text

    async def measure(
        self, context: int, prompt_tokens: int, path: str, messages: list[dict[str, Any]]
    ) -> Generation:
        before = await self.counted.read()
        cpu = {role: cpu_seconds(s.api_pid) for role, s in self.servers.items()}
        started = time.perf_counter()
        text, switches = await self.write(path, messages)
        wall = time.perf_counter() - started
        cpu = {role: cpu_seconds(s.api_pid) - cpu[role] for role, s in self.servers.items()}
        after = await self.counted.read()
        routes = {role: after[role][0] - before[role][0] for role in self.servers}
        gen = Generation(
            context=context,
            prompt_tokens=prompt_tokens,
            path=path,
            wall=wall,
            switches=switches,
            api_cpu=cpu,
            requests={role: routes[role].total() for role in self.servers},
            request_bytes={role: after[role][1] - before[role][1] for role in self.servers},
            routes=dict(sum(routes.values(), Counter[str]())),
            text_ok=text == TRACE,
        )
        per_switch = (
            ""
            if not switches
            else ", API CPU a switch "
            + ", ".join(f"{role} {1000 * gen.cpu_per_switch(role):.1f} ms" for role in self.servers)
        )
        log(
            f"{context:>6} {path:6} {wall:6.2f} s, {switches} switches, "
            f"{sum(gen.requests.values())} requests, {sum(gen.request_bytes.values()) / 1024:.0f}"
            f" KiB sent{per_switch}" + ("" if gen.text_ok else "  (text differs from the trace)")
        )
        if path != ALONE and switches != SWITCHES:
            log(f"  expected {SWITCHES} switches: the cues did not fire as planned")
        return gen

    async def run(self, lengths: Sequence[int], generations: int, problems: list[str]) -> Measured:
        measured = Measured()
        for context in lengths:
            messages, prompt_tokens = await sized_messages(
                self.http, self.servers["large"], problems, context
            )
            log(f"context {context}: prompt of {prompt_tokens} tokens; warming up")
            for path in (*PATHS, ALONE):
                await self.write(path, messages)
            for round_ in range(generations):
                paths = PATHS if round_ % 2 == 0 else PATHS[::-1]
                for path in (*paths, ALONE):
                    gen = await self.measure(context, prompt_tokens, path, messages)
                    measured.generations.append(gen)
            costs = await request_costs(self.http, self.servers["large"], messages, context)
            log(
                f"{context:>6} one request: "
                + ", ".join(f"{c.kind} {1000 * c.api_cpu:.1f} ms" for c in costs)
            )
            measured.costs += costs
        return measured
