"""The small vLLM server killed (SIGKILL) in the middle of a generation: the generation
finishes on the large model with the whole forced text, says it ran degraded, and the next
generation goes to the large model at once (the small server is known down). The server is
started again after the test."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest

from relay_integrations.relay import RelayDone, RelayResult, RelaySwitcher, TextDelta
from relay_integrations.testing import forced

from .conftest import Server
from .test_relay_real_vllm import QUESTION, qwen_config
from .test_router_real_vllm import LONG_TRACE, servers_script

pytestmark = pytest.mark.vllm

SMALL_SERVER = "qwen3-small"  # its name in scripts/vllm_servers.sh


@pytest.fixture
def small_restarted(qwen_small: Server) -> Iterator[list[str]]:
    """The test kills the small server; it is started again (and ready) after the test."""
    killed: list[str] = []
    yield killed
    if killed:
        servers_script("start", SMALL_SERVER)


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
