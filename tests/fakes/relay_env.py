"""The environment of a ``relaygen serve`` process over a scripted upstream, the reading of
its JSON log lines while it runs, and whether it serves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any

import httpx

from relay_integrations.testing.scripted_vllm import ScriptedVLLM
from tests.fakes.capable_model import CAPABLE_CUES


def relay_server_env(upstream: ScriptedVLLM, port: int) -> dict[str, str]:
    """This process's environment, with the relay's endpoints on `upstream` (models "large"
    and "small", the capable model's cues, no cooldown) and its port."""
    return relay_env(upstream.base_url, upstream.base_url, CAPABLE_CUES, port)


def relay_env(
    large_url: str, small_url: str, cues: list[str], port: int, **variables: str
) -> dict[str, str]:
    """This process's environment, with the relay's endpoints at the URLs (models "large"
    and "small"), `cues`, no cooldown, its port, and more ``RELAY_*`` `variables`."""
    return {
        **os.environ,
        "RELAY_LARGE__BASE_URL": large_url,
        "RELAY_LARGE__MODEL": "large",
        "RELAY_SMALL__BASE_URL": small_url,
        "RELAY_SMALL__MODEL": "small",
        "RELAY_CUES": json.dumps(cues),
        "RELAY_POLICY__COOLDOWN_TOKENS": "0",
        "RELAY_SERVER_PORT": str(port),
        **variables,
    }


@dataclass
class Served:
    """A running ``relaygen serve``, its URL and the JSON records it has logged so far."""

    process: subprocess.Popen[str]
    url: str
    records: list[dict[str, Any]]
    reader: threading.Thread  # ends once the process has exited and its stderr is read


@contextmanager
def relaygen_serve(env: dict[str, str], *args: str) -> Iterator[Served]:
    """``relaygen serve`` with `env` (:func:`relay_env`: its port is RELAY_SERVER_PORT), once
    /health answers 200 (within 60 s: a loaded machine imports slowly)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "relay_integrations.cli", "serve", *args],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    served = Served(process, f"http://127.0.0.1:{env['RELAY_SERVER_PORT']}", *recording(process))
    try:
        deadline = time.monotonic() + 60
        while not healthy(served.url):
            assert process.poll() is None, f"exited: {served.records}"
            assert time.monotonic() < deadline, f"no /health 200 in 60 s: {served.records}"
            time.sleep(0.05)
        yield served
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)


def read_records(stream: IO[str], records: list[dict[str, Any]]) -> None:
    """Append each JSON line of `stream` to `records` until it ends; a line that is not JSON
    (a traceback, say) is kept as ``{"msg": line, "unparsed": True}`` for the asserts."""
    for line in stream:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            records.append({"msg": line.rstrip(), "unparsed": True})


def recording(process: subprocess.Popen[str]) -> tuple[list[dict[str, Any]], threading.Thread]:
    """The records `process` logs on stderr, read as they come by a daemon thread (so that a
    full pipe never blocks the server, and a test that fails early can show what it logged),
    and that thread: join it after the process exits to have every record."""
    assert process.stderr is not None, "start the process with stderr=subprocess.PIPE"
    records: list[dict[str, Any]] = []
    reader = threading.Thread(target=read_records, args=(process.stderr, records), daemon=True)
    reader.start()
    return records, reader


def healthy(url: str) -> bool:
    """Whether the relay server at `url` answers /health with 200 (False while it starts)."""
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
