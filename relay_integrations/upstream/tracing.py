"""OpenTelemetry spans of the relay's work, when the application has set a tracer provider.

Nothing here imports OpenTelemetry: spans are made only when the application has imported
``opentelemetry.trace`` and set a real tracer provider (``trace.set_tracer_provider``, or an
auto-instrumentation agent); otherwise every function returns at once and the relay pays one
dictionary lookup a request. With a provider set::

    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    # every generation now makes a "chat <model>" span, a span a segment beneath it, and a
    # CLIENT span a request to vLLM beneath those, whose W3C traceparent header goes with
    # the request (vLLM started with --otlp-traces-endpoint hangs its own spans under it)

Attribute names follow OpenTelemetry's GenAI semantic conventions where they have one
(``gen_ai.operation.name``, ``gen_ai.request.model``, ``gen_ai.usage.input_tokens``, ...) and
``relay.*`` for the rest. No header value is recorded, and no prompt or text unless the
conventions' opt-in asks for it (``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``:
the generation's ``gen_ai.input.messages`` and ``gen_ai.output.messages``, each segment's
``relay.segment.text``): by default a span carries no user data and no secret.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span as Span
    from opentelemetry.trace import Tracer

Purpose = Literal["completion", "resume", "first_request", "speculative_handoff", "warm_up"]
"""Why a completion was sent (``relay.request.purpose``): a turn's request (or any other,
such as a server check's), one that goes on from a broken stream, the large model's first
request (sent before the small model's prompt was rendered), a hand-off's request opened
ahead of its confirming token, a small model's prompt sent to warm its server's cache."""

AttributeValue = str | bool | int | float | Sequence[str]

SCOPE = "relay_integrations"
"""The instrumentation scope of every span the relay makes."""

_purpose: ContextVar[Purpose] = ContextVar("relay_request_purpose", default="completion")
_suppressed: ContextVar[bool] = ContextVar("relay_spans_suppressed", default=False)
_cached: tuple[object, Tracer] | None = None


def tracer() -> Tracer | None:
    """The tracer of the application's provider, or None when no provider is set (nothing
    imported, nothing made) or spans are :func:`suppressed` here."""
    global _cached
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None or _suppressed.get():
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return None
    if _cached is None or _cached[0] is not provider:
        _cached = (provider, provider.get_tracer(SCOPE, _version()))
    return _cached[1]


def _version() -> str | None:
    """The installed package's version (the instrumentation scope's), if it is installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("relay-integrations")
    except PackageNotFoundError:
        return None


def start(
    name: str,
    attributes: Mapping[str, AttributeValue],
    *,
    client: bool = False,
    parent: Span | None = None,
    server: Context | None = None,
) -> Span | None:
    """A span started now (None when not tracing): a child of `parent`, else of the current
    context's span; `client`: a request to a server (SpanKind.CLIENT); `server`: a request
    served, in the trace context its client sent (SpanKind.SERVER)."""
    traced = tracer()
    if traced is None:
        return None
    from opentelemetry import trace

    context: Context | None = server
    if server is not None:
        kind = trace.SpanKind.SERVER
    else:
        kind = trace.SpanKind.CLIENT if client else trace.SpanKind.INTERNAL
        context = trace.set_span_in_context(parent) if parent is not None else None
    return traced.start_span(name, context, kind, attributes=dict(attributes))


def finish(
    span: Span | None,
    attributes: Mapping[str, AttributeValue | None] = {},
    failure: BaseException | None = None,
    error: str | None = None,
) -> None:
    """End `span` with `attributes` (None values left out) and an error status: on
    `failure` (its exception recorded too) or `error` (what went wrong, no exception)."""
    if span is None:
        return
    span.set_attributes({key: value for key, value in attributes.items() if value is not None})
    if failure is not None or error is not None:
        from opentelemetry.trace import Status, StatusCode

        if failure is not None:
            span.record_exception(failure)
            error = type(failure).__name__
        span.set_status(Status(StatusCode.ERROR, error))
    span.end()


def traceparent(span: Span | None) -> dict[str, str]:
    """The W3C trace context headers (``traceparent``) that make `span` the parent of the
    server's own spans; empty when not tracing."""
    if span is None:
        return {}
    from opentelemetry import trace
    from opentelemetry.propagate import inject

    carrier: dict[str, str] = {}
    inject(carrier, trace.set_span_in_context(span))
    return carrier


class current:
    """`span` as the current span (the parent of the requests started meanwhile) and
    `purpose` as theirs, for a stretch of code that starts requests: the first step of a
    stream, the creation of a task that opens one. Not held across a ``yield``. Nothing
    happens for no span (not tracing): a plain class, 0.4 us a use where a generator-based
    context manager took 1.1."""

    __slots__ = ("_attached", "_purpose", "_span", "_token")

    def __init__(self, span: Span | None, purpose: Purpose | None = None) -> None:
        self._span, self._purpose = span, purpose

    def __enter__(self) -> None:
        if self._span is None:
            return
        from opentelemetry import context, trace

        self._token = _purpose.set(self._purpose) if self._purpose is not None else None
        self._attached = context.attach(trace.set_span_in_context(self._span))

    def __exit__(self, *exc: object) -> None:
        if self._span is None:
            return
        from opentelemetry import context

        context.detach(self._attached)
        if self._token is not None:
            _purpose.reset(self._token)


@contextmanager
def suppressed() -> Iterator[None]:
    """No span made meanwhile: health probes, which would make a root span each every few
    seconds."""
    token = _suppressed.set(True)
    try:
        yield
    finally:
        _suppressed.reset(token)


CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
"""The GenAI conventions' opt-in: ``true`` records the messages and the text in the spans."""


def captures_content() -> bool:
    """Whether the spans may record prompts and text (:data:`CAPTURE_CONTENT` is ``true``)."""
    return os.environ.get(CAPTURE_CONTENT, "").strip().lower() == "true"


def purpose() -> Purpose:
    """Why the completion being started is sent (:func:`current` sets it)."""
    return _purpose.get()


def server_attributes(base_url: str) -> dict[str, Any]:
    """``server.address`` and ``server.port`` of `base_url` (no user, password or path)."""
    from urllib.parse import urlsplit

    parts = urlsplit(base_url)
    attributes: dict[str, Any] = {"server.address": parts.hostname or ""}
    with suppress(ValueError):  # a port out of range: the request itself fails and says so
        attributes["server.port"] = parts.port or (443 if parts.scheme == "https" else 80)
    return attributes
