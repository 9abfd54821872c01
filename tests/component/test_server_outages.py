"""``relaygen serve`` while its upstream servers go down and come back, each in a process of
its own (the scripted models of the benchmarks, killed with SIGKILL and started again on their
port), under the load of streaming clients:

- the small server killed and restarted: every generation finishes; those started while it
  was known down ran on the large model alone, say so, and got their first token without a
  retry wait; once it is back, the relay uses it again;
- the large server killed and restarted within the resume budget: every generation in flight
  waits for it and finishes with its whole text, none lost or repeated;
- past the budget: the stream ends with an error event naming the large model's server (no
  address) and ``[DONE]``; a new request gets 503 with Retry-After at once.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks import upstream
from tests.fakes.ports import free_port
from tests.fakes.relay_env import relay_env, relaygen_serve

QUESTION = "What is 42 * 7?"
REASONING = upstream.REASONING.removeprefix("<think>\n").removesuffix("\n</think>\n\n").strip()
ANSWER = f"{QUESTION} Here is the answer."
RETRY_WAIT = 0.5 + 1 + 2  # what a request pays in backoff before it fails (3 retries)
ADDRESS = re.compile(r"127\.0\.0\.1|localhost|http://")


class Upstream:
    """One scripted model server in its own process, on a port it keeps across restarts."""

    def __init__(self, model: str, token_delay: float, log: Path) -> None:
        self.model, self.token_delay, self.log = model, token_delay, log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.process, url = upstream.start(
                self.token_delay, log, models=(self.model,), port=self.port
            )
        assert url == self.url

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        upstream.stop(self.process)


@contextmanager
def upstreams(tmp_path: Path, token_delay: float) -> Iterator[tuple[Upstream, Upstream]]:
    large = Upstream("large", token_delay, tmp_path / "large.log")
    small = Upstream("small", token_delay, tmp_path / "small.log")
    try:
        large.start()
        small.start()
        yield large, small
    finally:
        large.stop()
        small.stop()


@dataclass
class Stream:
    """One streamed generation as a client saw it."""

    started: float
    first_text: float | None = None
    reasoning: str = ""
    content: str = ""
    chunks: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False
    body: str = ""

    @property
    def last(self) -> dict[str, Any]:
        return self.chunks[-1]


def stream_once(url: str) -> Stream:
    body = {"model": "large", "messages": [{"role": "user", "content": QUESTION}]}
    seen = Stream(time.monotonic())
    request = {**body, "stream": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=request, timeout=30) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            seen.body += line + "\n"
            if line == "data: [DONE]":
                seen.done = True
            elif line.startswith("data: "):
                chunk = json.loads(line.removeprefix("data: "))
                seen.chunks.append(chunk)
                delta = (chunk.get("choices") or [{}])[0].get("delta") or {}
                seen.reasoning += delta.get("reasoning") or ""
                seen.content += delta.get("content") or ""
                if seen.first_text is None and (seen.reasoning or seen.content):
                    seen.first_text = time.monotonic() - seen.started
    return seen


class Load:
    """`clients` threads streaming one generation after another until stopped."""

    def __init__(self, url: str, clients: int) -> None:
        self.streams: list[Stream] = []
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(url,)) for _ in range(clients)]

    def _run(self, url: str) -> None:
        while not self._stop.is_set():
            try:
                self.streams.append(stream_once(url))
            except Exception as failed:  # kept for the asserts
                self.errors.append(failed)

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)


def test_the_small_server_killed_and_restarted_under_load(tmp_path: Path) -> None:
    with upstreams(tmp_path, token_delay=0.01) as (large, small):
        env = relay_env(
            large.url, small.url, upstream.CUES, free_port(), RELAY_SMALL__PROBE_INTERVAL="0.2"
        )
        with relaygen_serve(env) as relay, Load(relay.url, clients=6) as load:
            time.sleep(2)
            small.kill()
            killed = time.monotonic()
            time.sleep(RETRY_WAIT + 5)  # found down, then 5 s known down
            restarting = time.monotonic()  # up and probed before start() returns
            small.start()
            restarted = time.monotonic()
            time.sleep(4)
            load.stop()
            metrics = httpx.get(f"{relay.url}/metrics").text
    assert not load.errors, load.errors[:3]
    streams = load.streams
    assert len(streams) > 30
    for seen in streams:
        assert seen.done and seen.last["choices"][0]["finish_reason"] == "stop"
        assert (seen.reasoning.strip(), seen.content) == (REASONING, ANSWER)
        assert not ADDRESS.search(seen.body)
    degraded = [s for s in streams if s.last["relay"]["degraded"]]
    known_down = [s for s in streams if killed + RETRY_WAIT + 0.5 < s.started < restarting]
    assert known_down
    assert all(s in degraded for s in known_down), [
        (round(s.started - killed, 2), s.last["relay"]["degraded"]) for s in known_down
    ]
    assert all("known down" in s.last["relay"]["degraded"] for s in known_down)
    assert all(s.last["relay"]["large_share"] == 1.0 for s in known_down)
    # no retry wait before the first token: the large model's own pace (54 tokens at 10 ms)
    assert max(s.first_text or 99 for s in known_down) < RETRY_WAIT / 2
    back = [s for s in streams if s.started > restarted + 1.0]
    assert back and not any(s.last["relay"]["degraded"] for s in back)
    assert all(s.last["relay"]["switches"] > 0 for s in back)
    (line,) = [m for m in metrics.splitlines() if m.startswith("relay_degraded_generations_total")]
    assert float(line.split()[-1]) == len(degraded)
    healthy_ttft = [s.first_text or 0 for s in streams if s.started < killed - 0.5]
    used_again = min(
        s.started for s in streams if s.started > restarted and s.last["relay"]["switches"]
    )
    print(
        f"\n{len(streams)} streams; first text while known down: max "
        f"{max(s.first_text or 99 for s in known_down):.3f} s over {len(known_down)} "
        f"(before the kill, with switches: max {max(healthy_ttft):.3f} s); the small model used "
        f"again {used_again - restarted:.2f} s after its restart"
    )


def test_the_large_server_restarted_within_the_resume_budget_loses_no_text(
    tmp_path: Path,
) -> None:
    with upstreams(tmp_path, token_delay=0.05) as (large, small):  # about 3 s a generation
        env = relay_env(
            large.url, small.url, upstream.CUES, free_port(), RELAY_LARGE__PROBE_INTERVAL="0.2"
        )
        with relaygen_serve(env) as relay:
            streams: list[Stream] = []
            threads = [
                threading.Thread(target=lambda: streams.append(stream_once(relay.url)))
                for _ in range(6)
            ]
            for thread in threads:  # at different points of their text
                thread.start()
                time.sleep(0.2)
            large.kill()
            time.sleep(RETRY_WAIT + 2)  # longer than a request's retries: they wait
            large.start()
            for thread in threads:
                thread.join(60)
    assert len(streams) == 6
    for seen in streams:
        assert seen.done and seen.last["choices"][0]["finish_reason"] == "stop"
        assert (seen.reasoning.strip(), seen.content) == (REASONING, ANSWER)
        assert seen.last["relay"]["seconds"] > RETRY_WAIT + 1  # it lived through the outage
        assert not ADDRESS.search(seen.body)
    # the streams of the large model's turns broke and resumed; the small model's turns at
    # the time of the kill found it out at their end and waited
    assert sum(seen.last["relay"]["resumes"] for seen in streams) >= 1, [
        r["msg"] for r in relay.records
    ]


def test_past_the_resume_budget_the_stream_ends_with_an_error_naming_no_address(
    tmp_path: Path,
) -> None:
    with upstreams(tmp_path, token_delay=0.05) as (large, small):
        env = relay_env(
            large.url,
            small.url,
            upstream.CUES,
            free_port(),
            RELAY_LARGE__MAX_RETRIES="0",
            # one failure opens the breaker here (five in a row by default), and no request is
            # let through as its half-open trial for 30 s, so that the request after the
            # budget finds the large server known down, at once
            RELAY_LARGE__FAILURES_TO_OPEN="1",
            RELAY_LARGE__PROBE_INTERVAL="30",
            RELAY_POLICY__RESUME_WAIT_SECONDS="1",
        )
        with relaygen_serve(env) as relay:
            streams: list[Stream] = []
            thread = threading.Thread(target=lambda: streams.append(stream_once(relay.url)))
            thread.start()
            time.sleep(1.0)
            large.kill()
            thread.join(30)
            refused = httpx.post(
                f"{relay.url}/v1/chat/completions",
                json={"model": "large", "messages": [{"role": "user", "content": QUESTION}]},
            )
    (seen,) = streams
    assert seen.done  # an error event, then [DONE]: a whole body
    error = seen.last["error"]
    assert error["message"].startswith("the large model's server is unavailable: ")
    assert "The text written before the failure is in relay.partial." in error["message"]
    assert "request id" in error["message"] and not ADDRESS.search(seen.body)
    partial = seen.last["relay"]["partial"]
    assert partial["text"] and upstream.REASONING.startswith(partial["text"])
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "upstream_unavailable"
    assert "known down" in refused.json()["error"]["message"]
    assert not ADDRESS.search(refused.text)
