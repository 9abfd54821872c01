"""RelayLLM with LlamaIndex agents and pipelines, on the scripted server whose models answer
like a capable reasoning model (a random tiny model cannot pick tools)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from llama_index.core.agent.workflow import (
    AgentOutput,
    AgentStream,
    FunctionAgent,
    ToolCallResult,
)
from llama_index.core.tools import FunctionTool
from llama_index.llms.openai_like import OpenAILike
from pydantic import BaseModel

from examples.llama_index_agent import build_agent
from relay_integrations.llama_index import RelayLLM
from relay_integrations.testing.qwen3_template import ASSISTANT
from relay_integrations.testing.scripted_vllm import ScriptedModel, ScriptedVLLM, serving
from tests.fakes.capable_model import capable, relay_fields

POPULATIONS = {"paris": 2_102_650}


def get_population(city: str) -> int:
    """The population of a city."""
    return POPULATIONS[city.strip().lower()]


def multiply(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


TOOLS = [FunctionTool.from_defaults(get_population), FunctionTool.from_defaults(multiply)]


def relay_llm(server: ScriptedVLLM, **fields: object) -> RelayLLM:
    return RelayLLM(**relay_fields(server.base_url, **fields))


async def test_a_function_agent_streams_through_a_two_step_tool_task(server: ScriptedVLLM) -> None:
    agent = build_agent(relay_llm(server))  # the agent of examples/llama_index_agent.py
    handler = agent.run("Use get_population for Paris, then multiply it by 3.")
    calls, streamed = [], []
    async for event in handler.stream_events():
        if isinstance(event, ToolCallResult):
            calls.append((event.tool_name, event.tool_kwargs, event.tool_output.raw_output))
        elif isinstance(event, AgentStream):
            streamed.append(event)
    result = await handler
    assert calls == [
        ("get_population", {"city": "Paris"}, POPULATIONS["paris"]),
        ("multiply", {"a": POPULATIONS["paris"], "b": 3}, POPULATIONS["paris"] * 3),
    ]
    assert str(POPULATIONS["paris"] * 3) in str(result)
    assert any(e.thinking_delta for e in streamed)  # the reasoning streamed as thinking
    assert all(e.delta is not None for e in streamed)


def test_a_vector_store_query_engine_answers_from_its_documents(server: ScriptedVLLM) -> None:
    """The example's index: real local embeddings (all-MiniLM-L6-v2 on numpy), the answer
    written by the relay from the retrieved context."""
    from llama_index.core import VectorStoreIndex

    from examples.llama_index_rag import documents, local_embedding

    index = VectorStoreIndex.from_documents(documents(), embed_model=local_embedding())
    engine = index.as_query_engine(llm=relay_llm(server), similarity_top_k=2)
    response = engine.query("How far ahead may non-members book the 60 cm reflector?")
    assert response.source_nodes[0].node.ref_doc_id == "telescope-booking"
    assert "non-members may book up to 3 days ahead" in str(response)


def test_a_react_agent_completes_a_two_step_tool_task(server: ScriptedVLLM) -> None:
    from llama_index.core.agent.workflow import ReActAgent

    agent = ReActAgent(tools=TOOLS, llm=relay_llm(server))
    answer, called = asyncio.run(
        _run(agent, "Use get_population for Paris, then multiply it by 3.")
    )
    assert called == ["get_population", "multiply"]
    assert str(POPULATIONS["paris"] * 3) in answer


def endless_thinker(prompt: str, body: dict[str, object]) -> str:
    """A capable model that would think far past any budget before answering."""
    chat = prompt[: prompt.rfind(ASSISTANT) + len(ASSISTANT)]  # up to the open assistant turn
    generated = prompt[len(chat) :]
    full = capable(chat, dict(body))
    reasoning, _, answer = full.partition("\n</think>\n\n")
    padded = reasoning + " Let me think about it once more." * 400
    if "</think>" in generated:  # the relay closed the reasoning: answer now
        return "\n\n" + answer
    return (padded + "\n</think>\n\n" + answer)[len(generated) :]


def test_a_react_agent_gets_an_answer_from_a_model_that_would_think_forever() -> None:
    """The budget runs out inside the reasoning: the relay closes it while the answer's
    reserve is left (at most a quarter of max_tokens), so ReActAgent gets a parsable step
    every time and never enters its empty-answer retry loop."""
    from llama_index.core.agent.workflow import ReActAgent

    large = ScriptedModel("large", "", respond=endless_thinker)
    small = ScriptedModel("small", "", respond=endless_thinker)
    with serving(ScriptedVLLM(large, small)) as thinker:
        llm = relay_llm(thinker, max_tokens=400, context_window=8192)
        agent = ReActAgent(tools=TOOLS, llm=llm)
        answer, called = asyncio.run(
            _run(agent, "Use get_population for Paris, then multiply it by 3.")
        )
        prompts = [r["prompt"] for r in small.requests]
    assert called == ["get_population", "multiply"]
    assert str(POPULATIONS["paris"] * 3) in answer
    # each of the three steps closed its reasoning at 300 of 400 tokens and answered at once
    assert sum(p.endswith("\n</think>") for p in prompts) == 3
    assert not any("Error while parsing" in p or "FAILURE" in p for p in prompts)


async def _run(agent: Any, question: str) -> tuple[str, list[str]]:
    """The agent's final answer and the tools it called, in order."""
    handler = agent.run(question)
    called = [e.tool_name async for e in handler.stream_events() if isinstance(e, ToolCallResult)]
    return str(await handler), called


def test_settings_llm_serves_a_query_engine(server: ScriptedVLLM) -> None:
    from llama_index.core import Settings, VectorStoreIndex

    from examples.llama_index_rag import documents, local_embedding

    index = VectorStoreIndex.from_documents(documents(), embed_model=local_embedding())
    previous = Settings._llm
    Settings.llm = relay_llm(server)
    try:
        response = index.as_query_engine(similarity_top_k=1).query(
            "How much is a yearly membership for students under 26?"
        )
    finally:
        Settings._llm = previous
    assert "60 euros for students under 26" in str(response)


def test_as_structured_llm_returns_a_valid_object(server: ScriptedVLLM) -> None:
    from llama_index.core.base.llms.types import ChatMessage
    from pydantic import BaseModel

    class Weather(BaseModel):
        """A weather report."""

        city: str
        degrees: int

    structured = relay_llm(server).as_structured_llm(Weather)
    response = structured.chat(
        [ChatMessage(role="user", content="Report the weather in Paris: 21 degrees.")]
    )
    assert response.raw == Weather(city="Paris", degrees=21)


def test_no_tool_call_is_an_error_only_when_asked(server: ScriptedVLLM) -> None:
    llm = relay_llm(server)
    response = llm.chat_with_tools(TOOLS, user_msg="Hello!")  # a greeting calls no tool
    assert llm.get_tool_calls_from_response(response, error_on_no_tool_call=False) == []
    with pytest.raises(ValueError, match="expected a tool call, got none; the answer was"):
        llm.get_tool_calls_from_response(response)


class Population(BaseModel):
    """The population of a city."""

    city: str
    population: int


async def test_a_function_agent_with_output_cls_returns_the_schema_filled_from_the_tool(
    server: ScriptedVLLM,
) -> None:
    """FunctionAgent runs its tool loop without the schema, then asks once more for the
    structured response: ``as_structured_llm(output_cls)`` on the whole conversation (wrapped
    in XML, one user message), which the relay answers as a forced call."""
    agent = FunctionAgent(
        tools=[FunctionTool.from_defaults(get_population)],
        llm=relay_llm(server),
        output_cls=Population,
    )
    result: Any = await agent.run("Use get_population for Paris.")
    assert isinstance(result, AgentOutput)
    assert [(c.tool_name, c.tool_kwargs) for c in result.tool_calls] == [
        ("get_population", {"city": "Paris"})
    ]
    assert result.structured_response == {"city": "Paris", "population": POPULATIONS["paris"]}
    last = server.models["small"].requests[-1]  # the structured response's request
    schema = last["structured_outputs"]["json"]
    assert schema["properties"]["name"] == {"const": "Population"}


@pytest.mark.parametrize("strict", [None, False, True])
@pytest.mark.parametrize("field", [False, True])
def test_tools_are_sent_as_openai_like_sends_them(
    server: ScriptedVLLM, strict: bool | None, field: bool
) -> None:
    """The chat template renders the tools into the prompt: the relay's are OpenAILike's
    (a function-calling model's), field for field, whatever ``strict`` says."""
    tools = [FunctionTool.from_defaults(get_population), FunctionTool.from_defaults(add)]
    like = OpenAILike(model="m", api_base=server.base_url, is_function_calling_model=True)
    like.strict = field
    expected = like._prepare_chat_with_tools(tools, "q", strict=strict)["tools"]
    llm = relay_llm(server, strict=field)
    assert llm._prepare_chat_with_tools(tools, "q", strict=strict)["tools"] == expected


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


async def test_strict_tools_constrain_each_call_to_the_tool_s_schema(server: ScriptedVLLM) -> None:
    """``strict=True`` (as LlamaIndex's OpenAI takes it) holds every <tool_call> block to the
    tool's parameters; without it the answer is free."""
    tool = FunctionTool.from_defaults(get_population)
    llm = relay_llm(server)
    response = await llm.achat_with_tools([tool], "Use get_population for Paris.", strict=True)
    (selection,) = llm.get_tool_calls_from_response(response)
    assert (selection.tool_name, selection.tool_kwargs) == ("get_population", {"city": "Paris"})
    tag = json.loads(server.models["small"].requests[-1]["structured_outputs"]["structural_tag"])
    assert tag["format"]["type"] == "triggered_tags"
    call = tag["format"]["tags"][0]["content"]["json_schema"]
    sent = {**tool.metadata.get_parameters_dict(), "additionalProperties": False}
    assert call["properties"]["arguments"] == sent
    await llm.achat_with_tools([tool], "Use get_population for Paris.")
    assert "structured_outputs" not in server.models["small"].requests[-1]
    # OpenAILike's constructor field: strict unless a call says otherwise
    strict_llm = relay_llm(server, strict=True)
    await strict_llm.achat_with_tools([tool], "Use get_population for Paris.")
    tag = json.loads(server.models["small"].requests[-1]["structured_outputs"]["structural_tag"])
    assert tag["format"]["type"] == "triggered_tags"
    await strict_llm.achat_with_tools([tool], "Use get_population for Paris.", strict=False)
    assert "structured_outputs" not in server.models["small"].requests[-1]
