"""Real vLLM servers killed (SIGKILL) in the middle of a generation.

The small one: the generation finishes on the large model with the whole forced text, says it
ran degraded, and the next generation goes to the large model at once (the small server is
known down). The large one, in the last sentence of the reasoning, and started again: the
generation waits for it, resumes where its stream broke, and ends with the text of the same
seed's fault-free run: the reasoning forced, the answer the model's own after it (greedy), so
a resume that changed what the model saw would show in the answer. Each server is started
again after its test."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from relay_integrations.relay import ModelRole, RelayDone, RelayResult, RelaySwitcher, TextDelta
from relay_integrations.relay.config import Phase
from relay_integrations.testing import forced, forcing, hooked

from .conftest import Server
from .oracle import WORDS
from .test_relay_real_vllm import QUESTION, qwen_config
from .test_router_real_vllm import LONG_TRACE, servers_script

pytestmark = pytest.mark.vllm

SMALL_SERVER = "qwen3-small"  # its name in scripts/vllm_servers.sh


LARGE_SERVER = "qwen3-large"
LAST_SENTENCE = " ".join(
    f"Check {i}: the parts add up to the running total." for i in range(10)
)  # some 120 forced tokens (a few seconds on CPU): the kill lands inside it
END_REASONING = (
    f"<think>\nLet me add the parts. Therefore, the sum is 12. {LAST_SENTENCE}\n</think>"
)


def reasoning_then_words(role: ModelRole, phase: Phase, transcript: str) -> dict[str, Any]:
    """The reasoning forced; the answer the model's own, in words (a random model left free
    writes the end marker over and over)."""
    if phase == "answer":
        return {"structured_outputs": {"regex": "\n\n" + WORDS}}
    return dict(forcing(END_REASONING, answer=False)(role, phase, transcript))


@pytest.fixture
def small_restarted(qwen_small: Server) -> Iterator[list[str]]:
    """The test kills the small server; it is started again (and ready) after the test."""
    killed: list[str] = []
    yield killed
    if killed:
        servers_script("start", SMALL_SERVER)


@pytest.fixture
def large_restarted(qwen_large: Server) -> Iterator[list[str]]:
    """The test kills the large server and starts it again; should the test fail before it
    did, the server is started again (and ready) after the test."""
    killed: list[str] = []
    yield killed
    if killed and killed[-1] == "killed":
        servers_script("start", LARGE_SERVER)


async def test_the_small_vllm_killed_mid_generation_the_large_model_finishes(
    qwen_large: Server,
    qwen_small: Server,
    small_restarted: list[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = qwen_config(qwen_large, qwen_small)
    sampling = config.sampling.model_copy(update={"max_tokens": 2048, "seed": 0})
    # the small server's breaker opens at its first failed request here (five in a row by
    # default), so that the next generation finds it known down
    small = config.small.model_copy(update={"failures_to_open": 1})
    config = config.model_copy(update={"sampling": sampling, "small": small})
    result: RelayResult | None = None
    caplog.set_level(logging.WARNING, logger="relay_integrations")
    async with asyncio.timeout(180), RelaySwitcher(config) as relay:
        async for event in forced(relay, LONG_TRACE).stream(QUESTION):
            if isinstance(event, TextDelta) and event.model == "small" and not small_restarted:
                await asyncio.to_thread(servers_script, "kill", SMALL_SERVER)
                small_restarted.append(SMALL_SERVER)
            elif isinstance(event, RelayDone):
                result = event.result
        assert small_restarted, "the small model never wrote"
        assert result is not None
        assert result.text == LONG_TRACE  # nothing lost: the large model wrote the rest
        assert result.finish_reason == "stop"
        assert result.stats.degraded is not None
        assert result.stats.degraded.startswith("the small model's server failed: ")
        failed = [i for i, s in enumerate(result.segments) if s.ended_by == "failed"]
        assert failed and result.segments[failed[0]].model == "small"
        assert all(s.model == "large" for s in result.segments[failed[0] + 1 :])
        assert relay.endpoints["small"].availability.down

        caplog.clear()  # the next generation: the large model alone, at once
        again = await forced(relay, LONG_TRACE).generate(QUESTION)
    assert again.text == LONG_TRACE and {s.model for s in again.segments} == {"large"}
    assert again.stats.degraded is not None and "known down" in again.stats.degraded
    assert not [r for r in caplog.records if "retrying in" in r.getMessage()]


async def test_the_large_vllm_killed_at_the_end_of_the_reasoning_the_text_is_the_fault_free_one(
    qwen_large: Server,
    qwen_small: Server,
    large_restarted: list[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = qwen_config(qwen_large, qwen_small)
    large = config.large.model_copy(update={"probe_interval": 0.5})
    greedy = config.sampling.model_copy(update={"temperature": 0.0})
    config = config.model_copy(update={"large": large, "sampling": greedy})
    caplog.set_level(logging.WARNING, logger="relay_integrations")
    async with asyncio.timeout(300), RelaySwitcher(config) as relay:
        fault_free = await hooked(relay, reasoning_then_words).generate(QUESTION)
        assert fault_free.text.startswith(END_REASONING), fault_free.text
        assert fault_free.answer.strip(), "the model wrote no answer to compare"

        async def kill_then_start() -> None:
            await asyncio.to_thread(servers_script, "kill", LARGE_SERVER)
            large_restarted.append("killed")
            await asyncio.to_thread(servers_script, "start", LARGE_SERVER)
            large_restarted.append("started")

        restart: asyncio.Task[None] | None = None
        result: RelayResult | None = None
        small_wrote = False
        async for event in hooked(relay, reasoning_then_words).stream(QUESTION):
            if isinstance(event, TextDelta):
                small_wrote = small_wrote or event.model == "small"
                if small_wrote and event.model == "large" and restart is None:
                    restart = asyncio.create_task(kill_then_start())  # the last sentence
            elif isinstance(event, RelayDone):
                result = event.result
        assert restart is not None, "the large model never wrote after the small one"
        await restart
    assert large_restarted == ["killed", "started"]
    assert result is not None
    assert result.text == fault_free.text  # nothing lost, nothing doubled at the boundary
    assert result.finish_reason == fault_free.finish_reason
    assert result.stats.resumes >= 1 or any(
        "waiting up to" in r.getMessage() for r in caplog.records
    )
