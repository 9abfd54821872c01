"""No event loop stalls: agents, engines and graphs on the relay run with the scripted server
served in the same loop (the async pattern of docs/testing.md), where any blocking call
would wait for an answer the loop itself has to write, and under the loop monitor, which
fails a test whose loop a callback held over 50 ms (tests/fakes/loop_stalls.py).

LlamaIndex reads ``llm.metadata`` synchronously inside its agents' async steps
(``ChatMemoryBuffer.from_defaults``): ``RelayLLM.metadata`` takes its window from the
configuration or from what a request learned, never from a call to the server while a loop
runs in the calling thread."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

import pytest
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.constants import DEFAULT_CONTEXT_WINDOW

from relay_integrations.langchain import RelayChatModel
from relay_integrations.llama_index import RelayLLM
from relay_integrations.testing.loop_monitor import LoopMonitor
from relay_integrations.testing.scripted_vllm import ScriptedVLLM
from tests.fakes.capable_model import capable_server, relay_fields

T = TypeVar("T")
DEADLINE = 60.0
"""Seconds an agent's whole run may take; a loop that blocks on its own server never ends,
and this deadline can only fire while the loop runs (pytest-timeout ends such a test)."""
SERVED_WINDOW = 4096
"""The scripted models' ``max_model_len``."""

pytestmark = pytest.mark.timeout(DEADLINE * 2)


@pytest.fixture(scope="module", autouse=True)
def _tokenizer_loaded() -> None:
    """LlamaIndex's agents count tokens with its global tokenizer (tiktoken), which builds
    its tables on first use, for about 0.2 s of CPU in whichever loop comes first: LlamaIndex's
    one-time cost, not the relay's, paid here before the loops under watch."""
    from llama_index.core.utils import get_tokenizer

    get_tokenizer()("warm")


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def within_deadline(work: Awaitable[T], monitor: LoopMonitor) -> T:
    """`work`'s result within the deadline, with no stall of any loop meanwhile."""
    monitor.take()
    result = await asyncio.wait_for(work, DEADLINE)
    assert monitor.take() == []
    return result


def relay_llm(server: ScriptedVLLM, **fields: Any) -> RelayLLM:
    return RelayLLM(**relay_fields(server.base_url, **fields))


async def test_a_function_agent_runs_against_a_server_in_its_own_loop(
    loop_monitor: LoopMonitor,
) -> None:
    from llama_index.core.agent.workflow import FunctionAgent

    async with capable_server() as server:
        llm = relay_llm(server)
        agent = FunctionAgent(tools=[add], llm=llm)
        result = await within_deadline(agent.run(user_msg="2+2?"), loop_monitor)
        await llm.aclose()
    assert "4" in str(result)


async def test_a_react_agent_runs_against_a_server_in_its_own_loop(
    loop_monitor: LoopMonitor,
) -> None:
    from llama_index.core.agent.workflow import ReActAgent

    async with capable_server() as server:
        llm = relay_llm(server)
        agent = ReActAgent(tools=[add], llm=llm)
        result = await within_deadline(agent.run(user_msg="Use add for 2 + 2."), loop_monitor)
        await llm.aclose()
    assert "4" in str(result)


async def test_an_agent_workflow_runs_against_a_server_in_its_own_loop(
    loop_monitor: LoopMonitor,
) -> None:
    from llama_index.core.agent.workflow import AgentWorkflow, FunctionAgent

    async with capable_server() as server:
        llm = relay_llm(server)
        adder = FunctionAgent(name="adder", description="Adds numbers.", tools=[add], llm=llm)
        workflow = AgentWorkflow(agents=[adder], root_agent="adder")
        result = await within_deadline(workflow.run(user_msg="2+2?"), loop_monitor)
        await llm.aclose()
    assert "4" in str(result)


QUESTION = "How far ahead may non-members book the 60 cm reflector?"
ANSWER = "non-members may book up to 3 days ahead"


async def test_a_query_engine_and_a_chat_engine_run_against_a_server_in_their_own_loop(
    loop_monitor: LoopMonitor,
) -> None:
    """A tiny index with no embeddings (a summary index): every prompt is packed by the
    window in ``metadata``, read inside the loop."""
    from llama_index.core import SummaryIndex
    from llama_index.core.chat_engine.types import ChatMode

    from examples.llama_index_rag import documents

    index = SummaryIndex.from_documents(
        [d for d in documents() if d.doc_id in ("telescope-booking", "membership")]
    )
    async with capable_server() as server:
        llm = relay_llm(server)
        engine = index.as_query_engine(llm=llm)
        answer = await within_deadline(engine.aquery(QUESTION), loop_monitor)
        chat = index.as_chat_engine(chat_mode=ChatMode.CONTEXT, llm=llm)
        reply = await within_deadline(chat.achat(QUESTION), loop_monitor)
        await llm.aclose()
    assert ANSWER in str(answer)
    assert reply.response and {n.node.ref_doc_id for n in reply.source_nodes} == {
        "telescope-booking",
        "membership",
    }


async def test_a_langchain_agent_streams_against_a_server_in_its_own_loop(
    loop_monitor: LoopMonitor,
) -> None:
    from langchain.agents import create_agent

    async with capable_server() as server:
        llm = RelayChatModel(**relay_fields(server.base_url))
        agent: Any = create_agent(llm, tools=[add])

        async def streamed() -> list[Any]:
            question = {"messages": [("user", "Use add for 2 + 2.")]}
            return [state async for state in agent.astream(question, stream_mode="values")]

        states = await within_deadline(streamed(), loop_monitor)
        await llm.aclose()
    final = states[-1]["messages"][-1]
    assert "4" in final.text
    assert any(getattr(m, "tool_calls", None) for m in states[-1]["messages"])


async def test_a_trimmer_counting_tokens_with_the_model_in_an_async_chain_stalls_nothing(
    loop_monitor: LoopMonitor,
) -> None:
    """``get_num_tokens_from_messages`` asks the server (``/tokenize``) and waits: a sync call.
    LangChain runs a sync step of an async chain (``trim_messages``' runnable) on a worker
    thread, where waiting holds up no loop; called directly inside a coroutine it would hold
    the caller's loop for the round trip (the caller's choice, as any sync call there)."""
    from langchain_core.messages import trim_messages

    async with capable_server() as server:
        llm = RelayChatModel(**relay_fields(server.base_url))
        trimmer = trim_messages(max_tokens=200, strategy="last", token_counter=llm)
        chain = trimmer | llm
        reply = await within_deadline(chain.ainvoke([("user", "What is 2 + 2?")]), loop_monitor)
        await llm.aclose()
    assert "4" in reply.text


# -- RelayLLM.metadata: configured, learned, or LlamaIndex's default; never asked in a loop --


async def test_metadata_in_a_loop_is_the_default_until_a_request_learns_the_window() -> None:
    async with capable_server() as server:
        llm = relay_llm(server)
        assert llm.metadata.context_window == DEFAULT_CONTEXT_WINDOW  # no call: the loop
        assert not server.models["large"].requests
        await llm.achat([ChatMessage(role="user", content="What is 2 + 2?")])
        assert llm.metadata.context_window == SERVED_WINDOW
        assert llm.metadata.num_output == min(llm.max_tokens, SERVED_WINDOW // 2)
        await llm.aclose()


async def test_a_configured_window_is_the_metadata_everywhere() -> None:
    async with capable_server() as server:
        llm = relay_llm(server, context_window=2048)
        assert llm.metadata.context_window == 2048
        await llm.aclose()


def test_metadata_read_from_sync_code_outside_a_loop_asks_the_server(
    server: ScriptedVLLM,
) -> None:
    with relay_llm(server, max_tokens=7) as llm:  # a client of its own: nothing learned yet
        assert llm.metadata.context_window == SERVED_WINDOW


def test_a_sync_chat_learns_the_window_for_metadata_read_later_in_a_loop(
    server: ScriptedVLLM,
) -> None:
    with relay_llm(server, max_tokens=9) as llm:
        llm.chat([ChatMessage(role="user", content="What is 2 + 2?")])

        async def read() -> int:
            return llm.metadata.context_window

        assert asyncio.run(read()) == SERVED_WINDOW
