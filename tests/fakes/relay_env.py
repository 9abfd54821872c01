"""The environment of a ``relaygen serve`` process over a scripted upstream, the reading of
its JSON log lines while it runs, and whether it serves."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from typing import IO, Any

import httpx

from relay_integrations.testing.scripted_vllm import ScriptedVLLM
from tests.fakes.capable_model import CAPABLE_CUES


def relay_server_env(upstream: ScriptedVLLM, port: int) -> dict[str, str]:
    """This process's environment, with the relay's endpoints on `upstream` (models "large"
    and "small", the capable model's cues, no cooldown) and its port."""
    return {
        **os.environ,
        "RELAY_LARGE__BASE_URL": upstream.base_url,
        "RELAY_LARGE__MODEL": "large",
        "RELAY_SMALL__BASE_URL": upstream.base_url,
        "RELAY_SMALL__MODEL": "small",
        "RELAY_CUES": json.dumps(CAPABLE_CUES),
        "RELAY_POLICY__COOLDOWN_TOKENS": "0",
        "RELAY_SERVER_PORT": str(port),
    }


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
