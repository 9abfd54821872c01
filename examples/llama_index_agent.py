"""A LlamaIndex ``FunctionAgent`` on the relay: two tools, a task that needs both, in turn.

The large model reasons, the small one finishes its easy sentences and writes the answers;
the agent streams, its default. Point it at your two vLLM servers::

    export RELAY_LARGE__BASE_URL=http://gpu-a:8000/v1 RELAY_LARGE__MODEL=Qwen/Qwen3-32B
    export RELAY_SMALL__BASE_URL=http://gpu-b:8001/v1 RELAY_SMALL__MODEL=Qwen/Qwen3-1.7B
    python examples/llama_index_agent.py

Tool calling needs models that can call tools (Qwen3, for example); the tiny models of the
test suite and the Gemma 270M demo cannot. ``tests/component/test_llama_index_scripted.py`` runs
this same agent against a scripted server that answers like a capable model.
"""

from __future__ import annotations

import asyncio

from llama_index.core.agent.workflow import AgentStream, FunctionAgent, ToolCallResult
from llama_index.core.tools import FunctionTool

from relay_integrations.llama_index import RelayLLM

POPULATIONS = {"paris": 2_102_650, "lyon": 522_250, "berlin": 3_878_100}


def get_population(city: str) -> int:
    """The population of a city."""
    return POPULATIONS[city.strip().lower()]


def multiply(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


def build_agent(llm: RelayLLM) -> FunctionAgent:
    return FunctionAgent(
        tools=[FunctionTool.from_defaults(get_population), FunctionTool.from_defaults(multiply)],
        llm=llm,
        system_prompt="Answer with the tools; call one tool at a time.",
    )


async def main() -> None:
    agent = build_agent(RelayLLM.from_env(max_tokens=8192))
    handler = agent.run("Use get_population for Paris, then multiply it by 3.")
    async for event in handler.stream_events():
        if isinstance(event, AgentStream) and event.thinking_delta:
            print(event.thinking_delta, end="", flush=True)
        elif isinstance(event, AgentStream):
            print(event.delta, end="", flush=True)
        elif isinstance(event, ToolCallResult):
            print(f"\n[{event.tool_name}({event.tool_kwargs}) -> {event.tool_output.raw_output}]")
    print("\n\nanswer:", await handler)


if __name__ == "__main__":
    asyncio.run(main())
