"""A small OTLP/HTTP trace receiver: what a collector (Jaeger, Tempo, an OpenTelemetry
Collector) is to ``relaygen serve --otlp-endpoint`` and to vLLM's ``--otlp-traces-endpoint``.
It keeps the spans of every ``POST /v1/traces`` (protobuf, as both exporters send them)::

    with OtlpReceiver(port) as receiver:
        ...  # a process exports to receiver.endpoint (its base URL)
        spans = receiver.wait_for(lambda spans: any(s.name == "llm_request" for s in spans))
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass(frozen=True)
class ReceivedSpan:
    """One exported span: ids as hex (the parent's empty for a root), its service."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int  # OTLP's SpanKind: 1 internal, 2 server, 3 client
    attributes: dict[str, Any]
    service: str


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(v) for v in value.array_value.values)
    return getattr(value, kind) if kind else None


class OtlpReceiver:
    """Listens on 127.0.0.1:`port` (0: any free one) in a thread of its own."""

    def __init__(self, port: int = 0) -> None:
        self.spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                receiver._keep(ExportTraceServiceRequest.FromString(body))
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )

    @property
    def endpoint(self) -> str:
        """The receiver's base URL (spans go to its ``/v1/traces``)."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def _keep(self, request: ExportTraceServiceRequest) -> None:
        found = []
        for resource in request.resource_spans:
            attributes = {a.key: _value(a.value) for a in resource.resource.attributes}
            service = str(attributes.get("service.name", ""))
            for scope in resource.scope_spans:
                for span in scope.spans:
                    found.append(
                        ReceivedSpan(
                            span.name,
                            span.trace_id.hex(),
                            span.span_id.hex(),
                            span.parent_span_id.hex(),
                            span.kind,
                            {a.key: _value(a.value) for a in span.attributes},
                            service,
                        )
                    )
        with self._lock:
            self.spans.extend(found)

    def wait_for(
        self, enough: Callable[[list[ReceivedSpan]], bool], timeout: float = 30.0
    ) -> list[ReceivedSpan]:
        """The spans received, once `enough` says they are (exporters send in batches,
        every few seconds); fails after `timeout` seconds, with what came."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                spans = list(self.spans)
            if enough(spans):
                return spans
            assert time.monotonic() < deadline, f"not enough spans in {timeout:g} s: {spans}"
            time.sleep(0.1)
