"""The processes the benchmark runs: the scripted upstream (:mod:`benchmarks.upstream`)
and ``relaygen serve`` over it, started together and stopped whatever happens::

    with running(settings, Path(tmp)) as processes:
        ...  # requests to processes.relay_url
    relay_log_lines(Path(tmp))  # what the relay logged at warning level and above

or, for ``--workers 1,2,4``, one upstream and a ``relaygen serve --workers N`` for each N::

    with running_side_by_side(settings, Path(tmp)) as (upstream_proc, relays):
        ...  # requests to relays[0].url
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx

from .. import upstream
from .settings import Settings

CUES = upstream.CUES  # ["Therefore,", "Now"]: the relay switches twice a generation
RELAY_LOG = "relay.log"
UPSTREAM_LOG = "upstream.log"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def server_command(
    upstream_url: str, port: int, max_generations: int, workers: int = 1, log_level: str = "warning"
) -> list[str]:
    relaygen = Path(sys.executable).parent / "relaygen"
    return [
        str(relaygen),
        "serve",
        *("--large-url", upstream_url, "--large-model", "large"),
        *("--small-url", upstream_url, "--small-model", "small"),
        *("--cues", json.dumps(CUES)),
        *("--port", str(port)),
        *("--max-concurrent-generations", str(max_generations)),
        *(("--workers", str(workers)) if workers > 1 else ()),
        *("--log-level", log_level),
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


@dataclass
class Processes:
    """The running upstream and relay."""

    upstream: subprocess.Popen[bytes]
    upstream_url: str
    relay: subprocess.Popen[bytes]
    relay_url: str
    relay_command: list[str]
    relay_env: dict[str, str]

    @property
    def relay_command_line(self) -> str:
        """The relay's environment (what the benchmark sets) and command, as a shell line."""
        env = " ".join(f"{k}={v}" for k, v in self.relay_env.items())
        return f"{env} {shlex.join(self.relay_command)}"


@contextmanager
def running(settings: Settings, logs: Path) -> Iterator[Processes]:
    """The upstream and the relay, running (their output goes to files in `logs`); both are
    stopped whatever happens, and on an error the relay log's last lines are printed."""
    relay_log = logs / RELAY_LOG
    with (logs / UPSTREAM_LOG).open("wb") as upstream_log, relay_log.open("wb") as log:
        upstream_proc: subprocess.Popen[bytes] | None = None
        relay: subprocess.Popen[bytes] | None = None
        try:
            upstream_proc, upstream_url = upstream.start(settings.token_delay, upstream_log)
            port = free_port()
            command = server_command(upstream_url, port, max(1000, settings.concurrency))
            env = server_env(settings.endpoint_concurrency)
            relay = start_server(command, env, log)
            url = f"http://127.0.0.1:{port}"
            yield Processes(upstream_proc, upstream_url, relay, url, command, env)
        except Exception:
            log.flush()
            tail = relay_log.read_text(errors="replace").splitlines()[-20:]
            print("relay log (last lines):", *tail, sep="\n  ", file=sys.stderr)
            raise
        finally:
            upstream.stop(relay)
            upstream.stop(upstream_proc)


def relay_log_lines(logs: Path) -> list[str]:
    """What the relay of `running` logged (at warning level and above)."""
    return (logs / RELAY_LOG).read_text(errors="replace").splitlines()


@dataclass
class Relay:
    """One ``relaygen serve --workers N`` of a side-by-side run, logging at info level to
    `log` (so that the benchmark sees when every worker serves)."""

    workers: int
    process: subprocess.Popen[bytes]
    url: str
    command: list[str]
    log: Path

    def records(self) -> list[dict[str, Any]]:
        """The JSON records it has logged so far."""
        lines = self.log.read_text(errors="replace").splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]

    def warnings(self) -> list[str]:
        """What it logged at warning level and above, and any line that is not a record (a
        traceback, say)."""
        lines = self.log.read_text(errors="replace").splitlines()
        return [
            line
            for line in lines
            if not line.startswith("{") or json.loads(line)["level"] not in ("debug", "info")
        ]

    async def wait_serving(self, client: httpx.AsyncClient) -> None:
        """Until every worker serves: /health answers once one does, so with several the
        supervisor's "serving" record is waited for too."""
        await wait_healthy(client, self.url, self.process)
        deadline = time.monotonic() + 60
        while self.workers > 1 and not any(r["msg"] == "serving" for r in self.records()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the {self.workers} workers did not all serve within 60 s")
            await asyncio.sleep(0.1)


@contextmanager
def running_side_by_side(
    settings: Settings, logs: Path
) -> Iterator[tuple[subprocess.Popen[bytes], list[Relay]]]:
    """The upstream and one relay per worker count of `settings.workers`, running; all are
    stopped whatever happens."""
    assert settings.workers, "worker counts to compare"
    with ExitStack() as stack:
        upstream_log = stack.enter_context((logs / UPSTREAM_LOG).open("wb"))
        upstream_proc, upstream_url = upstream.start(settings.token_delay, upstream_log)
        stack.callback(upstream.stop, upstream_proc)
        relays = []
        env = server_env(settings.endpoint_concurrency)
        for workers in settings.workers:
            port, log = free_port(), logs / f"relay-{workers}-workers.log"
            command = server_command(
                upstream_url, port, max(1000, settings.concurrency), workers, log_level="info"
            )
            process = start_server(command, env, stack.enter_context(log.open("wb")))
            stack.callback(upstream.stop, process)
            relays.append(Relay(workers, process, f"http://127.0.0.1:{port}", command, log))
        yield upstream_proc, relays
