"""RelayLLM's streamed structured output and token counts, on the scripted server whose models
answer like a capable reasoning model: the partial objects grow to the non-streamed object,
and LlamaIndex's token counter sees the relay's usage over both models."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.callbacks import CallbackManager, TokenCountingHandler
from llama_index.core.prompts import PromptTemplate
from pydantic import BaseModel

from relay_integrations.llama_index import RelayLLM
from relay_integrations.relay.result import RelayResult
from relay_integrations.testing.qwen3_template import tokenize
from relay_integrations.testing.scripted_vllm import ScriptedVLLM, serving
from tests.fakes.capable_model import capable_server, relay_fields


class Weather(BaseModel):
    """A weather report."""

    city: str
    degrees: int


PROMPT = PromptTemplate("Report the weather in {city}: 21 degrees.")
ASKED = [ChatMessage(role="user", content="Report the weather in Paris: 21 degrees.")]
QUESTION = [ChatMessage(role="user", content="What is 2 + 3?")]


@pytest.fixture
def server() -> Iterator[ScriptedVLLM]:
    """A fresh upstream for each test: the token-count tests add up every request it saw."""
    with serving(capable_server()) as running:
        yield running


def relay_llm(server: ScriptedVLLM, **fields: object) -> RelayLLM:
    return RelayLLM(**relay_fields(server.base_url, **fields))


# -- structured output ---------------------------------------------------------------------


def assert_grows_to(partials: list[Any], final: Weather) -> None:
    """Each partial says no more than the final object (strings as far as written), the
    number of fields set never falls, and the object is built in steps: none, the city
    alone, then both. The last partial is the final object itself."""
    assert partials[-1] == final and isinstance(partials[-1], Weather)
    counts = []
    for partial in partials:
        fields = {k: v for k, v in partial.model_dump().items() if v is not None}
        for name, value in fields.items():
            expected = getattr(final, name)
            assert expected.startswith(value) if isinstance(value, str) else value == expected
        counts.append(len(fields))
    assert counts == sorted(counts)
    assert {0, 1, 2} <= set(counts), counts


def test_stream_structured_predict_grows_to_the_predicted_object(server: ScriptedVLLM) -> None:
    llm = relay_llm(server)
    final = llm.structured_predict(Weather, PROMPT, city="Paris")
    assert final == Weather(city="Paris", degrees=21)
    assert_grows_to(list(llm.stream_structured_predict(Weather, PROMPT, city="Paris")), final)


async def test_astream_structured_predict_grows_to_the_predicted_object(
    server: ScriptedVLLM,
) -> None:
    llm = relay_llm(server)
    final = await llm.astructured_predict(Weather, PROMPT, city="Paris")
    stream = await llm.astream_structured_predict(Weather, PROMPT, city="Paris")
    assert_grows_to([partial async for partial in stream], final)


def test_a_structured_llm_streams_growing_objects(server: ScriptedVLLM) -> None:
    structured = relay_llm(server).as_structured_llm(Weather)
    final = structured.chat(ASKED).raw
    responses = list(structured.stream_chat(ASKED))
    assert_grows_to([r.raw for r in responses], final)
    assert responses[-1].message.content == final.model_dump_json()


async def test_a_structured_llm_streams_growing_objects_async(server: ScriptedVLLM) -> None:
    structured = relay_llm(server).as_structured_llm(Weather)
    final = (await structured.achat(ASKED)).raw
    stream = await structured.astream_chat(ASKED)
    assert_grows_to([r.raw async for r in stream], final)


def test_the_streamed_structured_call_is_forced_upstream(server: ScriptedVLLM) -> None:
    """LlamaIndex's stream_call does not ask for the tool: the relay names it as the choice,
    so the answer requests carry the forced-call schema."""
    list(relay_llm(server).stream_structured_predict(Weather, PROMPT, city="Paris"))
    bodies = [b for m in server.models.values() for b in m.requests]
    forced = [b["structured_outputs"]["json"] for b in bodies if "structured_outputs" in b]
    assert forced and all(s["properties"]["name"] == {"const": "Weather"} for s in forced)


def test_streamed_tool_calls_ride_in_additional_kwargs_and_blocks(server: ScriptedVLLM) -> None:
    """Where LlamaIndex's streaming parsers look: a partial call in the message's
    ``tool_calls`` (OpenAI's form) and as a ToolCallBlock, with one id from start to end."""
    llm = relay_llm(server)
    responses = list(
        llm.stream_chat_with_tools(
            [_weather_tool()], chat_history=list(ASKED), tool_choice="Weather"
        )
    )
    with_calls = [r for r in responses if r.message.additional_kwargs.get("tool_calls")]
    assert len(with_calls) > 2  # the call shows while it is written, not only at the end
    ids = {c["id"] for r in with_calls for c in r.message.additional_kwargs["tool_calls"]}
    assert len(ids) == 1
    (last,) = llm.get_tool_calls_from_response(responses[-1])
    assert (last.tool_id, last.tool_name) == (ids.pop(), "Weather")
    assert last.tool_kwargs == {"city": "Paris", "degrees": 21}
    # the message sent back carries the call once, not once per place it is kept
    from relay_integrations.llama_index.messages import to_openai

    (sent,) = to_openai([responses[-1].message])
    assert len(sent["tool_calls"]) == 1


def _weather_tool() -> Any:
    from llama_index.core.program.function_program import get_function_tool

    return get_function_tool(Weather)


# -- token counts --------------------------------------------------------------------------


def _chat(llm: RelayLLM) -> Any:
    return llm.chat(QUESTION)


async def _achat(llm: RelayLLM) -> Any:
    return await llm.achat(QUESTION)


def _stream_chat(llm: RelayLLM) -> Any:
    return list(llm.stream_chat(QUESTION))[-1]


async def _astream_chat(llm: RelayLLM) -> Any:
    return [r async for r in await llm.astream_chat(QUESTION)][-1]


def _complete(llm: RelayLLM) -> Any:
    return llm.complete("What is 2 + 3?")


async def _acomplete(llm: RelayLLM) -> Any:
    return await llm.acomplete("What is 2 + 3?")


def _stream_complete(llm: RelayLLM) -> Any:
    return list(llm.stream_complete("What is 2 + 3?"))[-1]


async def _astream_complete(llm: RelayLLM) -> Any:
    return [r async for r in await llm.astream_complete("What is 2 + 3?")][-1]


CALLS: list[Callable[[RelayLLM], Any]] = [
    _chat,
    _achat,
    _stream_chat,
    _astream_chat,
    _complete,
    _acomplete,
    _stream_complete,
    _astream_complete,
]


@pytest.mark.parametrize("call", CALLS, ids=lambda f: f.__name__.lstrip("_"))
async def test_the_token_counter_sees_the_relays_usage(
    server: ScriptedVLLM, call: Callable[[RelayLLM], Any]
) -> None:
    counter = TokenCountingHandler()
    llm = relay_llm(server, callback_manager=CallbackManager([counter]))
    last = call(llm)
    if isinstance(last, Awaitable):
        last = await last
    usage = last.additional_kwargs  # the relay's result.prompt_tokens, completion_tokens, ...
    assert len(counter.llm_token_counts) == 1  # a completion is one event, not two
    assert counter.prompt_llm_token_count == usage["prompt_tokens"]
    assert counter.completion_llm_token_count == usage["completion_tokens"]
    # over both models and every request, as the servers counted the prompts
    requests = [b for m in server.models.values() for b in m.requests]
    assert {b["model"] for b in requests} == {"large", "small"}
    assert usage["prompt_tokens"] == sum(len(tokenize(b["prompt"])) for b in requests)
    # the reasoning is in the completion tokens
    assert 0 < usage["reasoning_tokens"] < usage["completion_tokens"]
    result = RelayResult.model_validate(last.raw["result"])  # and the whole result in raw
    assert (result.prompt_tokens, result.completion_tokens) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
    )
