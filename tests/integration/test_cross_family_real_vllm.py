"""The relay between two model families on real vLLM: Gemma 3 270M writes, SmolLM2-135M relays.

Two tokenizers (262,144 and 49,152 entries) and two chat templates (Gemma's worked-example
template that opens ``<think>``, SmolLM2's ChatML): the relay is text-level, so each server
renders its own prompt and the transcript is the only thing the two share. Outputs are forced
with structured outputs, so every hand-off position is known.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from relay_integrations.relay import (
    ChatInput,
    EndpointConfig,
    RelayConfig,
    RelayResult,
    RelaySwitcher,
    SamplingConfig,
    ServerChatTemplate,
    SwitchPolicy,
)
from relay_integrations.testing import forced
from relay_integrations.upstream.answers import Detokenized
from relay_integrations.upstream.completion import TokenPrompt
from relay_integrations.upstream.endpoint import CompletionRequest, Endpoint, StreamPiece

from .conftest import Server

pytestmark = pytest.mark.vllm

REASONING = (
    "First, the train covers 60 km in the first hour and 90 km in the second hour. "
    "Therefore, it covers 150 km in two hours. Now we divide the distance by the time. "
    "So the average speed is 150 km over 2 hours. Therefore, it is 75 km per hour. "
    "Now we check it: 75 times 2 is 150, which matches the distance."
)
TRACE = f"{REASONING}\n</think>\n\nThe average speed is 75 km/h."
QUESTION = [
    {
        "role": "user",
        "content": "A train travels 60 km in the first hour and 90 km in the second hour. "
        "What is its average speed over the two hours?",
    }
]


def pair_config(gemma: Server, smollm2: Server, **policy: object) -> RelayConfig:
    policy.setdefault("cooldown_tokens", 0)
    return RelayConfig(
        large=EndpointConfig(base_url=gemma.url, model=gemma.large_model),
        small=EndpointConfig(base_url=smollm2.url, model=smollm2.small_model),
        cues=["Therefore,", "Now", "So "],
        sampling=SamplingConfig(max_tokens=400, seed=0),
        policy=SwitchPolicy.model_validate(policy),
    )


async def relay_recording(
    config: RelayConfig,
) -> tuple[RelayResult, dict[str, list[CompletionRequest]]]:
    """One forced generation, and the requests each endpoint sent."""
    sent: dict[str, list[CompletionRequest]] = {"large": [], "small": []}
    async with RelaySwitcher(config) as relay:
        for role, endpoint in relay.endpoints.items():
            send = endpoint.stream_completion

            def recording(
                request: CompletionRequest, send: Any = send, role: str = role
            ) -> AsyncIterator[StreamPiece]:
                sent[role].append(request)
                return send(request)  # type: ignore[no-any-return]

            endpoint.stream_completion = recording  # type: ignore[method-assign, assignment]
        result = await forced(relay, TRACE).generate(QUESTION)
    return result, sent


async def prompt_text(endpoint: Endpoint, prompt: str | TokenPrompt) -> str:
    """What a request's prompt stands for, read back through the server's own tokenizer."""
    if isinstance(prompt, str):
        return prompt
    body = {"model": endpoint.config.model, "tokens": list(prompt.ids)}
    return (await endpoint.post_json("/detokenize", body, Detokenized)).prompt + prompt.text


SEGMENTS = [
    ("large", "cue", "Therefore,"),
    ("small", "sentence_end", None),
    ("large", "cue", "Now"),
    ("small", "sentence_end", None),
    ("large", "cue", "So "),
    ("small", "sentence_end", None),
    ("large", "cue", "Therefore,"),
    ("small", "sentence_end", None),
    ("large", "cue", "Now"),
    ("small", "sentence_end", None),
    ("large", "end_of_reasoning", None),
    ("small", "stop", None),
]


async def test_hand_offs_land_at_the_same_text_in_both_directions(
    gemma: Server, smollm2: Server
) -> None:
    result, _ = await relay_recording(pair_config(gemma, smollm2))
    assert result.text == TRACE
    assert [(s.model, s.ended_by, s.cue) for s in result.segments] == SEGMENTS
    assert result.stats.speculative_handoffs > 0  # the default: requests opened ahead
    # large -> small right after each cue, small -> large right after each sentence
    texts = [s.text for s in result.segments]
    assert texts[:4] == [
        "First, the train covers 60 km in the first hour and 90 km in the second hour. Therefore,",
        " it covers 150 km in two hours.",
        " Now",
        " we divide the distance by the time.",
    ]
    assert result.reasoning == REASONING
    assert result.answer == "The average speed is 75 km/h."


async def test_each_server_gets_its_own_template_and_reuses_its_own_prefix(
    gemma: Server, smollm2: Server
) -> None:
    # (every request sent is one used: none is opened ahead of a hand-off)
    result, sent = await relay_recording(pair_config(gemma, smollm2, speculative_handoff=False))
    assert result.text == TRACE
    assert [(s.model, s.ended_by, s.cue) for s in result.segments] == SEGMENTS
    async with RelaySwitcher(pair_config(gemma, smollm2)) as relay:
        renderer, chat = ServerChatTemplate(), ChatInput(QUESTION)
        large_prompt = (await renderer.render(relay.endpoints["large"], chat)).text
        small_prompt = (await renderer.render(relay.endpoints["small"], chat)).text
        prompts = {
            role: [await prompt_text(relay.endpoints[role], r.prompt) for r in sent[role]]
            for role in ("large", "small")
        }
    assert large_prompt.startswith("<bos>") and large_prompt.endswith("<think>\n")
    assert small_prompt.startswith("<|im_start|>system\n")
    assert small_prompt.endswith("<|im_start|>assistant\n")
    # every request is the model's own rendered prompt plus the transcript so far
    for role, prompt in (("large", large_prompt), ("small", small_prompt)):
        assert prompts[role] and all(p.startswith(prompt) for p in prompts[role])
        transcripts = [p[len(prompt) :] for p in prompts[role]]
        assert all(TRACE.startswith(t) for t in transcripts)
    # the answer, on the small model's ChatML template after the whole reasoning
    reasoning_end = TRACE.index("</think>") + len("</think>")
    assert prompts["small"][-1] == small_prompt + TRACE[:reasoning_end]
    # usage per model, counted by each model's own tokenizer; both prefix caches hit
    for role in ("large", "small"):
        usage = result.usage[role]
        segments = [s for s in result.segments if s.model == role]
        assert usage.completion_tokens == sum(s.usage.completion_tokens for s in segments) > 0
        assert usage.requests == len(sent[role])
        assert usage.cached_tokens > 0, role
    assert result.usage["large"].prompt_tokens > result.usage["small"].prompt_tokens
