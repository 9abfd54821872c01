"""RelayChatModel behaviours beyond the standard suites, on the capable scripted server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from langchain_core.messages import AIMessage
from pydantic import ValidationError

from relay_integrations.core import SwitchPolicy
from relay_integrations.langchain import RelayChatModel
from tests.fakes.capable_model import capable
from tests.fakes.scripted_vllm import ScriptedModel, ScriptedVLLM


@pytest.fixture
async def server() -> AsyncIterator[ScriptedVLLM]:
    large = ScriptedModel("large", "", respond=capable, token_delay=0.002)
    small = ScriptedModel("small", "", respond=capable, token_delay=0.002)
    async with ScriptedVLLM(large, small) as running:
        yield running


def model(server: ScriptedVLLM, **fields: object) -> RelayChatModel:
    return RelayChatModel(
        large_url=server.base_url,
        large_model="large",
        small_url=server.base_url,
        small_model="small",
        cues=["Therefore,", "Now"],
        policy=SwitchPolicy(cooldown_tokens=0),
        **fields,
    )


async def test_stream_events_v3_show_one_reasoning_and_one_text_block(server: ScriptedVLLM) -> None:
    stream = await model(server).astream_events("What is 2 + 2?", version="v3")
    _ = [event async for event in stream]
    message = await stream.output
    assert [block["type"] for block in message.content_blocks] == ["reasoning", "text"]
    assert message.text == "The answer is 4."
    assert message.content_blocks[0]["reasoning"].startswith("The user writes")


async def test_abatch_runs_generations_concurrently(server: ScriptedVLLM) -> None:
    messages = await model(server).abatch([f"What is {i} + {i}?" for i in range(4)])
    assert [m.text for m in messages] == [f"The answer is {2 * i}." for i in range(4)]
    assert server.models["large"].peak_active >= 2


async def test_leaving_a_stream_early_closes_its_upstream_request(server: ScriptedVLLM) -> None:
    llm = model(server)
    async for chunk in llm.astream("Tell me about the relay."):
        if chunk.additional_kwargs.get("reasoning_content"):
            break  # the large model is still writing
    for _ in range(100):
        if server.models["large"].active == 0 and server.models["small"].active == 0:
            break
        await asyncio.sleep(0.01)
    assert server.models["large"].active == 0 and server.models["small"].active == 0


async def test_stop_sequences_cut_the_answer_not_the_reasoning(server: ScriptedVLLM) -> None:
    # "will" is in the reasoning ("Therefore, I will ..."); the stop applies to the answer only
    message = await model(server).ainvoke(
        "Tell me about the relay and what it will do.", stop=["will"]
    )
    assert isinstance(message, AIMessage)
    assert " will " in message.additional_kwargs["reasoning_content"]
    assert "will" not in message.text
    assert message.text


async def test_an_unusable_cue_artifact_fails_when_the_model_is_built(tmp_path) -> None:
    bad = tmp_path / "cues.json"
    bad.write_text('{"format": "relaygen-cues", "version": 2, "cues": [')
    with pytest.raises(ValidationError, match=r"cue artifact .*cues\.json: not valid JSON"):
        RelayChatModel(
            large_url="http://x/v1",
            large_model="l",
            small_url="http://x/v1",
            small_model="s",
            cues=str(bad),
        )


async def test_unknown_call_arguments_are_refused_with_the_accepted_ones(
    server: ScriptedVLLM,
) -> None:
    with pytest.raises(TypeError, match=r"unsupported arguments \['temprature'\]"):
        await model(server).ainvoke("Hi", temprature=0)
