"""Every connection a relay model opened on an event loop is closed by ``close()`` (or the
context manager), whatever made and ended the loops: ``asyncio.run``, ``run_until_complete``
then ``loop.close()`` without shutting down async generators, a loop left open, LlamaIndex's
``run_async_tasks`` (which runs on a loop it gets or makes, in a thread of its own when one
runs already), loops in other threads, nested loops in nest_asyncio's style, a sync ``with``
inside a coroutine. The invariant: the process's open sockets are back to their count before
the model, and nothing said "Unclosed" (aiohttp's sessions and connectors, asyncio's
transports: ResourceWarning, or asyncio's error log), after a garbage collection."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
import time
import warnings
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from llama_index.core.async_utils import run_async_tasks
from llama_index.core.base.llms.types import ChatMessage

from relay_integrations.chat.settings import RelaySettings
from relay_integrations.langchain import RelayChatModel
from relay_integrations.llama_index import RelayLLM
from relay_integrations.testing.scripted_vllm import ScriptedVLLM
from tests.fakes.capable_model import relay_fields
from tests.fakes.descriptors import open_sockets

QUESTION = "What is 2 + 2?"
CALLS = 3
"""Concurrent calls a loop runs: each holds its own connections to both servers."""

Calls = Callable[[], list[Coroutine[Any, Any, str]]]
"""A fresh set of the model's calls (coroutines run once)."""


async def ask(model: RelaySettings) -> str:
    if isinstance(model, RelayChatModel):
        return str((await model.ainvoke(QUESTION)).text)
    assert isinstance(model, RelayLLM)
    response = await model.achat([ChatMessage(role="user", content=QUESTION)])
    return str(response.message.content)


async def gathered(calls: Calls) -> list[str]:
    return list(await asyncio.gather(*calls()))


def with_asyncio_run(calls: Calls) -> list[str]:
    return asyncio.run(gathered(calls))


def run_until_complete_then_close(calls: Calls) -> list[str]:
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(gathered(calls))
    finally:
        loop.close()  # no shutdown_asyncgens: the relay hears nothing of the loop's end


def run_until_complete_left_open(calls: Calls) -> list[str]:
    return LEFT_OPEN.run_until_complete(gathered(calls))


LEFT_OPEN = asyncio.new_event_loop()
"""A loop run and never closed (as a script's ``get_event_loop()`` loop)."""


def llama_index_run_async_tasks(calls: Calls) -> list[str]:
    return list(run_async_tasks(calls()))


def llama_index_run_async_tasks_inside_a_loop(calls: Calls) -> list[str]:
    """From sync code called by a coroutine: LlamaIndex runs the tasks on a new loop in a
    thread of its own and closes it (its caller's loop waits, as sync code makes it)."""

    async def main() -> list[str]:
        return list(run_async_tasks(calls()))

    return asyncio.run(main())


def in_another_thread(calls: Calls) -> list[str]:
    results: list[list[str]] = []
    worker = threading.Thread(target=lambda: results.append(run_until_complete_then_close(calls)))
    worker.start()
    worker.join()
    return results[0]


def nested_in_a_running_loop(calls: Calls) -> list[str]:
    """nest_asyncio's style: a running loop runs a second one to completion inside a
    callback, as ``run_until_complete`` on a patched loop does (here on a loop of its own,
    which the standard library allows from a thread that runs another, through a helper
    that clears the running loop around it)."""

    async def main() -> list[str]:
        inner = asyncio.new_event_loop()
        running = asyncio.events._get_running_loop()
        asyncio.events._set_running_loop(None)
        try:
            return inner.run_until_complete(gathered(calls))
        finally:
            asyncio.events._set_running_loop(running)
            inner.close()

    return asyncio.run(main())


LOOPS: dict[str, Callable[[Calls], list[str]]] = {
    "asyncio.run": with_asyncio_run,
    "run_until_complete then close": run_until_complete_then_close,
    "run_until_complete left open": run_until_complete_left_open,
    "llama_index run_async_tasks": llama_index_run_async_tasks,
    "run_async_tasks inside a loop": llama_index_run_async_tasks_inside_a_loop,
    "a loop in another thread": in_another_thread,
    "nested in a running loop": nested_in_a_running_loop,
}


@contextmanager
def nothing_unclosed() -> Iterator[list[str]]:
    """Collects every "Unclosed ..." and ResourceWarning (as warnings, as exceptions that a
    finalizer could not raise, and as asyncio's error log) until the block ends and garbage
    is collected."""
    said: list[str] = []

    class Heard(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "nclosed" in record.getMessage():
                said.append(record.getMessage())

    heard, asyncio_log = Heard(), logging.getLogger("asyncio")
    asyncio_log.addHandler(heard)
    unraisable = sys.unraisablehook
    sys.unraisablehook = lambda u: said.append(f"{u.exc_type.__name__}: {u.exc_value}")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield said
            gc.collect()
            gc.collect()
        said.extend(
            str(w.message)
            for w in caught
            if issubclass(w.category, ResourceWarning) or "nclosed" in str(w.message)
        )
    finally:
        sys.unraisablehook = unraisable
        asyncio_log.removeHandler(heard)


def settled_sockets(expected: int, seconds: float = 10.0) -> int:
    """The open sockets once they fall to `expected` (the server's ends close a moment after
    the client's), or after `seconds`."""
    deadline = time.monotonic() + seconds
    while (count := open_sockets()) > expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return count


@pytest.mark.blocks_loop  # "run_async_tasks inside a loop" waits in a coroutine, as sync code does
@pytest.mark.parametrize("adapter", [RelayChatModel, RelayLLM])
@pytest.mark.parametrize("run", list(LOOPS.values()), ids=list(LOOPS))
def test_close_leaves_no_socket_and_no_unclosed_session_whatever_ran_the_loops(
    server: ScriptedVLLM, adapter: type[RelaySettings], run: Callable[[Calls], list[str]]
) -> None:
    fields = relay_fields(server.base_url, max_tokens=64)
    before = settled_sockets(0, seconds=0.5)
    with nothing_unclosed() as said:
        with adapter(**fields) as model:
            answers = run(lambda: [ask(model) for _ in range(CALLS)])
            answers += run(lambda: [ask(model) for _ in range(CALLS)])  # a second set of loops
        after = settled_sockets(before)
    assert answers == ["The answer is 4."] * 2 * CALLS
    assert said == []
    assert after <= before, f"{after - before} sockets left open"
