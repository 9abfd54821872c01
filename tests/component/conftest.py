"""The component tests' upstream: two capable scripted models ("large" and "small") served on
a thread of their own, like a real server, so that sync code and LlamaIndex (which reads its
sync ``metadata`` from inside its event loop) reach it alike. One per test module.

The component tests start servers (the scripted vLLM, ``relaygen serve`` in a thread) and
processes (upstreams, ``relaygen serve``, benchmarks); the unit tests (tests/unit) start none."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from relay_integrations.testing.scripted_vllm import ScriptedVLLM, serving
from tests.fakes.canary import (  # noqa: F401  (autouse: every test carries the canary)
    canary_environment,
    canary_everywhere,
    pytest_runtest_makereport,
)
from tests.fakes.capable_model import capable_server
from tests.fakes.loop_stalls import loop_monitor, no_loop_stalls  # noqa: F401  (autouse)
from tests.fakes.spans import spans, traced  # noqa: F401  (a tracer provider, on request)
from tests.fakes.unclosed import (  # noqa: F401  (autouse)
    no_module_dropped_unclosed,
    nothing_dropped_unclosed,
)


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedVLLM]:
    with serving(capable_server()) as running:
        yield running


@pytest.fixture(scope="module")
def server(upstream: ScriptedVLLM) -> ScriptedVLLM:
    """The same upstream, under the name the adapters' tests give it."""
    return upstream
