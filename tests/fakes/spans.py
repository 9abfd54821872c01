"""A tracer provider for one test, its spans kept by the SDK's in-memory exporter::

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


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """A tracer provider set for the test (and unset after it: the API sets one a process,
    the SDK's own tests reset it the same way)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace.set_tracer_provider(provider)
    yield exporter
    provider.shutdown()
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None
