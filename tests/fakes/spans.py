"""A tracer provider for one test, its spans kept by the SDK's in-memory exporter; at the
test's end no span (name, attributes, events: a recorded exception's message and stack
included) may hold the canary secret (:mod:`tests.fakes.canary`)::

from tests.fakes.spans import spans  # the fixture

async def test_something(spans: InMemorySpanExporter) -> None:
    ...
    finished = spans.get_finished_spans()
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from tests.fakes.canary import CANARY


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """A tracer provider set for the test (and unset after it: the API sets one a process,
    the SDK's own tests reset it the same way)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace.set_tracer_provider(provider)
    try:
        yield exporter
        for span in exporter.get_finished_spans():
            shown = span.to_json()  # name, attributes, events, status, resource
            assert CANARY not in shown, f"span {span.name!r} shows the canary secret: {shown}"
    finally:
        provider.shutdown()
        trace._TRACER_PROVIDER_SET_ONCE = Once()
        trace._TRACER_PROVIDER = None


@pytest.fixture(params=[False, True], ids=["untraced", "traced"])
def traced(request: pytest.FixtureRequest) -> bool:
    """The test twice: without a tracer provider, and with one (:func:`spans`): what the
    relay does must not depend on whether it is traced."""
    if request.param:
        request.getfixturevalue("spans")
    return bool(request.param)
