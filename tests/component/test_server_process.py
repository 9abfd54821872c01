"""``relaygen serve`` as a process, as it is deployed: configured from the environment, logging
JSON lines, and shutting down gracefully on SIGTERM (against the scripted upstream)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from relay_integrations.testing.scripted_vllm import ScriptedVLLM, serving
from tests.fakes.capable_model import capable_server
from tests.fakes.chat_stream import stream_in_thread
from tests.fakes.ports import free_port
from tests.fakes.relay_env import Served, relay_server_env
from tests.fakes.relay_env import relaygen_serve as serve_with_env

EXITED_ON_SIGTERM = (0, -signal.SIGTERM)  # uvicorn re-raises the signal after its shutdown


@contextmanager
def relaygen_serve(upstream: ScriptedVLLM, *args: str) -> Iterator[Served]:
    """``relaygen serve`` on a free port, its endpoints on `upstream`, once it serves."""
    with serve_with_env(relay_server_env(upstream, free_port()), *args) as served:
        yield served


def test_sigterm_lets_a_stream_finish_and_refuses_new_connections() -> None:
    upstream = capable_server(token_delay=0.03)  # about 2 s per generation
    with serving(upstream), relaygen_serve(upstream, "--shutdown-timeout", "20") as served:
        process, url = served.process, served.url
        outcome: dict[str, Any] = {}
        thread = stream_in_thread(httpx.Client(base_url=url, timeout=60), outcome)
        assert outcome["started"].wait(10)
        process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/health", timeout=2)
        thread.join(30)
        assert process.wait(30) in EXITED_ON_SIGTERM
        served.reader.join(10)
        logs = served.records
    assert "error" not in outcome
    assert outcome["lines"][-1] == "[DONE]"  # the stream finished during the shutdown
    finish = json.loads(outcome["lines"][-2])
    assert finish["choices"][0]["finish_reason"] == "stop"
    content = "".join(
        json.loads(line)["choices"][0]["delta"].get("content") or ""
        for line in outcome["lines"][:-2]
    )
    assert content == "The answer is 42."
    # structured logs: every line JSON, the request logged with its id and its generation
    assert not [r["msg"] for r in logs if r.get("unparsed")]
    (request,) = [e for e in logs if e["msg"] == "request" and e["path"] == "/v1/chat/completions"]
    (done,) = [e for e in logs if e["msg"] == "generation done"]
    assert request["status"] == 200 and request["request_id"] == done["request_id"]
    assert done["generation_id"] == finish["id"] == f"chatcmpl-{request['request_id']}"


def test_a_stream_past_the_shutdown_deadline_ends_with_an_error_event_and_done() -> None:
    upstream = capable_server(token_delay=0.3)  # about 20 s per generation
    with serving(upstream), relaygen_serve(upstream, "--shutdown-timeout", "1") as served:
        process, url = served.process, served.url
        outcome: dict[str, Any] = {}
        thread = stream_in_thread(httpx.Client(base_url=url, timeout=60), outcome)
        assert outcome["started"].wait(10)
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(15) in EXITED_ON_SIGTERM
        exited = time.monotonic() - signalled
        thread.join(15)
    assert exited < 8  # the deadline (1 s) and the shutdown's own steps, not the 20 s stream
    lines = outcome["lines"]
    assert "error" not in outcome  # a whole body, not a broken chunked one
    assert lines[-1] == "[DONE]"
    assert json.loads(lines[-2])["error"]["code"] == "shutting_down"
    models = upstream.models.values()
    assert sum(m.cut_short for m in models) == 1  # the open upstream stream was closed
    assert sum(m.active for m in models) == 0


def test_a_bad_configuration_fails_with_the_reason() -> None:
    env = {**os.environ, "RELAY_CUES": "/nonexistent/cues.json"}
    env.update(
        {
            "RELAY_LARGE__BASE_URL": "http://127.0.0.1:9/v1",
            "RELAY_LARGE__MODEL": "large",
            "RELAY_SMALL__BASE_URL": "http://127.0.0.1:9/v1",
            "RELAY_SMALL__MODEL": "small",
        }
    )
    done = subprocess.run(
        [sys.executable, "-m", "relay_integrations.cli", "serve"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "cue artifact /nonexistent/cues.json" in done.stderr
    done = subprocess.run(
        [sys.executable, "-m", "relay_integrations.cli", "serve", "--port", "99999"],
        env=env | {"RELAY_CUES": "builtin:qwen3-32b--qwen3-1.7b"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "port" in done.stderr
