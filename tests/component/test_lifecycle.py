"""Relay models cost one shared thread per process, and close their connections: explicitly
(``close``, ``aclose``, ``with``), or when they are dropped. A thousand models made, used and
dropped leave the process's threads and file descriptors where they were."""

from __future__ import annotations

import asyncio
import gc
import resource
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from langchain_core.runnables import ConfigurableField
from llama_index.core.base.llms.types import ChatMessage

from relay_integrations.chat.settings import RelaySettings
from relay_integrations.langchain import RelayChatModel
from relay_integrations.llama_index import RelayLLM
from relay_integrations.testing.scripted_vllm import ScriptedVLLM
from tests.fakes.capable_model import relay_fields
from tests.fakes.descriptors import connections_to, open_fds, open_sockets

QUESTION = "What is 2 + 2?"


@contextmanager
def fd_limit(headroom: int) -> Iterator[None]:
    """The process may open only `headroom` more files than it has open now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (open_fds() + headroom, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def settle(expected_fds: int, expected_threads: int, seconds: float = 10.0) -> tuple[int, int]:
    """Collect garbage and wait until the counts fall to the expected ones (closing a
    connection is asynchronous on both ends), or time out; the last counts."""
    deadline = time.monotonic() + seconds
    while True:
        gc.collect()
        fds, threads = open_fds(), threading.active_count()
        if (fds <= expected_fds and threads <= expected_threads) or time.monotonic() > deadline:
            return fds, threads
        time.sleep(0.05)


def use(model: RelaySettings) -> str:
    if isinstance(model, RelayChatModel):
        return str(model.invoke(QUESTION).text)
    assert isinstance(model, RelayLLM)
    return str(model.chat([ChatMessage(role="user", content=QUESTION)]).message.content)


async def ause(model: RelaySettings) -> str:
    if isinstance(model, RelayChatModel):
        return str((await model.ainvoke(QUESTION)).text)
    assert isinstance(model, RelayLLM)
    response = await model.achat([ChatMessage(role="user", content=QUESTION)])
    return str(response.message.content)


def touch(model: RelaySettings) -> None:
    """A cheap call that opens connections: a token count, or the served context window."""
    if isinstance(model, RelayChatModel):
        assert model.get_num_tokens(QUESTION) > 0
    else:
        assert isinstance(model, RelayLLM)
        assert model.metadata.context_window == 4096


def test_a_thousand_models_used_and_dropped_leave_no_threads_or_connections(
    server: ScriptedVLLM,
) -> None:
    fields: dict[str, Any] = relay_fields(server.base_url, max_tokens=64)
    use(RelayChatModel(**fields))  # imports, the shared loop's thread, the server's workers
    use(RelayLLM(**fields))
    fds_before, threads_before = settle(0, 0, seconds=0.5)

    peak_threads = 0
    for index in range(1000):
        model = (RelayChatModel if index % 2 else RelayLLM)(**fields)
        if index % 10:
            touch(model)
        else:  # every tenth a whole generation, with the switches' requests
            assert use(model) == "The answer is 4."
        peak_threads = max(peak_threads, threading.active_count())
        del model

    fds_after, threads_after = settle(fds_before, threads_before)
    print(
        f"\n1000 models: threads {threads_before} -> {threads_after} (peak {peak_threads}), "
        f"open fds {fds_before} -> {fds_after}"
    )
    assert peak_threads == threads_before  # no thread per model
    assert threads_after == threads_before
    assert fds_after <= fds_before


async def test_async_models_dropped_on_the_callers_loop_close_there(server: ScriptedVLLM) -> None:
    fields: dict[str, Any] = relay_fields(server.base_url, max_tokens=64)
    await ause(RelayChatModel(**fields))
    before = connections_to(server.base_url)
    for _ in range(100):
        assert await ause(RelayChatModel(**fields)) == "The answer is 4."
    for _ in range(50):  # the finalizers' closes run on this loop: let them
        gc.collect()
        await asyncio.sleep(0.02)
        if connections_to(server.base_url) <= before:
            break
    assert connections_to(server.base_url) <= before


def test_configurable_fields_do_not_grow_threads(server: ScriptedVLLM) -> None:
    model = RelayChatModel(**relay_fields(server.base_url, max_tokens=64)).configurable_fields(
        temperature=ConfigurableField(id="temperature")
    )
    model.invoke(QUESTION)
    threads = threading.active_count()
    for step in range(20):
        model.invoke(QUESTION, config={"configurable": {"temperature": step / 20}})
    assert threading.active_count() <= threads


def settle_connections(base_url: str, expected: int, seconds: float = 10.0) -> int:
    """This process's connections to `base_url` once they fall to `expected` (garbage
    collected, closes run), or after `seconds`. Counted by the server's port, not as all
    the process's files: other tests' sockets closing meanwhile do not move it."""
    deadline = time.monotonic() + seconds
    while True:
        gc.collect()
        count = connections_to(base_url)
        if count <= expected or time.monotonic() > deadline:
            return count
        time.sleep(0.05)


@pytest.mark.parametrize("adapter", [RelayChatModel, RelayLLM])
def test_close_and_the_context_manager_close_the_connections(
    server: ScriptedVLLM, adapter: type[RelaySettings]
) -> None:
    fields: dict[str, Any] = relay_fields(server.base_url, max_tokens=64)
    idle = settle_connections(server.base_url, 0)
    model = adapter(**fields)
    use(model)
    assert connections_to(server.base_url) > idle  # kept alive for the next call
    model.close()
    assert settle_connections(server.base_url, idle) <= idle
    assert use(model) == "The answer is 4."  # a closed model opens new connections
    with adapter(**fields) as managed:
        use(managed)
    model.close()
    assert settle_connections(server.base_url, idle) <= idle


@pytest.mark.blocks_loop  # the sync call inside waits on the loop's thread, on purpose
@pytest.mark.parametrize("adapter", [RelayChatModel, RelayLLM])
async def test_aclose_and_async_with_close_the_connections(
    server: ScriptedVLLM, adapter: type[RelaySettings]
) -> None:
    fields: dict[str, Any] = relay_fields(server.base_url, max_tokens=64)
    idle = settle_connections(server.base_url, 0)
    async with adapter(**fields) as model:
        await ause(model)
        use(model)  # the sync path too: its connections live on the shared loop
        assert connections_to(server.base_url) > idle
    for _ in range(100):
        if connections_to(server.base_url) <= idle:
            break
        await asyncio.sleep(0.02)
    assert connections_to(server.base_url) <= idle


LOOPS = 300
LOOP_HEADROOM = 64
"""Files a model called on 300 event loops may open beyond those open before: two sockets a
loop (one to each model) kept after each loop would need 600."""


@pytest.mark.parametrize("adapter", [RelayChatModel, RelayLLM])
def test_a_model_called_on_a_new_event_loop_each_time_keeps_no_sockets_per_loop(
    server: ScriptedVLLM, adapter: type[RelaySettings]
) -> None:
    """``asyncio.run(model.ainvoke(...))`` again and again (scripts, notebooks, task queues):
    each loop's connections close as the loop ends, so the count stays where it was."""
    model = adapter(**relay_fields(server.base_url, max_tokens=64))
    asyncio.run(ause(model))  # the server's window, learned once
    before, counts = open_sockets(), []
    with fd_limit(LOOP_HEADROOM):
        for index in range(LOOPS):
            assert asyncio.run(ause(model)) == "The answer is 4."
            if index % 50 == 49:
                counts.append(open_sockets() - before)
    print(f"\n{adapter.__name__}: sockets beyond the {before} before, every 50 loops: {counts}")
    assert max(counts) <= 4, counts  # a loop's two, and the server's ends closing behind


def test_models_shared_by_threads_each_running_loops_keep_no_sockets_per_loop(
    server: ScriptedVLLM,
) -> None:
    """Worker threads (Celery, a thread pool) each calling ``asyncio.run`` on shared models."""
    fields: dict[str, Any] = relay_fields(server.base_url, max_tokens=64)
    models: list[RelaySettings] = [RelayChatModel(**fields), RelayLLM(**fields)]
    for model in models:
        asyncio.run(ause(model))
    threads, per_thread = 6, LOOPS // 6
    failures: list[BaseException] = []

    def work(model: RelaySettings) -> None:
        try:
            for _ in range(per_thread):
                assert asyncio.run(ause(model)) == "The answer is 4."
        except BaseException as failure:  # reported by the test's thread
            failures.append(failure)

    before = open_sockets()
    with fd_limit(LOOP_HEADROOM):
        workers = [
            threading.Thread(target=work, args=(models[index % 2],)) for index in range(threads)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    assert not failures, failures
    after = settle_sockets(before)
    print(f"\n{threads} threads x {per_thread} loops: sockets {before} -> {after}")
    assert after <= before


def settle_sockets(expected: int, seconds: float = 10.0) -> int:
    """The open sockets once they fall to `expected` (the server closes its ends of closed
    connections a moment later), or after `seconds`."""
    deadline = time.monotonic() + seconds
    while (count := open_sockets()) > expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return count
