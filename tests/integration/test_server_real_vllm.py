"""``relaygen serve`` in front of the real vLLM servers (tiny random Qwen3 models, outputs
forced by structured outputs), called by the official ``openai`` client (sync and async,
streamed and not) and by LangChain's ``ChatOpenAI``, as an application would."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from langchain_openai import ChatOpenAI
from pydantic import SecretStr

from relay_integrations.relay import EndpointConfig, RelayConfig, SamplingConfig, SwitchPolicy
from relay_integrations.relay.config import RequestHook
from relay_integrations.server import RelayServer
from relay_integrations.testing import forcing
from tests.fakes.clients import off_loop
from tests.fakes.relay_http import ServedRelay, relay_http

from .conftest import Server, running_requests

pytestmark = pytest.mark.vllm

REASONING = "Let me add them. Therefore, the sum is 4. Now we check it."
TRACE = f"<think>\n{REASONING}\n</think>\n\nThe answer is 4."
LONG_CHAT = [  # over one 128-token cache block, so later segments hit the prefix cache
    {"role": "system", "content": "You are a careful assistant who checks every step. " * 20},
    {"role": "user", "content": "What is 2 + 2?"},
]
MODEL = "qwen3-large"


def relay_server(large: Server, small: Server, hook: RequestHook | None) -> RelayServer:
    config = RelayConfig(
        large=EndpointConfig(base_url=large.url, model=large.large_model),
        small=EndpointConfig(base_url=small.url, model=small.small_model),
        cues=["Therefore,", "Now"],
        policy=SwitchPolicy(cooldown_tokens=0),
        sampling=SamplingConfig(max_tokens=300),
    )
    return RelayServer(config, request_hook=hook)


def sync_client(served: ServedRelay) -> Any:
    """The official client, untyped here: the tests send plain dicts, as applications do."""
    return openai.OpenAI(base_url=served.base_url, api_key="unused")


@pytest.fixture(scope="module")
def forced(qwen_large: Server, qwen_small: Server) -> Iterator[ServedRelay]:
    """A relay server whose generations write TRACE."""
    with relay_http(relay_server(qwen_large, qwen_small, forcing(TRACE))) as served:
        yield served


@pytest.fixture(scope="module")
def reasoning_forced(qwen_large: Server, qwen_small: Server) -> Iterator[ServedRelay]:
    """Only the reasoning is forced; the answer is the model's, as constrained by the request."""
    hook = forcing(f"<think>\n{REASONING}\n</think>\n\n", answer=False)
    with relay_http(relay_server(qwen_large, qwen_small, hook)) as served:
        yield served


@pytest.fixture(scope="module")
def free(qwen_large: Server, qwen_small: Server) -> Iterator[ServedRelay]:
    """Nothing forced: the tiny models write random text until the budget runs out."""
    with relay_http(relay_server(qwen_large, qwen_small, None)) as served:
        yield served


def test_sync_client_gets_reasoning_answer_usage_and_relay_stats(forced: ServedRelay) -> None:
    client = sync_client(forced)
    completion = client.chat.completions.create(model=MODEL, messages=LONG_CHAT)
    message = completion.choices[0].message
    assert message.content == "The answer is 4."
    extra = message.model_extra or {}
    assert extra["reasoning"] == extra["reasoning_content"] == REASONING
    assert completion.choices[0].finish_reason == "stop"
    relay = (completion.model_extra or {})["relay"]
    assert relay["switches"] == 2 and 0 < relay["large_share"] < 1
    usage = completion.usage
    assert usage is not None
    per_model = relay["usage"].values()
    assert usage.prompt_tokens == sum(u["prompt_tokens"] for u in per_model)
    assert usage.completion_tokens == sum(u["completion_tokens"] for u in per_model)
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == sum(u["cached_tokens"] for u in per_model)
    assert usage.prompt_tokens_details.cached_tokens > 0  # later segments reuse the prefix
    assert usage.completion_tokens_details is not None
    assert 0 < (usage.completion_tokens_details.reasoning_tokens or 0) < usage.completion_tokens


def test_sync_stream_sends_reasoning_then_answer_then_usage(forced: ServedRelay) -> None:
    client = sync_client(forced)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=LONG_CHAT,
        stream=True,
        stream_options={"include_usage": True},
    )
    reasoning, content, kinds, finish, relay, usage = "", "", [], None, None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
            assert chunk.choices == []
            kinds.append("usage")
            continue
        delta = chunk.choices[0].delta
        extra = delta.model_extra or {}
        if extra.get("reasoning"):
            assert extra["reasoning_content"] == extra["reasoning"]
            reasoning += extra["reasoning"]
            kinds.append("reasoning")
        if delta.content:
            content += delta.content
            kinds.append("text")
        if chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
            relay = (chunk.model_extra or {})["relay"]
    assert (reasoning, content, finish) == (REASONING, "The answer is 4.", "stop")
    assert kinds.index("text") > max(i for i, k in enumerate(kinds) if k == "reasoning")
    assert kinds[-1] == "usage" and kinds.count("usage") == 1
    assert relay is not None and relay["switches"] == 2
    assert usage is not None and usage.completion_tokens == sum(
        u["completion_tokens"] for u in relay["usage"].values()
    )


async def test_async_client_streamed_and_whole_agree(forced: ServedRelay) -> None:
    client: Any = await off_loop(openai.AsyncOpenAI, base_url=forced.base_url, api_key="unused")
    whole = await client.chat.completions.create(model=MODEL, messages=LONG_CHAT)
    stream = await client.chat.completions.create(model=MODEL, messages=LONG_CHAT, stream=True)
    pieces = [c.choices[0].delta.content or "" async for c in stream if c.choices]
    assert "".join(pieces) == whole.choices[0].message.content == "The answer is 4."
    # concurrent requests share the server and its upstream connections
    answers = await asyncio.gather(
        *(client.chat.completions.create(model=MODEL, messages=LONG_CHAT) for _ in range(3))
    )
    assert {a.choices[0].message.content for a in answers} == {"The answer is 4."}
    await client.close()


def test_langchain_chat_openai_pointed_at_the_relay(forced: ServedRelay) -> None:
    llm = ChatOpenAI(base_url=forced.base_url, api_key=SecretStr("unused"), model=MODEL)
    message = llm.invoke([(m["role"], m["content"]) for m in LONG_CHAT])
    assert message.content == "The answer is 4."
    assert message.usage_metadata is not None
    assert message.usage_metadata["input_token_details"].get("cache_read", 0) > 0
    streamed = "".join(str(chunk.content) for chunk in llm.stream("What is 2 + 2?"))
    assert streamed == "The answer is 4."


def test_a_forced_tool_call_is_constrained_by_vllm(reasoning_forced: ServedRelay) -> None:
    client = sync_client(reasoning_forced)
    tool = {
        "type": "function",
        "function": {
            "name": "set_light",
            "description": "Switch the light on or off.",
            "parameters": {
                "type": "object",
                "properties": {"on": {"type": "boolean"}},
                "required": ["on"],
            },
        },
    }
    completion = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Turn the light on."}],
        tools=[tool],
        tool_choice="required",
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "set_light"
    arguments = json.loads(call.function.arguments)
    assert set(arguments) == {"on"} and isinstance(arguments["on"], bool)


def test_a_json_schema_answer_is_valid_by_construction(reasoning_forced: ServedRelay) -> None:
    client = sync_client(reasoning_forced)
    schema = {
        "type": "object",
        "properties": {"sum": {"type": "integer"}, "checked": {"type": "boolean"}},
        "required": ["sum", "checked"],
        "additionalProperties": False,
    }
    completion = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is 2 + 2?"}],
        response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
        max_tokens=200,
    )
    answer = json.loads(completion.choices[0].message.content or "")
    assert set(answer) == {"sum", "checked"}
    assert isinstance(answer["sum"], int) and isinstance(answer["checked"], bool)
    assert (completion.choices[0].message.model_extra or {})["reasoning"] == REASONING


async def test_a_client_that_disconnects_cancels_the_vllm_request(
    free: ServedRelay, qwen_large: Server
) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write a long story."}],
        "stream": True,
        "max_tokens": 4000,
    }
    async with (
        await off_loop(httpx.AsyncClient, timeout=60) as client,
        client.stream("POST", f"{free.base_url}/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        lines = 0
        async for line in response.aiter_lines():
            lines += line.startswith("data: ")
            if lines == 5:
                assert await running_requests(qwen_large.root) == 1
                break  # leaving the block closes the connection
    for _ in range(100):
        if await running_requests(qwen_large.root) == 0 and free.relay.inflight == 0:
            break
        await asyncio.sleep(0.1)
    assert await running_requests(qwen_large.root) == 0  # vLLM aborted the request
    assert free.relay.inflight == 0


def test_a_streamed_response_matches_the_chat_completion_for_the_same_seed(
    reasoning_forced: ServedRelay,
) -> None:
    """``/v1/responses`` on the real pair: the reasoning (forced, with both cues: the models
    switch) comes as a reasoning item, the answer (the small model's own, sampled with the
    seed) as output text, both as the chat completion with the same seed has them.

    The first chat completion fills the prefix cache: a prompt computed cold and the same
    prompt found in the cache give logits that differ in the last bits on the CPU build, and
    the tiny random models' near-flat distributions let that change a sampled token. The two
    generations compared both find their prompts cached."""
    client = sync_client(reasoning_forced)
    client.chat.completions.create(model=MODEL, messages=LONG_CHAT, seed=11, max_tokens=200)
    chat = client.chat.completions.create(model=MODEL, messages=LONG_CHAT, seed=11, max_tokens=200)
    stream = client.responses.create(
        model=MODEL, input=LONG_CHAT, max_output_tokens=200, stream=True, extra_body={"seed": 11}
    )
    events = list(stream)
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")
    final = events[-1].response
    reasoning, message = final.output
    message_extra = chat.choices[0].message.model_extra or {}
    assert reasoning.content[0].text == message_extra["reasoning"] == REASONING
    assert message.content[0].text == chat.choices[0].message.content
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed.strip() == message.content[0].text
    relay = final.model_extra["relay"]
    assert relay["switches"] == (chat.model_extra or {})["relay"]["switches"] >= 1
    assert final.usage.output_tokens == chat.usage.completion_tokens
