"""Sampling fields reach both real models: the shared ones and each model's own.

The tiny random models write freely at a fixed seed, so a generation is repeatable, and a
field the server honours changes the text of the model it was sent to. Only the opening of
the reasoning is forced (the random large model would not open it), the rest of the
reasoning is held to lowercase words, still sampled; the budget (48 tokens, a quarter kept
for the answer) ends the reasoning, and the small model answers freely.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from relay_integrations.langchain import RelayChatModel
from relay_integrations.relay import EndpointConfig, RelayConfig, RelaySwitcher, SamplingConfig
from relay_integrations.upstream.config import SamplingOverrides

from .conftest import Server, qwen_relay_fields

pytestmark = pytest.mark.vllm

QUESTION = [{"role": "user", "content": "Name three prime numbers."}]


def open_the_reasoning(role: str, phase: str, transcript: str) -> Mapping[str, Any]:
    if role != "large" or phase != "reasoning":
        return {}
    opening = "" if transcript else "<think>\\n"
    return {"structured_outputs": {"regex": opening + "[a-z ]{1,400}"}}


async def texts_by_model(
    large: Server,
    small: Server,
    *,
    small_sampling: SamplingOverrides | None = None,
    shared: Mapping[str, float] | None = None,
) -> dict[str, str]:
    config = RelayConfig(
        large=EndpointConfig(base_url=large.url, model=large.large_model),
        small=EndpointConfig(
            base_url=small.url,
            model=small.small_model,
            sampling=small_sampling or SamplingOverrides(),
        ),
        cues=["Therefore,"],
        sampling=SamplingConfig.model_validate(
            {"max_tokens": 48, "seed": 7, "temperature": 1.0, **(shared or {})}
        ),
    )
    async with RelaySwitcher(config, request_hook=open_the_reasoning) as relay:
        result = await relay.generate(QUESTION)
    written = {"large": "", "small": ""}
    for segment in result.segments:
        written[segment.model] += segment.text
    assert written["large"] and written["small"], result.segments
    return written


async def test_a_fixed_seed_repeats_the_generation(qwen_large: Server, qwen_small: Server) -> None:
    first = await texts_by_model(qwen_large, qwen_small)
    assert await texts_by_model(qwen_large, qwen_small) == first


@pytest.mark.parametrize(
    "field",
    [
        {"presence_penalty": 2.0},
        {"frequency_penalty": 2.0},
        {"repetition_penalty": 2.0},
        {"min_p": 0.9},
    ],
)
async def test_a_shared_field_reaches_both_models(
    qwen_large: Server, qwen_small: Server, field: dict[str, float]
) -> None:
    plain = await texts_by_model(qwen_large, qwen_small)
    changed = await texts_by_model(qwen_large, qwen_small, shared=field)
    assert changed["large"] != plain["large"]
    assert changed["small"] != plain["small"]


async def test_a_models_own_field_reaches_that_model_only(
    qwen_large: Server, qwen_small: Server
) -> None:
    plain = await texts_by_model(qwen_large, qwen_small)
    changed = await texts_by_model(
        qwen_large, qwen_small, small_sampling=SamplingOverrides(repetition_penalty=2.0)
    )
    assert changed["large"] == plain["large"]  # the large model's requests are as before
    assert changed["small"] != plain["small"]


async def test_langchain_fields_and_call_arguments_reach_the_servers(
    qwen_large: Server, qwen_small: Server
) -> None:
    fields = qwen_relay_fields(
        qwen_large,
        qwen_small,
        max_tokens=48,
        seed=7,
        temperature=1.0,
        request_hook=open_the_reasoning,
    )
    plain = await RelayChatModel(**fields).ainvoke(QUESTION)
    per_call = await RelayChatModel(**fields).ainvoke(QUESTION, repetition_penalty=2.0)
    per_field = await RelayChatModel(**fields, repetition_penalty=2.0).ainvoke(QUESTION)
    reasoning = "reasoning_content"
    assert per_call.additional_kwargs[reasoning] != plain.additional_kwargs[reasoning]
    assert per_call.additional_kwargs[reasoning] == per_field.additional_kwargs[reasoning]
    assert per_call.text == per_field.text
