"""``relaygen serve``'s traces: a SERVER span a request, the generation's spans beneath it,
exported over OTLP/HTTP when asked.

The span of a request continues the client's trace (its W3C ``traceparent`` header); the
relay's generation span, its segments' and its requests to vLLM hang beneath it
(:mod:`relay_integrations.upstream.tracing`), and vLLM started with
``--otlp-traces-endpoint`` hangs its own beneath those. Probes (``/livez``, ``/readyz``,
``/health``, ``/metrics``) make no span. Export is set up in each worker process::

    relaygen serve --otlp-endpoint http://localhost:4318   # Jaeger, Tempo, a Collector

or with the standard variables (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, ``OTEL_EXPORTER_OTLP_HEADERS``,
``OTEL_SERVICE_NAME``, ...), which the OTLP exporter reads itself.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..upstream import tracing

UNTRACED = frozenset({"/livez", "/readyz", "/health", "/metrics"})
"""Paths whose requests make no span: probes, scraped every few seconds."""

SERVICE_NAME = "relaygen-serve"
"""``service.name`` of the exported spans unless ``OTEL_SERVICE_NAME`` says otherwise."""

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


class TracingMiddleware:
    """ASGI middleware: a SERVER span for each request (but the probes), the client's
    ``traceparent`` its parent, current while the request (its stream included) runs."""

    def __init__(self, app: ASGIApp, routes: frozenset[str]) -> None:
        self.app = app
        self.routes = routes  # span names use these paths; any other is "METHOD other"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        span = None
        if scope["type"] == "http" and scope["path"] not in UNTRACED:
            span = self._start(scope)
        if span is None:  # not tracing, or a probe
            await self.app(scope, receive, send)
            return
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        failure: BaseException | None = None
        try:
            with tracing.current(span):
                await self.app(scope, receive, sending)
        except BaseException as failed:
            failure = failed
            raise
        finally:
            error = str(status) if status >= 500 else None
            tracing.finish(span, {"http.response.status_code": status}, failure, error)

    def _start(self, scope: Scope) -> tracing.Span | None:
        """The span of the request `scope` (None when not tracing)."""
        if tracing.tracer() is None:
            return None
        from opentelemetry.propagate import extract

        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        path = scope["path"] if scope["path"] in self.routes else "other"
        method = scope["method"]
        attributes = {"http.request.method": method, "url.path": scope["path"]}
        return tracing.start(f"{method} {path}", attributes, server=extract(headers))


def start_export(
    endpoint: str | None, environ: Mapping[str, str] = os.environ
) -> Callable[[], None] | None:
    """Export spans over OTLP/HTTP to `endpoint` (a collector's base URL: spans go to its
    ``/v1/traces``) or to where the ``OTEL_EXPORTER_OTLP_*`` variables say; None (nothing
    set up) when neither is given or ``OTEL_SDK_DISABLED`` is true. Returns the function
    that flushes and stops the export (at shutdown)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if endpoint is None and not any(environ.get(name) for name in ENDPOINT_VARIABLES):
        return None
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as missing:
        raise RuntimeError(
            f"exporting traces needs the otlp extra ({missing.name} is missing): "
            "pip install 'relay-integrations[server,otlp]'"
        ) from None
    url = f"{endpoint.rstrip('/')}/v1/traces" if endpoint is not None else None
    service = {} if environ.get("OTEL_SERVICE_NAME") else {"service.name": SERVICE_NAME}
    provider = TracerProvider(resource=Resource.create(service))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
    trace.set_tracer_provider(provider)
    return provider.shutdown
