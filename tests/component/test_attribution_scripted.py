"""Every streamed chunk says which model wrote it, in every surface: LangChain chunks
(``response_metadata["relay_models"]``), LlamaIndex deltas
(``additional_kwargs["relay_model"]``) and ``relaygen serve`` chunks (``relay.model``); the
names agree with the relay's own segments, run by run."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Iterator
from typing import Any

import httpx
import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessageChunk
from langchain_core.messages.ai import add_ai_message_chunks
from llama_index.core.base.llms.types import ChatMessage

from relay_integrations.langchain import RelayChatModel
from relay_integrations.llama_index import RelayLLM
from relay_integrations.relay import EndpointError, RelayResult, RelaySwitcher, SwitchPolicy
from relay_integrations.server import RelayServer
from relay_integrations.testing.scripted_vllm import ScriptedVLLM
from tests.fakes.capable_model import capable_relay_config, relay_fields
from tests.fakes.relay_http import ServedRelay, relay_http

QUESTION = "What is 2 + 2?"
MARKERS = ("<think>", "</think>")

Run = tuple[str, str]
"""A model and the text it wrote without interruption (markers and whitespace left out)."""


def runs(pieces: Iterable[tuple[str, str]]) -> list[Run]:
    """(model, text) pieces as runs: consecutive pieces of one model joined."""
    merged: list[list[str]] = []
    for model, text in pieces:
        for marker in MARKERS:
            text = text.replace(marker, "")
        text = "".join(text.split())
        if not text:
            continue
        if merged and merged[-1][0] == model:
            merged[-1][1] += text
        else:
            merged.append([model, text])
    return [(model, text) for model, text in merged]


@pytest.fixture(scope="module")
def relay_runs(server: ScriptedVLLM) -> list[Run]:
    """The runs of the relay's own segments for QUESTION (the scripted models write the
    same text for the same chat)."""

    async def generate() -> RelayResult:
        async with RelaySwitcher(capable_relay_config(server.base_url)) as relay:
            return await relay.generate([{"role": "user", "content": QUESTION}])

    result = asyncio.run(generate())
    found = runs((s.model, s.text) for s in result.segments)
    assert {model for model, _ in found} == {"large", "small"}  # the relay switched
    return found


@pytest.fixture(scope="module")
def served(server: ScriptedVLLM) -> Iterator[ServedRelay]:
    with relay_http(RelayServer(capable_relay_config(server.base_url))) as running:
        yield running


def chunk_text(chunk: AIMessageChunk) -> str:
    return str(chunk.additional_kwargs.get("reasoning_content", "")) + chunk.text


@pytest.mark.parametrize("how", ["stream", "astream", "callbacks"])
async def test_langchain_chunks_name_their_model(
    server: ScriptedVLLM, relay_runs: list[Run], how: str
) -> None:
    model = RelayChatModel(**relay_fields(server.base_url))
    if how == "stream":  # the sync surfaces run on a worker thread, off the test's loop
        chunks = await asyncio.to_thread(lambda: list(model.stream(QUESTION)))
    elif how == "astream":
        chunks = [chunk async for chunk in model.astream(QUESTION)]
    else:
        seen: list[Any] = []

        class Tokens(BaseCallbackHandler):
            def on_llm_new_token(self, *args: Any, **kwargs: Any) -> None:
                seen.append(kwargs["chunk"].message)

        await asyncio.to_thread(
            RelayChatModel(**relay_fields(server.base_url), streaming=True).invoke,
            QUESTION,
            config={"callbacks": [Tokens()]},
        )
        chunks = seen
    assert chunks
    for chunk in chunks:
        written_by = chunk.response_metadata["relay_models"]
        assert len(written_by) == 1 and written_by[0] in ("large", "small"), written_by
    assert runs((c.response_metadata["relay_models"][0], chunk_text(c)) for c in chunks) == (
        relay_runs
    )
    merged = add_ai_message_chunks(chunks[0], *chunks[1:])  # LangChain joins the lists
    assert merged.response_metadata["relay_models"] == [
        c.response_metadata["relay_models"][0] for c in chunks
    ]
    segments = merged.response_metadata["relay"]["segments"]
    assert chunks[-1].response_metadata["relay_models"] == [segments[-1]["model"]]


def test_langchain_tool_call_chunks_name_the_model_that_wrote_the_call(
    server: ScriptedVLLM,
) -> None:
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return "sunny"

    model = RelayChatModel(**relay_fields(server.base_url)).bind_tools([get_weather])
    chunks = [
        c
        for c in model.stream("What is the weather in Paris? Use a tool.")
        if isinstance(c, AIMessageChunk)
    ]
    calls = [c for c in chunks if c.tool_call_chunks]
    assert calls
    segments = chunks[-1].response_metadata["relay"]["segments"]
    assert all(c.response_metadata["relay_models"] == [segments[-1]["model"]] for c in calls)


async def test_llama_index_deltas_name_their_model(
    server: ScriptedVLLM, relay_runs: list[Run]
) -> None:
    llm = RelayLLM(**relay_fields(server.base_url))
    messages = [ChatMessage(role="user", content=QUESTION)]
    responses = await asyncio.to_thread(lambda: list(llm.stream_chat(messages)))
    async_responses = [r async for r in await llm.astream_chat(messages)]
    for streamed in (responses, async_responses):
        assert all(r.additional_kwargs["relay_model"] in ("large", "small") for r in streamed)
        pieces = (
            (r.additional_kwargs["relay_model"], r.additional_kwargs.get("thinking_delta", ""))
            if "thinking_delta" in r.additional_kwargs
            else (r.additional_kwargs["relay_model"], r.delta or "")
            for r in streamed
        )
        assert runs(pieces) == relay_runs
        segments = streamed[-1].additional_kwargs["relay"]["segments"]
        assert streamed[-1].additional_kwargs["relay_model"] == segments[-1]["model"]


def test_relaygen_serve_chunks_name_their_model(served: ServedRelay, relay_runs: list[Run]) -> None:
    body = {"model": "large", "messages": [{"role": "user", "content": QUESTION}], "stream": True}
    chunks = []
    with httpx.stream("POST", f"{served.base_url}/chat/completions", json=body) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line.removeprefix("data: ")))
    deltas = [c for c in chunks if c["choices"]]
    opening, text_chunks, final = deltas[0], deltas[1:-1], deltas[-1]
    assert "relay" not in opening  # the role, before anyone wrote
    assert all(c["relay"]["model"] in ("large", "small") for c in text_chunks)
    pieces = (
        (c["relay"]["model"], c["choices"][0]["delta"].get("reasoning", ""))
        if "reasoning" in c["choices"][0]["delta"]
        else (c["relay"]["model"], c["choices"][0]["delta"].get("content", ""))
        for c in text_chunks
    )
    assert runs(pieces) == relay_runs
    assert final["relay"]["model"] == final["relay"]["segments"][-1]["model"]


def test_a_generation_without_the_small_model_says_so_in_both_adapters(
    server: ScriptedVLLM,
) -> None:
    """The small model's server refuses connections: the large model writes everything, and
    LangChain's and LlamaIndex's response metadata say the generation ran degraded, and why;
    with the raise policy, the call fails instead."""
    down = ScriptedVLLM()  # its port is bound but not listening: connections are refused
    fields = relay_fields(server.base_url, small_url=down.base_url, max_retries=0)
    message = RelayChatModel(**fields).invoke(QUESTION)
    reply = RelayLLM(**fields).chat([ChatMessage(role="user", content=QUESTION)])
    for relay in (message.response_metadata["relay"], reply.additional_kwargs["relay"]):
        assert relay["degraded"].startswith("the small model's server failed: ")
        assert {s["model"] for s in relay["segments"]} == {"large"}
    planned = RelayChatModel(**relay_fields(server.base_url)).invoke(QUESTION)
    assert planned.response_metadata["relay"]["degraded"] is None
    strict = {**fields, "policy": SwitchPolicy(cooldown_tokens=0, on_small_failure="raise")}
    with pytest.raises(EndpointError, match="small endpoint"):
        RelayChatModel(**strict).invoke(QUESTION)
