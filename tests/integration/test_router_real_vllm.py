"""The relay behind a real vllm-router over two vLLM replicas of the large model.

``consistent_hash`` keys on the relay's X-Session-ID header, so every large-model request of
a generation reaches one replica and each switch prefills only the new text; ``round_robin``
spreads them and loses part of the prefix cache. A replica killed mid-generation costs a
resume on the other replica, and nothing of the text. Requests per replica come from each
replica's own ``/metrics``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import httpx
import openai
import pytest

from relay_integrations.relay import (
    RelayDone,
    RelayResult,
    RelaySwitcher,
    SamplingConfig,
    TextDelta,
)
from relay_integrations.testing import forced
from tests.fakes.clients import off_loop
from tests.fakes.ports import free_port
from tests.fakes.relay_env import healthy

from .conftest import (
    PATIENT,
    Replica,
    Server,
    pair_options,
    settled_metric,
)
from .test_relay_real_vllm import QUESTION, QWEN_TRACE, qwen_config, run

pytestmark = [pytest.mark.vllm, pytest.mark.scale_out]

SERVERS_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "vllm_servers.sh"
FINISHED = "vllm:request_success_total"  # completion requests a replica finished


def long_prompt() -> list[dict[str, str]]:
    """Over three 128-token cache blocks, led by twelve random digits (twelve tokens for the
    Qwen tokenizer, whatever they are): no replica has cached any of it, and every run's
    prompt has the same length, so cached-token counts compare exactly."""
    nonce = "".join(random.choice("0123456789") for _ in range(12))
    rules = " ".join(
        f"Rule {i}: show every step of the work and check each result twice." for i in range(30)
    )
    return [{"role": "system", "content": f"Case {nonce}. {rules}"}, *QUESTION]


async def finished_per_replica(replicas: tuple[Replica, Replica]) -> list[float]:
    return [await settled_metric(replica.root, FINISHED) for replica in replicas]


async def routed(
    large: Server, small: Server, replicas: tuple[Replica, Replica]
) -> tuple[RelayResult, list[float]]:
    """One forced generation through `large`; its result and requests finished per replica."""
    before = await finished_per_replica(replicas)
    async with RelaySwitcher(qwen_config(large, small)) as relay:
        _, result = await run(relay, QWEN_TRACE, messages=long_prompt())
    after = await finished_per_replica(replicas)
    assert result.text == QWEN_TRACE
    return result, [a - b for a, b in zip(after, before, strict=True)]


def cache_share(result: RelayResult) -> float:
    large = result.usage["large"]
    return large.cached_tokens / large.prompt_tokens


async def test_consistent_hash_keeps_a_generation_on_one_replica_and_its_cache(
    replicas: tuple[Replica, Replica],
    router_hash: Server,
    router_rr: Server,
    qwen_large: Server,
    qwen_small: Server,
) -> None:
    single, _ = await routed(qwen_large, qwen_small, replicas)
    hashed = [await routed(router_hash, qwen_small, replicas) for _ in range(3)]
    spread, spread_counts = await routed(router_rr, qwen_small, replicas)

    large_requests = single.usage["large"].requests
    assert large_requests == 4  # three cues and the end of the reasoning
    for result, counts in hashed:
        # one replica took them all (and, on a loaded machine, a request opened ahead of a
        # hand-off that did not come may finish there before its close arrives)
        assert min(counts) == 0 and max(counts) >= large_requests, counts
        # the same prefill as on one server: each request reused everything before it. The
        # counts may differ by the few tokens in which the model spelled the forced text
        # otherwise (prompts carry its own tokens), and so by a cache block (128 tokens)
        used, alone = result.usage["large"], single.usage["large"]
        assert abs(used.prompt_tokens - alone.prompt_tokens) <= 0.02 * alone.prompt_tokens
        assert abs(used.cached_tokens - alone.cached_tokens) <= 128, (used, alone)
    assert all(count > 0 for count in spread_counts), spread_counts  # both replicas
    assert spread.usage["large"].cached_tokens < single.usage["large"].cached_tokens
    print(
        f"\nlarge-model prompt tokens served from the cache: one server {cache_share(single):.1%}"
        f", consistent_hash {cache_share(hashed[0][0]):.1%}, round_robin "
        f"{cache_share(spread):.1%} (requests per replica {spread_counts})"
    )


LONG_REASONING = " ".join(
    f"Step {i}: we add the next part and keep the running total in mind." for i in range(12)
)  # some 500 forced tokens (~15 s on CPU): still being written when the test kills its replica
LONG_TRACE = (
    f"<think>\n{LONG_REASONING} Therefore, the sum is 12. Then the check holds.\n</think>\n\n"
    "The answer is 12."
)


def servers_script(*args: str) -> None:
    subprocess.run([str(SERVERS_SCRIPT), *args], check=True, capture_output=True, text=True)


async def workers_healthy(router: Server) -> bool:
    async with await off_loop(httpx.AsyncClient, timeout=PATIENT) as client:
        workers = (await client.get(f"{router.root}/workers")).json()["workers"]
    return len(workers) == 2 and all(worker["is_healthy"] for worker in workers)


async def replica_of_session(
    router: Server, replicas: tuple[Replica, Replica], header: str
) -> tuple[str, Replica]:
    """A session id and the replica `router` sends it to: a one-token request with it in the
    session `header` finished there and nowhere else. Asked of the router itself, before the
    generation: no guess from which replica's counters move while it runs (vLLM updates
    counters late, and a late update of the idle replica once named it, so the test killed the
    one not writing)."""
    for _ in range(3):
        session = f"relay-{uuid.uuid4().hex}"
        before = await finished_per_replica(replicas)
        async with await off_loop(httpx.AsyncClient, timeout=PATIENT) as client:
            probe = await client.post(
                f"{router.url}/completions",
                headers={header: session},
                json={"model": router.large_model, "prompt": "Hi", "max_tokens": 1},
            )
        probe.raise_for_status()
        after = await finished_per_replica(replicas)
        finished = [a - b for a, b in zip(after, before, strict=True)]
        if sorted(finished) == [0, 1]:
            return session, replicas[finished.index(1)]
    raise AssertionError(f"no one replica finished the session's probe: {finished}")


@pytest.fixture
def restarted(router_hash: Server, router_rr: Server) -> Iterator[list[Replica]]:
    """Replicas the test kills are started again after it, and back in both routers' pools."""
    killed: list[Replica] = []
    yield killed
    for replica in killed:
        servers_script("start", replica.name)
    deadline = time.monotonic() + 60
    while not all(asyncio.run(workers_healthy(r)) for r in (router_hash, router_rr)):
        assert time.monotonic() < deadline, "the routers did not take the restarted replica back"
        time.sleep(0.5)


async def test_a_replica_killed_mid_generation_costs_a_resume_and_no_text(
    replicas: tuple[Replica, Replica],
    router_hash: Server,
    qwen_small: Server,
    restarted: list[Replica],
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = qwen_config(router_hash, qwen_small)
    config = config.model_copy(update={"sampling": SamplingConfig(max_tokens=2048, seed=0)})
    session, victim = await replica_of_session(router_hash, replicas, config.session_header)
    before = await finished_per_replica(replicas)
    streamed: list[str] = []
    result: RelayResult | None = None
    caplog.set_level(logging.WARNING, logger="relay_integrations")
    async with asyncio.timeout(120), RelaySwitcher(config) as relay:
        async for event in forced(relay, LONG_TRACE).stream(QUESTION, generation_id=session):
            if isinstance(event, TextDelta):
                streamed.append(event.text)
                if not restarted and len("".join(streamed)) > 120:
                    await asyncio.to_thread(servers_script, "kill", victim.name)
                    restarted.append(victim)
            elif isinstance(event, RelayDone):
                result = event.result
    assert restarted, "the generation ended before a replica could be killed"
    assert result is not None
    assert result.text == LONG_TRACE  # nothing lost, nothing written twice
    assert "".join(streamed) == result.reasoning + result.answer
    assert result.stats.resumes == 1, f"{restarted[0].name} was killed, nothing was cut"
    first = result.segments[0]
    assert (first.model, first.ended_by, first.cue) == ("large", "cue", "Therefore,")
    assert first.usage.requests == 2  # the cut request and its resume on the other replica
    survivor = replicas[1 - replicas.index(restarted[0])]
    after = await settled_metric(survivor.root, FINISHED)
    assert after - before[replicas.index(survivor)] >= 2  # the resume and the later turns
    resumed = [r.getMessage() for r in caplog.records if "resuming" in r.getMessage()]
    assert len(resumed) == 1 and router_hash.url in resumed[0], resumed
    print(f"\n{resumed[0]}\nseconds: {result.stats.total_seconds:.1f}")


@pytest.fixture
def served_on_router(router_hash: Server, qwen_small: Server) -> Iterator[str]:
    """``relaygen serve --workers 2`` with the router as its large server; yields its URL, and
    stops it with SIGTERM (it must exit 0: every worker drained)."""
    port = free_port()
    command = [
        *(sys.executable, "-m", "relay_integrations.cli", "serve", "--workers", "2"),
        *("--port", str(port), "--max-tokens", "64", "--cues", '["Therefore,", "Now"]'),
        *pair_options(router_hash, qwen_small),
    ]
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(command, stdout=log, stderr=log, text=True)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while not healthy(url):
                assert process.poll() is None, f"relaygen serve exited: {read_all(log)}"
                assert time.monotonic() < deadline, f"no /health 200 in 60 s: {read_all(log)}"
                time.sleep(0.2)
            yield url
            process.send_signal(signal.SIGTERM)
            assert process.wait(60) == 0, read_all(log)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(10)


def read_all(log: IO[str]) -> str:
    log.seek(0)
    return log.read()[-3000:]


async def test_relaygen_serve_with_two_workers_in_front_of_the_router(
    served_on_router: str, replicas: tuple[Replica, Replica]
) -> None:
    """The random models write what they like: the shape of each answer is checked, and the
    counts (requests in the relay's one scrape of /metrics, requests at the replicas)."""
    client = await off_loop(openai.AsyncOpenAI, base_url=f"{served_on_router}/v1", api_key="unused")
    messages: Any = [{"role": "user", "content": "What is 5 + 7?"}]
    before = await finished_per_replica(replicas)

    async def whole() -> None:
        completion = await client.chat.completions.create(model="qwen3-large", messages=messages)
        assert completion.choices[0].finish_reason in ("stop", "length")
        assert completion.usage is not None and completion.usage.completion_tokens > 0

    async def streamed() -> None:
        stream = await client.chat.completions.create(
            model="qwen3-large",
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")

    await asyncio.gather(*(whole() for _ in range(4)), *(streamed() for _ in range(4)))
    await client.close()

    async with await off_loop(httpx.AsyncClient, timeout=PATIENT) as http:
        scrape = (await http.get(f"{served_on_router}/metrics")).text
    answered = 'relay_requests_total{path="/v1/chat/completions",status="200"} '
    assert [
        float(line.split()[-1]) for line in scrape.splitlines() if line.startswith(answered)
    ] == [8.0]
    after = await finished_per_replica(replicas)
    assert sum(after) - sum(before) >= 8  # every generation's large requests went through
