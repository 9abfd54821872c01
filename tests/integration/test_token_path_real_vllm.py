"""Prompts in token space on real vLLM: with both roles on one model at temperature 0 and cues
that fire, the relay's text is exactly the model's own single-request text, because each
request continues from the very tokens the model wrote.

The model is the demo's Gemma 3 270M (a trained model: its reasoning has sentences and
sentence starts to use as cues). The reference is one ``/v1/completions`` request from the
chat's rendered ids; the cues are the words that start its sentences, so the relay switches at
each. The text path (every prompt sent as text and tokenized again by the server) is run
beside it and its divergence, if any, printed: it may re-tokenize a boundary differently.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import httpx
import pytest

from relay_integrations.relay import (
    EndpointConfig,
    RelayConfig,
    RelayResult,
    RelaySwitcher,
    SamplingConfig,
    SwitchPolicy,
)
from relay_integrations.upstream.completion import CompletionRequest, TokenPrompt

from .conftest import Server

pytestmark = pytest.mark.vllm

QUESTIONS = [
    "A train travels 60 km in the first hour and 90 km in the second hour. "
    "What is its average speed?",
    "What is 17 times 23? Explain step by step.",
    "How many minutes are in 3.5 hours? Show your work.",
]
MAX_TOKENS = 300


async def reference(server: Server, messages: list[dict[str, Any]]) -> str:
    """The model's own text: one request from the chat as its server renders it."""
    async with httpx.AsyncClient(timeout=300) as client:
        rendered = await client.post(
            f"{server.root}/tokenize",
            json={"model": server.large_model, "messages": messages, "add_generation_prompt": True},
        )
        answer = await client.post(
            f"{server.url}/completions",
            json={
                "model": server.large_model,
                "prompt": rendered.json()["tokens"],
                "max_tokens": MAX_TOKENS,
                "temperature": 0,
            },
        )
    return str(answer.json()["choices"][0]["text"])


def sentence_starts(text: str) -> list[str]:
    """The words (with a comma that follows) that start the sentences of `text`."""
    return sorted(set(re.findall(r"(?:(?<=[.!?] )|(?<=\n))([A-Z][a-z]+,?)", text)))


async def relay(
    server: Server, messages: list[dict[str, Any]], cues: list[str], path: str
) -> tuple[RelayResult, list[CompletionRequest]]:
    model = EndpointConfig(base_url=server.url, model=server.large_model)
    config = RelayConfig.model_validate(
        {
            "large": model,
            "small": model,
            "cues": cues,
            "sampling": SamplingConfig(max_tokens=MAX_TOKENS, temperature=0, top_k=None),
            "policy": SwitchPolicy(cooldown_tokens=0),
            "prompt_path": path,
        }
    )
    sent: list[CompletionRequest] = []
    async with RelaySwitcher(config) as switcher:
        assert switcher.prompt_path == path
        endpoint = switcher.endpoints["large"]
        send = endpoint.stream_completion

        def recording(request: CompletionRequest) -> Any:
            sent.append(request)
            return send(request)

        endpoint.stream_completion = recording  # type: ignore[method-assign]
        result = await switcher.generate(messages)
    return result, sent


def divergence(got: str, expected: str) -> str:
    at = next(
        (i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b),
        min(len(got), len(expected)),
    )
    return f"from character {at}: {expected[at - 40 : at + 40]!r} became {got[at - 40 : at + 40]!r}"


@pytest.mark.parametrize("question", QUESTIONS, ids=["speed", "product", "minutes"])
async def test_the_token_path_writes_the_models_own_text(gemma: Server, question: str) -> None:
    messages = [{"role": "user", "content": question}]
    expected = await reference(gemma, messages)
    cues = sentence_starts(expected.partition("</think>")[0])
    assert cues, f"no sentence start to use as a cue in {expected!r}"
    tokens, sent = await relay(gemma, messages, cues, "tokens")
    assert tokens.stats.switches >= 2, tokens.segments
    assert sent and all(isinstance(r.prompt, TokenPrompt) for r in sent)
    assert tokens.text == expected, divergence(tokens.text, expected)
    text, _ = await relay(gemma, messages, cues, "text")
    assert text.stats.switches >= 2, text.segments
    if text.text != expected:  # shown in the test run's warnings summary
        warnings.warn(f"the text path diverges {divergence(text.text, expected)}", stacklevel=1)
    # each continues a prompt whose start the server has cached (the same ids)
    assert all(usage.cached_tokens for usage in tokens.usage.values()), tokens.usage
