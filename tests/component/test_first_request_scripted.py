"""The first token waits only for what it needs: the large model's first request goes out
once its own prompt is rendered, while the small model's is rendered beside it; the
generation is played, and a prompt too long for either window refused, once both are known.
Against the scripted fake; the real-vLLM suites run every generation this way."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from relay_integrations.relay import (
    ContextOverflowError,
    EndpointConfig,
    EndpointError,
    RelayConfig,
    RelayResult,
    RelaySwitcher,
    TextDelta,
)
from relay_integrations.testing.scripted_vllm import ScriptedModel, ScriptedVLLM
from relay_integrations.upstream.endpoint import Endpoint
from relay_integrations.upstream.rendering import ChatInput, RenderedIds, ServerChatTemplate
from tests.component.test_outages_scripted import pair_config
from tests.component.test_speculative_handoff_scripted import outcome
from tests.component.test_switcher_scripted import CUES, MESSAGES, TRACE
from tests.fakes.relay_config import make_config

RENDER_SECONDS = 0.3


class SlowSmallRender(ServerChatTemplate):
    """The servers' own template, the small model's render taking `RENDER_SECONDS` more;
    what the large model had been sent by the time it answered."""

    def __init__(self, large: ScriptedModel) -> None:
        self.large = large
        self.large_requests_meanwhile: int | None = None

    async def render_ids(self, endpoint: Endpoint, chat: ChatInput) -> RenderedIds:
        rendered = await super().render_ids(endpoint, chat)
        if endpoint.role == "small":
            await asyncio.sleep(RENDER_SECONDS)
            self.large_requests_meanwhile = len(self.large.requests)
        return rendered


async def relay_with(
    large: ScriptedModel, small: ScriptedModel, **policy: Any
) -> tuple[RelayResult, SlowSmallRender, float]:
    """One generation with the small model's render slowed down; the seconds to its first
    text event."""
    render = SlowSmallRender(large)
    async with (
        ScriptedVLLM(large, small) as server,
        RelaySwitcher(make_config(server, **policy), renderer=render) as relay,
    ):
        loop = asyncio.get_running_loop()
        began, first = loop.time(), None
        async for event in relay.stream(MESSAGES):
            if first is None and isinstance(event, TextDelta):
                first = loop.time() - began
            result = getattr(event, "result", None)
        assert isinstance(result, RelayResult) and first is not None
        return result, render, first


async def test_the_large_models_first_request_goes_out_while_the_small_prompt_renders() -> None:
    large, small = ScriptedModel("large", TRACE), ScriptedModel("small", TRACE)
    result, render, first = await relay_with(large, small, speculative_handoff=False)
    assert render.large_requests_meanwhile == 1  # sent before the small render answered
    assert result.text == TRACE and result.stats.switches > 0
    # no text before both prompts are known; the request opened first is no hand-off
    assert first >= RENDER_SECONDS
    assert (result.stats.speculative_handoffs, result.stats.speculative_misses) == (0, 0)
    assert result.usage["large"].requests == len(large.requests)  # used, not sent again


async def test_the_generation_is_the_same_as_with_both_prompts_rendered_first() -> None:
    """Everything a caller sees but the timings, against the same generation on servers
    whose renders answer at once (where the small render is done before the large one's
    first request has written a token)."""
    slow, _, _ = await relay_with(ScriptedModel("large", TRACE), ScriptedModel("small", TRACE))
    async with (
        ScriptedVLLM(ScriptedModel("large", TRACE), ScriptedModel("small", TRACE)) as server,
        RelaySwitcher(make_config(server)) as relay,
    ):
        quick = await relay.generate(MESSAGES)
    assert outcome(slow) == outcome(quick)


async def test_a_small_prompt_over_its_window_closes_the_request_sent_first() -> None:
    large = ScriptedModel("large", TRACE, token_delay=0.05)  # still writing when refused
    small = ScriptedModel("small", TRACE, max_model_len=24)
    render = SlowSmallRender(large)
    async with (
        ScriptedVLLM(large, small) as server,
        RelaySwitcher(make_config(server), renderer=render) as relay,
    ):
        with pytest.raises(ContextOverflowError, match="small model 32 tokens, window 24"):
            await relay.generate(MESSAGES)
        for _ in range(100):  # the server sees the close a moment later
            if large.active == 0:
                break
            await asyncio.sleep(0.01)
    assert render.large_requests_meanwhile == 1 and large.cut_short == 1 and large.active == 0
    assert not small.requests


async def test_a_small_server_that_fails_its_render_leaves_the_large_model_alone() -> None:
    """The request sent first stops at the cues too, for a small model to take over; with
    the small server down, the large model's requests stop at the end of reasoning only, so
    the turn closes it and sends its own."""
    large_model = ScriptedModel("large", TRACE)
    large = ScriptedVLLM(large_model)
    dead = ScriptedVLLM(ScriptedModel("small", TRACE))  # bound, never started: refuses
    async with large, RelaySwitcher(pair_config(large, dead.base_url)) as relay:
        result = await relay.generate(MESSAGES)
    assert result.text == TRACE and {s.model for s in result.segments} == {"large"}
    assert result.stats.degraded is not None and "small model's server failed" in (
        result.stats.degraded
    )
    first, reasoning, answer = large_model.requests
    assert " Therefore," in first["stop"] and reasoning["stop"] == ["</think>"]
    assert "stop" not in answer  # the caller gave none
    assert result.usage["large"].requests == 2  # the request closed unused is not counted


async def test_with_the_raise_policy_a_failed_small_render_closes_the_request_sent_first() -> None:
    large_model = ScriptedModel("large", TRACE, token_delay=0.05)
    large = ScriptedVLLM(large_model)
    dead = ScriptedVLLM(ScriptedModel("small", TRACE))
    config = pair_config(large, dead.base_url, on_small_failure="raise")
    async with large, RelaySwitcher(config) as relay:
        with pytest.raises(EndpointError) as failed:
            await relay.generate(MESSAGES)
        for _ in range(100):
            if large_model.active == 0:
                break
            await asyncio.sleep(0.01)
    assert failed.value.role == "small"
    assert large_model.active == 0 and len(large_model.requests) <= 1


async def test_a_large_render_that_fails_cancels_the_small_one() -> None:
    dead = ScriptedVLLM(ScriptedModel("large", TRACE))  # bound, never started: refuses
    small_model = ScriptedModel("small", TRACE)
    async with ScriptedVLLM(small_model) as small:
        config = RelayConfig(
            large=EndpointConfig(base_url=dead.base_url, model="large", max_retries=0),
            small=EndpointConfig(base_url=small.base_url, model="small", max_retries=0),
            cues=list(CUES.cues),
        )
        async with RelaySwitcher(config) as relay:
            with pytest.raises(EndpointError) as failed:
                await relay.generate(MESSAGES)
    assert failed.value.role == "large" and not small_model.requests


async def test_the_request_hook_is_asked_once_a_request() -> None:
    """The request sent first and the turn's request it serves are built from the same
    (model, phase, transcript), as a hand-off's request opened ahead and the turn's are: a
    hook sees each (model, phase, transcript) once, the first request's among them."""
    calls: list[tuple[str, str, str]] = []

    def hook(role: str, phase: str, transcript: str) -> dict[str, Any]:
        calls.append((role, phase, transcript))
        return {}

    large, small = ScriptedModel("large", TRACE), ScriptedModel("small", TRACE)
    render = SlowSmallRender(large)
    async with (
        ScriptedVLLM(large, small) as server,
        RelaySwitcher(make_config(server), renderer=render, request_hook=hook) as relay,
    ):
        result = await relay.generate(MESSAGES)
    assert render.large_requests_meanwhile == 1 and result.stats.speculative_handoffs > 0
    assert calls[0] == ("large", "reasoning", "") and len(set(calls)) == len(calls)
    # every request sent was asked for (one more was built and not sent: the small model's
    # turn ending at "e." of "e.g." went on)
    assert len(calls) >= len(large.requests) + len(small.requests)
