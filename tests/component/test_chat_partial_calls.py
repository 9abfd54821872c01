"""A forced call streamed in pieces by the chat layer (``stream_chat(partial_calls=True)``),
on the scripted server whose models answer like a capable model."""

from __future__ import annotations

import json
from typing import Any

from relay_integrations.chat.exchange import (
    ChatRequest,
    ChatResponse,
    ToolCallChunk,
    ToolCallDelta,
    stream_chat,
)
from relay_integrations.chat.tool_calls import ToolCall
from relay_integrations.relay.switcher import RelaySwitcher
from relay_integrations.testing.scripted_vllm import ScriptedModel, ScriptedVLLM
from tests.fakes.capable_model import capable, capable_relay_config

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
QUESTION = [{"role": "user", "content": "What is the weather in San Francisco, CA?"}]


async def forced_stream(partial_calls: bool) -> list[Any]:
    large = ScriptedModel("large", "", respond=capable)
    small = ScriptedModel("small", "", respond=capable)
    async with ScriptedVLLM(large, small) as server:
        config = capable_relay_config(server.base_url)
        request = ChatRequest(QUESTION, tools=[WEATHER], tool_choice="get_weather")
        async with RelaySwitcher(config) as relay:
            return [e async for e in stream_chat(relay, request, partial_calls=partial_calls)]


async def test_a_forced_call_streams_in_pieces_that_make_up_its_json() -> None:
    events = await forced_stream(partial_calls=True)
    chunks = [e for e in events if isinstance(e, ToolCallChunk)]
    (done,) = [e for e in events if isinstance(e, ToolCallDelta)]
    assert len(chunks) > 3 and isinstance(done.call, ToolCall)
    text = "".join(c.text for c in chunks)
    assert json.loads(text) == {"name": "get_weather", "arguments": {"city": "San Francisco, CA"}}
    assert {c.id for c in chunks} == {done.call.id} and {c.index for c in chunks} == {0}
    assert events.index(chunks[-1]) < events.index(done)
    response = events[-1]
    assert isinstance(response, ChatResponse) and response.tool_calls == [done.call]


async def test_without_partial_calls_a_forced_call_arrives_whole() -> None:
    events = await forced_stream(partial_calls=False)
    assert not any(isinstance(e, ToolCallChunk) for e in events)
    assert sum(isinstance(e, ToolCallDelta) for e in events) == 1
