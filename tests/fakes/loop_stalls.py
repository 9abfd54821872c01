"""The loop-stall fixture of the component and integration tiers: in either, a test fails
when any event loop of the process (pytest-asyncio's, ``asyncio.run`` inside sync code, the
relay's background loop, a scripted server's thread) had one callback hold its thread over
50 ms (:mod:`relay_integrations.testing.loop_monitor`; time spent waiting for a CPU does not
count, so a loaded CI machine does not fail tests). A tier's conftest imports the fixtures
(tests/component/conftest.py and tests/integration/conftest.py do)::

    from tests.fakes.loop_stalls import loop_monitor, no_loop_stalls  # noqa: F401

What a framework loads once a process (LlamaIndex's default tokenizer) is loaded before the
monitor starts. A test that blocks a loop on purpose (to show what the monitor or a guard does about it) says
so with ``@pytest.mark.blocks_loop``. ``RELAY_LOOP_MONITOR=report`` fails no test and prints,
at the end, how long the callbacks seen in two samples or more held their loops (the noise of
a machine).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from llama_index.core.utils import get_tokenizer

from relay_integrations.testing.loop_monitor import LoopMonitor, LoopStalled

REPORT = os.environ.get("RELAY_LOOP_MONITOR") == "report"
_MONITOR = LoopMonitor(threshold=0.05)
"""One for the whole session, whichever tiers run (a second would sample the same threads)."""


@pytest.fixture(scope="session")
def loop_monitor() -> Iterator[LoopMonitor]:
    # a framework's one-time load, made on whatever loop first asks for it: LlamaIndex's
    # default tokenizer (tiktoken's table, ~130 ms, on an agent's first memory buffer)
    get_tokenizer()
    _MONITOR.start()
    yield _MONITOR
    if REPORT:
        print(f"\nloop monitor: {_summary(_MONITOR.held)}")


@pytest.fixture(autouse=True)
def no_loop_stalls(request: pytest.FixtureRequest, loop_monitor: LoopMonitor) -> Iterator[None]:
    """Fail the test (at its teardown) if a loop stalled while it ran, with where."""
    before = loop_monitor.take()  # in fixtures of a wider scope, set up for this test
    yield
    stalls = before + loop_monitor.take()
    if REPORT:
        for stall in stalls:
            print(f"\nloop monitor, {request.node.nodeid}: {stall}")
    elif stalls and request.node.get_closest_marker("blocks_loop") is None:
        raise LoopStalled(stalls)


def _summary(held: list[float]) -> str:
    if not held:
        return "no callback was seen in two samples"
    ordered = sorted(held)
    at = {q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] for q in (0.5, 0.9, 0.99)}
    return (
        f"{len(held)} callbacks seen in two samples or more; held ms: median "
        f"{at[0.5] * 1e3:.1f}, p90 {at[0.9] * 1e3:.1f}, p99 {at[0.99] * 1e3:.1f}, "
        f"max {ordered[-1] * 1e3:.1f}"
    )
