"""RelayChatModel behaviours beyond the standard suites, on the capable scripted server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from langchain_core.messages import AIMessage
from pydantic import ValidationError

from relay_integrations.langchain import RelayChatModel
from relay_integrations.relay import EndpointError, SwitchPolicy
from relay_integrations.testing.scripted_vllm import Fault, ScriptedVLLM
from tests.fakes.capable_model import capable_server, relay_fields


@pytest.fixture
async def server() -> AsyncIterator[ScriptedVLLM]:
    async with capable_server(token_delay=0.002) as running:
        yield running


def model(server: ScriptedVLLM, **fields: object) -> RelayChatModel:
    return RelayChatModel(**relay_fields(server.base_url, **fields))


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
    def active() -> int:
        return server.models["large"].active + server.models["small"].active

    llm = model(server)
    async for chunk in llm.astream("Tell me about the relay."):
        if chunk.additional_kwargs.get("reasoning_content") and active() == 1:
            break  # leave while a model is writing this chunk's segment
    else:
        pytest.fail("no chunk arrived while an upstream request was open")
    for _ in range(100):
        if server.models["large"].active == 0 and server.models["small"].active == 0:
            break
        await asyncio.sleep(0.01)
    assert server.models["large"].active == 0 and server.models["small"].active == 0
    # the open request was cut short, not left to finish its segment
    assert server.models["large"].cut_short + server.models["small"].cut_short == 1


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
    with pytest.raises(
        TypeError,
        match=r"call arguments \['temprature'\]:\n  temprature: did you mean 'temperature'",
    ):
        await model(server).ainvoke("Hi", temprature=0)


def get_weather(city: str) -> str:
    """Weather in a city."""
    return "sunny"


def get_time(zone: str) -> str:
    """The time in a time zone."""
    return "noon"


async def test_tool_choice_none_shows_the_tools_and_takes_no_call(server: ScriptedVLLM) -> None:
    """As vLLM's chat endpoint: the template shows the tools, the answer is text (whatever
    it holds), no call is parsed from it."""
    llm = model(server).bind_tools([get_weather], tool_choice="none")
    message = await llm.ainvoke("What is the weather in Paris?")
    assert message.tool_calls == [] and message.text
    rendered = [r["prompt"] for r in server.models["large"].requests]
    assert all("<tools>" in prompt for prompt in rendered)


async def test_parallel_calls_can_be_limited_to_one(server: ScriptedVLLM) -> None:
    question = "Use get_weather for Paris and get_time for CET."
    both = await model(server).bind_tools([get_weather, get_time]).ainvoke(question)
    assert [c["name"] for c in both.tool_calls] == ["get_weather", "get_time"]
    one = await (
        model(server)
        .bind_tools([get_weather, get_time], parallel_tool_calls=False)
        .ainvoke(question)
    )
    assert [c["name"] for c in one.tool_calls] == ["get_weather"]


async def test_structured_output_by_function_calling_is_a_forced_call(server: ScriptedVLLM) -> None:
    from pydantic import BaseModel

    class Weather(BaseModel):
        """A weather report."""

        city: str
        degrees: int

    llm = model(server).with_structured_output(Weather, method="function_calling", include_raw=True)
    out = await llm.ainvoke("Report the weather in Paris: 21 degrees.")
    assert isinstance(out, dict)
    assert out["parsed"] == Weather(city="Paris", degrees=21)
    answer_request = server.models["small"].requests[-1]
    schema = answer_request["structured_outputs"]["json"]
    assert schema["properties"]["name"] == {"const": "Weather"}
    assert out["raw"].response_metadata["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("strict", [True, False, None])
async def test_bind_tools_strict_constrains_the_calls_to_the_tool_s_schema(
    server: ScriptedVLLM, strict: bool | None
) -> None:
    """``strict=True`` as ``ChatOpenAI`` takes it: every <tool_call> block's JSON is held to
    the tool's schema (free text around it); ``False``/``None``: the answer is free."""
    llm = model(server).bind_tools([get_weather], strict=strict)
    message = await llm.ainvoke("Use get_weather for Paris.")
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    answer_request = server.models["small"].requests[-1]
    if not strict:
        assert "structured_outputs" not in answer_request
        return
    tag = json.loads(answer_request["structured_outputs"]["structural_tag"])
    assert tag["format"]["type"] == "triggered_tags"
    call = tag["format"]["tags"][0]["content"]["json_schema"]
    assert call["properties"]["arguments"] == {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    }


@pytest.mark.parametrize("method", ["function_calling", "json_schema"])
async def test_with_structured_output_takes_strict(server: ScriptedVLLM, method: str) -> None:
    from pydantic import BaseModel

    class Weather(BaseModel):
        city: str
        degrees: int

    llm = model(server).with_structured_output(Weather, method=method, strict=True)  # type: ignore[arg-type]
    assert await llm.ainvoke("Report the weather in Paris: 21 degrees.") == Weather(
        city="Paris", degrees=21
    )


async def test_a_stream_broken_beyond_its_resumes_keeps_its_text_in_the_error(
    server: ScriptedVLLM,
) -> None:
    """Through ``astream``: the error names the server and the fix, and ``partial`` holds the
    reasoning the chunks carried (and any tail they had not yet)."""
    server.models["large"].faults[:] = [Fault()] + [Fault(cut_after=3)] * 2
    llm = model(server, policy=SwitchPolicy(max_resumes=1))
    reasoning = ""
    with pytest.raises(EndpointError) as caught:
        async for chunk in llm.astream("What is 2 + 2?"):
            reasoning += chunk.additional_kwargs.get("reasoning_content", "")
    message = str(caught.value)
    assert f"the stream from {server.base_url} broke after sending text, 2 times" in message
    assert "(the request and 1 resume from the text so far" in message
    partial = caught.value.partial
    assert partial is not None and reasoning and partial.reasoning.startswith(reasoning.strip())
    assert server.models["small"].requests  # a hand-off happened before the breaks
