"""A LangChain agent on the relay: two tools, a task that needs both, in two steps.

The large model reasons, the small one finishes its easy sentences and writes the answers;
the agent loop is LangChain's ``create_agent``. Point it at your two vLLM servers::

    export RELAY_LARGE__BASE_URL=http://gpu-a:8000/v1 RELAY_LARGE__MODEL=Qwen/Qwen3-32B
    export RELAY_SMALL__BASE_URL=http://gpu-b:8001/v1 RELAY_SMALL__MODEL=Qwen/Qwen3-1.7B
    python examples/langchain_agent.py

Tool calling needs models that can call tools (Qwen3, for example); the tiny models of the
test suite and the Gemma 270M demo cannot. ``tests/component/test_langchain_agent_scripted.py``
runs this same agent against a scripted server that answers like a capable model.
"""

from __future__ import annotations

from typing import Any

from langchain.agents import create_agent
from langchain_core.tools import tool

from relay_integrations.langchain import RelayChatModel

POPULATIONS = {"paris": 2_102_650, "lyon": 522_250, "berlin": 3_878_100}


@tool
def get_population(city: str) -> int:
    """The population of a city."""
    return POPULATIONS[city.strip().lower()]


@tool
def multiply(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


def build_agent(llm: RelayChatModel) -> Any:
    """The agent graph (a LangGraph ``CompiledStateGraph``)."""
    return create_agent(
        llm,
        tools=[get_population, multiply],
        system_prompt="Answer with the tools; call one tool at a time.",
    )


def main() -> None:
    agent = build_agent(RelayChatModel.from_env(max_tokens=8192))
    result = agent.invoke(
        {"messages": [("user", "Use get_population for Paris, then multiply it by 3.")]}
    )
    for message in result["messages"]:
        message.pretty_print()
        reasoning = message.additional_kwargs.get("reasoning_content")
        if reasoning:
            print(f"(reasoning, {len(reasoning)} characters)")


if __name__ == "__main__":
    main()
