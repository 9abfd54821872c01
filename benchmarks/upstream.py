"""The scripted vLLM as a benchmark's upstream, in a process of its own.

The capable scripted models (:func:`relay_integrations.testing.capable_model.capable_server`,
"large" and "small") stream in pure Python; run in the benchmark's own process they would share
its event loop with what it measures. So `start` runs them as
``python -m benchmarks.upstream`` and returns the base URL, `stop` ends the process::

    proc, url = start(token_delay=0.002, log=log_file)
    try:
        ...  # point the relay at url
    finally:
        stop(proc)

The models remember only their last `memory` prompts and requests (their cached-token figures
scan all they remember on every request: over thousands of requests an unbounded memory would
slow the upstream down as the run goes on).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys
from typing import IO

from relay_integrations.testing.capable_model import capable_server

MEMORY = 32
"""Prompts and requests each scripted model remembers."""


def serve(token_delay: float, memory: int = MEMORY) -> None:
    """Serve the capable models; print the base URL once listening; run until terminated."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the benchmark stops it (SIGTERM), also on ^C

    async def run() -> None:
        async with capable_server(token_delay=token_delay, memory=memory) as server:
            print(server.base_url, flush=True)
            await asyncio.Event().wait()

    asyncio.run(run())


def start(
    token_delay: float, log: IO[bytes], memory: int = MEMORY
) -> tuple[subprocess.Popen[bytes], str]:
    """Run the upstream in its own process; its process and base URL, once it listens (its
    stderr goes to `log`)."""
    command = [sys.executable, "-m", "benchmarks.upstream", "--token-delay", str(token_delay)]
    return launch([*command, "--memory", str(memory)], log)


def launch(command: list[str], log: IO[bytes]) -> tuple[subprocess.Popen[bytes], str]:
    """Run an upstream `command` that prints its base URL once it listens; its process and
    that URL (its stderr goes to `log`)."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log)
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="the capable scripted vLLM, for benchmarks")
    parser.add_argument("--token-delay", type=float, default=0.0, help="seconds per token")
    parser.add_argument("--memory", type=int, default=MEMORY, help="prompts each remembers")
    args = parser.parse_args(argv)
    serve(args.token_delay, args.memory)


if __name__ == "__main__":
    main()
