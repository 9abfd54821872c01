"""A LangChain agent (``langchain.agents.create_agent``) on RelayChatModel completes a
two-step tool task, on the scripted server whose models answer like a capable model. This is
the agent of examples/langchain_agent.py."""

from __future__ import annotations

from langchain_core.messages import AIMessage, ToolMessage

from examples.langchain_agent import POPULATIONS, build_agent
from relay_integrations.langchain import RelayChatModel
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
