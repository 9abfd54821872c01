"""``python -m benchmarks health-probe [--calls N] [--rounds R]``: CPU per probe call."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

from benchmarks import upstream
from benchmarks.proc import cpu_seconds
from benchmarks.server_load.processes import free_port, server_command, start_server

BUDGET_MS = 1.0
"""What one probe call may cost the relay's event loop."""

VARIANTS = {  # name: (path, --health-cache-seconds)
    "/livez": ("/livez", "1"),
    "/readyz, cached 1 s": ("/readyz", "1"),
    "/readyz, no cache": ("/readyz", "0"),
}


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks health-probe",
        description="The relay server's CPU per /livez and /readyz call (docs/benchmarks.md).",
    )
    parser.add_argument("--calls", type=int, default=2000, help="calls per variant and round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over the variants")
    return parser.parse_args(argv)


@contextmanager
def relay_server(upstream_url: str, cache: str, log: Path) -> Iterator[tuple[int, str]]:
    """A ``relaygen serve`` over `upstream_url` with `cache`; its pid and URL once ready."""
    port = free_port()
    command = server_command(upstream_url, port, max_generations=8)
    with log.open("ab") as out:
        proc = start_server([*command, "--health-cache-seconds", cache], {}, out)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not _ready(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"relaygen serve did not start; see {log}")
            time.sleep(0.1)
        yield proc.pid, url
    finally:
        upstream.stop(proc)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def cpu_ms_per_call(client: httpx.Client, pid: int, url: str, calls: int) -> float:
    """The relay's CPU milliseconds per call of `url`, over `calls` calls."""
    for _ in range(50):  # warm: connections made, code paths run
        client.get(url)
    before = cpu_seconds(pid)
    for _ in range(calls):
        response = client.get(url)
        assert response.status_code == 200, response.text
    return (cpu_seconds(pid) - before) * 1000 / calls


def main(argv: Sequence[str]) -> int:
    args = parse(argv)
    figures: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as logs:
        log = Path(logs) / "health-probe.log"
        with log.open("ab") as out:
            upstream_proc, upstream_url = upstream.start(0.0, out)
        try:
            with (
                relay_server(upstream_url, "1", log) as cached,
                relay_server(upstream_url, "0", log) as uncached,
                httpx.Client(timeout=10) as client,
            ):
                servers = {"1": cached, "0": uncached}
                for round_ in range(1, args.rounds + 1):
                    print(f"round {round_} of {args.rounds}", file=sys.stderr, flush=True)
                    for name, (path, cache) in VARIANTS.items():
                        pid, url = servers[cache]
                        figures[name].append(cpu_ms_per_call(client, pid, url + path, args.calls))
        finally:
            upstream.stop(upstream_proc)
    print(f"relay server CPU per call, {args.calls} calls x {args.rounds} rounds (median, range)")
    worst = 0.0
    for name, values in figures.items():
        median = round(statistics.median(values), 3)  # judged as printed
        worst = max(worst, median)
        print(f"  {name:<20} {median:6.3f} ms  ({min(values):.3f}-{max(values):.3f})")
    verdict = "within" if worst < BUDGET_MS else "OVER"
    print(f"budget {BUDGET_MS:g} ms a call: {verdict}")
    return 0 if worst < BUDGET_MS else 1
