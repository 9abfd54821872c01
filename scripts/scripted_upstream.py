"""The scripted vLLM of the tests as a benchmark's upstream, in a process of its own.

The benchmark scripts run themselves with a hidden flag that calls `serve`
(``bench_switcher.py --serve-fake``, ``bench_server_load.py --upstream``), so that the fake's
pure-Python streaming does not share an event loop with what they measure; `start` launches
that process and returns its base URL, `stop` ends it, `cpu_seconds` reads its CPU time.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[1]


class Bounded(list[Any]):
    """A list that keeps only its last `size` items.

    The scripted model remembers every prompt (and request) to compute cached tokens, and scans
    them all on each request: over thousands of requests the upstream would slow down as the
    run goes on. Keeping the last few keeps it equally fast from the first round to the last.
    """

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def append(self, item: Any) -> None:
        super().append(item)
        if len(self) > self.size:
            del self[0]


def serve(token_delay: float, keep: int) -> None:
    """Serve the capable scripted models (``tests.fakes.capable_model.capable_server``, models
    "large" and "small", `token_delay` seconds per token); print the base URL; run until
    terminated.

    One thing is changed from outside, not in the fake: its memories of prompts, requests and
    headers keep only the last `keep` items (see `Bounded`).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the benchmark stops it (SIGTERM), also on ^C
    sys.path.insert(0, str(REPO))
    from tests.fakes.capable_model import capable_server

    async def run() -> None:
        server = capable_server(token_delay=token_delay)
        for model in server.models.values():
            model._seen_prompts = Bounded(keep)
            model.requests = Bounded(keep)
            model.headers = Bounded(keep)
        async with server:
            print(server.base_url, flush=True)
            await asyncio.Event().wait()

    asyncio.run(run())


def start(script: Sequence[str], log: IO[bytes]) -> tuple[subprocess.Popen[bytes], str]:
    """Run ``python *script`` (a script that calls `serve`); its process and base URL.

    Returns once the upstream listens (it prints its URL then); its stderr goes to `log`.
    """
    proc = subprocess.Popen([sys.executable, *script], stdout=subprocess.PIPE, stderr=log)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode().strip()  # the base URL, once it listens
    if not line.startswith("http"):
        proc.wait(timeout=10)
        raise RuntimeError(f"the scripted upstream did not start (exit {proc.returncode})")
    return proc, line


def stop(proc: subprocess.Popen[bytes] | None, grace: float = 20) -> None:
    """Terminate `proc` (if it still runs), killing it if it has not exited after `grace` s."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of `pid` so far."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
