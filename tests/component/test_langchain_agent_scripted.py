"""A LangChain agent (``langchain.agents.create_agent``) on RelayChatModel completes a
two-step tool task, on the scripted server whose models answer like a capable model (the
agent of examples/langchain_agent.py), and returns a structured response filled from the
tools' results with each of LangChain's structured-output strategies."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.structured_output import ProviderStrategy, ToolStrategy
from langchain_core.messages import AIMessage, ToolMessage
from pydantic import BaseModel

from examples.langchain_agent import POPULATIONS, build_agent, get_population, multiply
from relay_integrations.langchain import RelayChatModel
from relay_integrations.testing.scripted_vllm import ScriptedVLLM
from tests.fakes.capable_model import capable_server, relay_fields


async def test_the_agent_calls_both_tools_in_turn_and_answers() -> None:
    async with capable_server() as server:
        agent = build_agent(RelayChatModel(**relay_fields(server.base_url)))
        state = await agent.ainvoke(
            {"messages": [("user", "Use get_population for Paris, then multiply it by 3.")]}
        )
    messages = state["messages"]
    calls = [c for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]
    assert [(c["name"], c["args"]) for c in calls] == [
        ("get_population", {"city": "Paris"}),
        ("multiply", {"a": POPULATIONS["paris"], "b": 3}),
    ]
    results = [m.content for m in messages if isinstance(m, ToolMessage)]
    assert results == [str(POPULATIONS["paris"]), str(float(POPULATIONS["paris"] * 3))]
    final = messages[-1]
    assert isinstance(final, AIMessage) and not final.tool_calls
    assert str(POPULATIONS["paris"] * 3) in final.text
    assert final.additional_kwargs["reasoning_content"]  # every step reasoned on the relay
    assert all(
        m.response_metadata["relay"]["switches"] == 2 for m in messages if isinstance(m, AIMessage)
    )


class Population(BaseModel):
    """The population of a city."""

    city: str
    population: int


def answer_constraints(server: ScriptedVLLM) -> list[dict[str, Any]]:
    """The ``structured_outputs`` of every answer request (the small model writes answers)."""
    return [
        r["structured_outputs"]
        for r in server.models["small"].requests
        if "structured_outputs" in r
    ]


@pytest.mark.parametrize(
    "response_format",
    [ProviderStrategy(Population), Population],
    ids=["provider-strategy", "raw-schema"],
)
async def test_with_the_provider_strategy_the_agent_calls_the_tool_then_answers_in_the_schema(
    response_format: Any,
) -> None:
    """A bare schema takes the provider strategy too (the profile says structured output):
    tools and ``response_format`` are bound together, and the answer may be either."""
    async with capable_server() as server:
        llm = RelayChatModel(**relay_fields(server.base_url))
        agent: Any = create_agent(llm, tools=[get_population], response_format=response_format)
        state = await agent.ainvoke({"messages": [("user", "Use get_population for Paris.")]})
        constraints = answer_constraints(server)
    calls = [c for m in state["messages"] if isinstance(m, AIMessage) for c in m.tool_calls]
    assert [(c["name"], c["args"]) for c in calls] == [("get_population", {"city": "Paris"})]
    assert state["structured_response"] == Population(city="Paris", population=POPULATIONS["paris"])
    final = state["messages"][-1]
    assert isinstance(final, AIMessage) and not final.tool_calls
    assert json.loads(final.text) == {"city": "Paris", "population": POPULATIONS["paris"]}
    # both turns under the same grammar: a tool call or the schema, never the schema alone
    formats = [json.loads(c["structural_tag"])["format"] for c in constraints]
    assert [f["type"] for f in formats] == ["or", "or"]
    # the tools are strict, as ChatOpenAI makes them with a response format
    call = formats[0]["elements"][1]["tags"][0]["content"]["json_schema"]
    assert call["properties"]["arguments"] == {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    }


async def test_with_the_tool_strategy_the_agent_calls_the_tool_then_the_schema_tool() -> None:
    async with capable_server() as server:
        llm = RelayChatModel(**relay_fields(server.base_url))
        agent: Any = create_agent(
            llm, tools=[get_population], response_format=ToolStrategy(Population)
        )
        state = await agent.ainvoke({"messages": [("user", "Use get_population for Paris.")]})
    calls = [c for m in state["messages"] if isinstance(m, AIMessage) for c in m.tool_calls]
    assert [(c["name"], c["args"]) for c in calls] == [
        ("get_population", {"city": "Paris"}),
        ("Population", {"city": "Paris", "population": POPULATIONS["paris"]}),
    ]
    assert state["structured_response"] == Population(city="Paris", population=POPULATIONS["paris"])


class Product(BaseModel):
    value: float


async def test_a_two_step_task_ends_in_the_schema_filled_from_the_last_result() -> None:
    async with capable_server() as server:
        agent: Any = create_agent(
            RelayChatModel(**relay_fields(server.base_url)),
            tools=[get_population, multiply],
            response_format=Product,
        )
        question = "Use get_population for Paris, then multiply it by 3."
        state = await agent.ainvoke({"messages": [("user", question)]})
    calls = [c for m in state["messages"] if isinstance(m, AIMessage) for c in m.tool_calls]
    assert [c["name"] for c in calls] == ["get_population", "multiply"]
    assert state["structured_response"] == Product(value=POPULATIONS["paris"] * 3)
