"""Progress output, and what others did on the shared machine and servers meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence

import httpx

from benchmarks.machine import REPO
from benchmarks.proc import machine_busy_seconds, process_groups_seconds
from relay_integrations.upstream.config import ModelRole

from .servers import Server

_STARTED = time.monotonic()
SETTLE_PAUSE = 0.5  # seconds between reads of a counter that is settling
SETTLE_TRIES = 20


def log(message: str) -> None:
    print(f"[{time.monotonic() - _STARTED:6.0f}s] {message}", file=sys.stderr, flush=True)


class CpuMeter:
    """CPU time other processes took while we measured (the machine is shared).

    ``foreign`` = all busy CPU time (``/proc/stat``) minus the two test servers' process groups
    (pids in ``.cache/run/``) and this process: pytest runs, other benchmarks, r1-tiny.
    """

    def __init__(self, names: Sequence[str] = ("qwen3-large", "qwen3-small")) -> None:
        self.groups: set[int] = set()
        for name in names:
            with contextlib.suppress(OSError, ValueError):
                self.groups.add(int((REPO / ".cache" / "run" / f"{name}.pid").read_text()))

    def _snapshot(self) -> tuple[float, float, float]:
        busy = machine_busy_seconds()
        servers, own = process_groups_seconds(self.groups)
        return busy, servers, own

    def start(self) -> tuple[float, float, float]:
        return self._snapshot()

    def foreign(self, since: tuple[float, float, float]) -> float:
        """Seconds of CPU that others used since `since`."""
        busy, servers, own = self._snapshot()
        return max(0.0, (busy - since[0]) - (servers - since[1]) - (own - since[2]))


class ServerMeter:
    """Requests and tokens the two servers served for others while we measured.

    Other clients (a test run, another benchmark) may use the same servers meanwhile (vLLM then
    batches their requests with ours). From ``/metrics``: finished requests and generated
    tokens, minus our own.
    """

    def __init__(self, servers: Mapping[ModelRole, Server], http: httpx.AsyncClient) -> None:
        self.servers = servers
        self.http = http

    async def snapshot(self) -> dict[str, tuple[float, float]]:
        out: dict[str, tuple[float, float]] = {}
        for role, server in self.servers.items():
            text = (await self.http.get(server.root + "/metrics")).text
            requests = tokens = 0.0
            for line in text.splitlines():
                if f'model_name="{server.model}"' not in line:
                    continue
                if line.startswith("vllm:request_success_total{"):
                    requests += float(line.rsplit(" ", 1)[1])
                elif line.startswith("vllm:generation_tokens_total{"):
                    tokens += float(line.rsplit(" ", 1)[1])
            out[role] = (requests, tokens)
        return out

    async def settled(self) -> dict[str, tuple[float, float]]:
        """`snapshot` once vLLM's counters have stopped moving (they update late: a request
        the client closed goes on until the abort reaches the engine)."""
        now = await self.snapshot()
        for _ in range(SETTLE_TRIES):
            await asyncio.sleep(SETTLE_PAUSE)
            again = await self.snapshot()
            if again == now:
                break
            now = again
        return now

    async def settled_counts(self, role: ModelRole) -> tuple[float, float]:
        """One server's (finished requests, generated tokens), settled (see `settled`)."""
        return (await self.settled())[role]

    async def foreign(
        self, since: dict[str, tuple[float, float]], requests: Counter[str], tokens: Counter[str]
    ) -> tuple[int, int]:
        """(requests, tokens) the servers finished or wrote for others since `since`."""
        now = await self.snapshot()
        others = [
            (now[r][0] - since[r][0] - requests[r], now[r][1] - since[r][1] - tokens[r])
            for r in self.servers
        ]
        return round(sum(max(0.0, a) for a, _ in others)), round(
            sum(max(0.0, b) for _, b in others)
        )


SENT: Counter[str] = Counter()  # requests timed() sent, by model role
WRITTEN: Counter[str] = Counter()  # their completion tokens
