"""``relaygen serve --workers 2`` as a process against the scripted upstream: answers, requests
spread over both workers, metrics summed over them, a graceful stop of every process, a dead
worker replaced, and a bad configuration stopping everything with its reason."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import httpx
import openai
import pytest

from relay_integrations.relay import EndpointConfig, RelayConfig
from relay_integrations.server import ServerSettings
from relay_integrations.server.workers import WorkerStartError, serve_workers
from relay_integrations.testing.scripted_vllm import ScriptedVLLM, serving
from tests.fakes.capable_model import capable_server
from tests.fakes.chat_stream import QUESTION, stream_in_thread, streamed_content
from tests.fakes.clients import off_loop
from tests.fakes.ports import free_port
from tests.fakes.relay_env import recording, relay_server_env

MESSAGES: Any = [QUESTION]  # what the openai client is sent
ANSWER = "The answer is 42."
CHAT = "/v1/chat/completions"


@dataclass
class Served:
    """A running ``relaygen serve --workers 2`` and the JSON records it has logged so far."""

    process: subprocess.Popen[str]
    url: str
    records: list[dict[str, Any]] = field(default_factory=list)

    def started_pids(self) -> list[int]:
        """Every worker the supervisor started, in order."""
        return [r["worker_pid"] for r in self.records if r["msg"] == "worker started"]

    def wait_until(self, condition: Callable[[], bool], seconds: float = 30) -> None:
        deadline = time.monotonic() + seconds
        while not condition():
            assert time.monotonic() < deadline, "not logged in time"
            assert self.process.poll() is None, f"exited with {self.process.returncode}"
            time.sleep(0.05)

    def wait_for(self, found: Callable[[dict[str, Any]], bool]) -> None:
        """Until a record is logged that `found` accepts."""
        self.wait_until(lambda: any(found(r) for r in list(self.records)))

    def pid_of(self, request_id: str) -> int:
        """The process that logged the request with this id."""
        self.wait_for(lambda r: r.get("request_id") == request_id and r["msg"] == "request")
        (record,) = [r for r in self.records if r.get("request_id") == request_id]
        return int(record["pid"])

    def chat_requests(self) -> list[dict[str, Any]]:
        return [r for r in list(self.records) if r["msg"] == "request" and r["path"] == CHAT]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@contextlib.contextmanager
def relaygen_serve_workers(upstream: ScriptedVLLM, *args: str) -> Iterator[Served]:
    """``relaygen serve --workers 2`` on a free port, once both workers serve."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "relay_integrations.cli", "serve", "--workers", "2", *args],
        env=relay_server_env(upstream, port),
        stderr=subprocess.PIPE,
        text=True,
    )
    served = Served(process, f"http://127.0.0.1:{port}", recording(process)[0])
    try:
        served.wait_for(lambda r: r["msg"] == "serving")
        yield served
    finally:
        if process.poll() is None:
            process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        for pid in served.started_pids():  # not to leave one behind, whatever the test did
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


def answer(url: str, request_id: str | None = None) -> httpx.Response:
    """One non-streamed completion on a connection of its own."""
    headers = {"x-request-id": request_id} if request_id else {}
    body = {"model": "large", "messages": [QUESTION]}
    return httpx.post(f"{url}{CHAT}", json=body, headers=headers, timeout=60)


def counted(metrics: str, sample: str) -> float:
    (line,) = [line for line in metrics.splitlines() if line.startswith(sample + " ")]
    return float(line.split()[-1])


def test_openai_clients_get_whole_answers_from_two_workers() -> None:
    upstream = capable_server()
    with serving(upstream), relaygen_serve_workers(upstream) as served:
        base_url = f"{served.url}/v1"
        client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
        whole = client.chat.completions.create(model="large", messages=MESSAGES)
        assert whole.choices[0].message.content == ANSWER
        assert whole.choices[0].finish_reason == "stop"
        chunks = client.chat.completions.create(model="large", messages=MESSAGES, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ANSWER

        async def both_ways_async() -> tuple[str | None, str]:
            async with await off_loop(
                openai.AsyncOpenAI, base_url=base_url, api_key="unused"
            ) as aclient:
                whole = await aclient.chat.completions.create(model="large", messages=MESSAGES)
                stream = await aclient.chat.completions.create(
                    model="large",
                    messages=MESSAGES,
                    stream=True,
                )
                streamed = "".join([c.choices[0].delta.content or "" async for c in stream])
                return whole.choices[0].message.content, streamed

        assert asyncio.run(both_ways_async()) == (ANSWER, ANSWER)


def test_requests_reach_both_workers_and_every_scrape_counts_all_of_them() -> None:
    upstream = capable_server(token_delay=0.005)
    with serving(upstream), relaygen_serve_workers(upstream) as served:
        sent = 0
        with ThreadPoolExecutor(8) as pool:
            for _ in range(10):  # rounds of 8 at once, each on a new connection
                answers = list(pool.map(lambda _: answer(served.url), range(8)))
                assert [r.json()["choices"][0]["message"]["content"] for r in answers] == [
                    ANSWER
                ] * 8
                sent += 8
                served.wait_until(partial(lambda n: len(served.chat_requests()) == n, sent))
                if len({r["pid"] for r in served.chat_requests()}) == 2:
                    break
        answered_by = {r["pid"] for r in served.chat_requests()}
        assert answered_by == set(served.started_pids())  # both workers, and no other process
        chat_ok = f'relay_requests_total{{path="{CHAT}",status="200"}}'
        deadline = time.monotonic() + 5  # a request is counted just after its response ends
        while (seen := counted(httpx.get(f"{served.url}/metrics").text, chat_ok)) < sent:
            assert time.monotonic() < deadline, f"a scrape counts {seen} of {sent} requests"
            time.sleep(0.05)
        for _ in range(6):  # each scrape a new connection: whichever worker takes it
            metrics = httpx.get(f"{served.url}/metrics").text
            assert counted(metrics, chat_ok) == sent
            assert counted(metrics, "relay_generation_seconds_count") == sent
            assert counted(metrics, "relay_inflight_generations") == 0


def test_sigterm_lets_a_stream_on_each_worker_finish_then_every_process_exits() -> None:
    upstream = capable_server(token_delay=0.03)  # about 2 s per generation
    with (
        serving(upstream),
        relaygen_serve_workers(upstream, "--shutdown-timeout", "20") as served,
    ):
        # A kept-alive connection stays with the worker that accepted it: one per worker,
        # told apart by the pid logged with a first request on it.
        connections: dict[int, httpx.Client] = {}
        for attempt in range(40):
            client = httpx.Client(base_url=served.url, timeout=60)
            rid = f"probe-{attempt}"
            assert client.get("/v1/models", headers={"x-request-id": rid}).status_code == 200
            pid = served.pid_of(rid)
            if pid in connections:
                client.close()
            else:
                connections[pid] = client
            if len(connections) == 2:
                break
        assert len(connections) == 2
        outcomes: dict[int, dict[str, Any]] = {pid: {} for pid in connections}
        threads = [stream_in_thread(connections[pid], outcomes[pid]) for pid in connections]
        assert all(outcome["started"].wait(10) for outcome in outcomes.values())
        served.process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        with contextlib.suppress(httpx.ConnectError):  # refused: every socket copy closed
            assert httpx.get(f"{served.url}/health", timeout=2).status_code == 503
        for thread in threads:
            thread.join(30)
        assert served.process.wait(30) == 0
    for outcome in outcomes.values():  # one stream on each worker, each whole
        assert "error" not in outcome
        assert outcome["lines"][-1] == "[DONE]"
        assert json.loads(outcome["lines"][-2])["choices"][0]["finish_reason"] == "stop"
        assert streamed_content(outcome["lines"]) == ANSWER
    assert sorted(served.started_pids()) == sorted(connections)  # none replaced meanwhile
    assert all(gone(pid) for pid in served.started_pids())
    exits = [r["exit"] for r in served.records if r["msg"] == "worker exited"]
    assert exits == ["ended by SIGTERM"] * 2


def test_a_killed_worker_is_replaced_and_the_server_keeps_answering() -> None:
    upstream = capable_server()
    with serving(upstream), relaygen_serve_workers(upstream) as served:
        first, second = served.started_pids()
        os.kill(first, signal.SIGKILL)
        served.wait_for(lambda r: r["msg"] == "serving" and first not in r["worker_pids"])
        (died,) = [r for r in served.records if r["msg"] == "worker died; starting another"]
        assert (died["worker_pid"], died["exit"], died["level"]) == (
            first,
            "ended by SIGKILL",
            "error",
        )
        assert served.started_pids()[:2] == [first, second] and len(served.started_pids()) == 3
        for i in range(8):
            reply = answer(served.url, f"after-{i}")
            assert reply.json()["choices"][0]["message"]["content"] == ANSWER
        assert served.process.poll() is None
        assert gone(first)


def test_workers_drain_and_exit_when_the_supervisor_is_killed() -> None:
    upstream = capable_server()
    with serving(upstream), relaygen_serve_workers(upstream) as served:
        served.process.kill()
        served.process.wait(10)
        deadline = time.monotonic() + 20
        while not all(gone(pid) for pid in served.started_pids()):
            assert time.monotonic() < deadline, "a worker outlived its supervisor"
            time.sleep(0.1)


def test_a_bad_configuration_stops_every_worker_with_the_reason() -> None:
    env = relay_server_env(capable_server(), free_port()) | {"RELAY_CUES": "/nonexistent/cues.json"}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "relay_integrations.cli", "serve", "--workers", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert time.monotonic() - started < 20  # no restart loop
    assert done.returncode == 2
    assert "could not start: CueArtifactError: cue artifact /nonexistent/cues.json" in done.stderr
    records = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    pids = [r["worker_pid"] for r in records if r["msg"] == "worker started"]
    assert len(pids) == 2 and all(gone(pid) for pid in pids)


def test_a_configuration_that_cannot_be_pickled_is_refused_naming_the_field() -> None:
    config = RelayConfig(
        large=EndpointConfig(
            base_url="http://127.0.0.1:9/v1", model="l", extra_body={"state": threading.Lock()}
        ),
        small=EndpointConfig(base_url="http://127.0.0.1:9/v1", model="s"),
        cues=["Now"],
    )
    with pytest.raises(WorkerStartError, match=r"config\.large\.extra_body cannot be sent"):
        serve_workers(config, ServerSettings(workers=2, port=0))


def test_workers_come_from_the_environment_and_flags() -> None:
    assert ServerSettings.from_env({"RELAY_SERVER_WORKERS": "4"}).workers == 4
    assert ServerSettings.from_env({"RELAY_SERVER_WORKERS": "4"}, workers=2).workers == 2
    with pytest.raises(ValueError, match="workers"):
        ServerSettings(workers=0)
