"""``relaygen serve``'s traces: a SERVER span a request that continues the client's
``traceparent``, the generation's spans beneath it, no span for probes; and, as a process,
its spans exported over OTLP/HTTP to a collector (``--otlp-endpoint``)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from relay_integrations.server import RelayServer
from relay_integrations.server.tracing import start_export
from relay_integrations.testing.scripted_vllm import ScriptedVLLM
from tests.fakes.canary import CANARY
from tests.fakes.capable_model import capable_relay_config
from tests.fakes.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.fakes.ports import free_port
from tests.fakes.relay_env import relay_server_env, relaygen_serve
from tests.fakes.relay_http import ServedRelay, relay_http

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
CHAT = {"model": "large", "messages": [{"role": "user", "content": "What is 2 + 2?"}]}


@pytest.fixture(scope="module")
def served(server: ScriptedVLLM) -> Iterator[ServedRelay]:
    with relay_http(RelayServer(capable_relay_config(server.base_url))) as running:
        yield running


def by_name(spans: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    """The spans called `name`, once there is one (the server ends a request's span after
    its last bytes went out, a moment after the client has read them)."""
    for _ in range(100):
        named = [s for s in spans.get_finished_spans() if s.name == name]
        if named:
            return named
        time.sleep(0.02)
    return []


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_continues_the_clients_trace(
    spans: InMemorySpanExporter, served: ServedRelay, stream: bool
) -> None:
    answer = httpx.post(
        f"{served.base_url}/chat/completions",
        json={**CHAT, "stream": stream},
        headers={"traceparent": TRACEPARENT},
        timeout=30,
    )
    assert answer.status_code == 200
    (request,) = by_name(spans, "POST /v1/chat/completions")
    assert request.kind is SpanKind.SERVER and request.context is not None
    assert f"{request.context.trace_id:032x}" == TRACE_ID
    assert request.parent is not None and f"{request.parent.span_id:016x}" == CLIENT_SPAN
    assert (request.attributes or {})["http.response.status_code"] == 200
    (generation,) = by_name(spans, "chat large")
    assert generation.parent is not None
    assert generation.parent.span_id == request.context.span_id


def test_probes_make_no_span(spans: InMemorySpanExporter, served: ServedRelay) -> None:
    for path in ("/livez", "/readyz", "/health", "/metrics"):
        assert httpx.get(f"{served.url}{path}", timeout=10).status_code == 200
    httpx.get(f"{served.base_url}/models", timeout=10)
    assert [s.name for s in spans.get_finished_spans()] == ["GET /v1/models"]


def test_nothing_is_exported_unless_asked() -> None:
    assert start_export(None, {}) is None
    assert start_export("http://collector:4318", {"OTEL_SDK_DISABLED": "true"}) is None


def test_relaygen_serve_exports_its_spans_to_the_collector(server: ScriptedVLLM) -> None:
    """As deployed: ``--otlp-endpoint`` names a collector (here a small OTLP/HTTP receiver);
    a request's span, its generation's, its segments' and its requests' to the upstream
    arrive there in the client's trace, from service ``relaygen-serve``."""
    with OtlpReceiver() as collector:
        env = {**relay_server_env(server, free_port()), "OTEL_BSP_SCHEDULE_DELAY": "100"}
        with relaygen_serve(env, "--otlp-endpoint", collector.endpoint) as relay:
            answer = httpx.post(
                f"{relay.url}/v1/chat/completions",
                json=CHAT,
                headers={"traceparent": TRACEPARENT},
                timeout=30,
            )
            assert answer.status_code == 200

            def whole(spans: list[ReceivedSpan]) -> bool:
                return any(s.name == "chat large" for s in spans) and any(
                    s.name.startswith("POST /v1/chat") for s in spans
                )

            received = collector.wait_for(whole)
    assert CANARY not in repr(received)  # the process runs with the canary key and header
    ours = [s for s in received if s.trace_id == TRACE_ID]
    (request,) = [s for s in ours if s.name == "POST /v1/chat/completions"]
    (generation,) = [s for s in ours if s.name == "chat large"]
    assert request.parent_id == CLIENT_SPAN and request.kind == 2  # SERVER
    assert generation.parent_id == request.span_id
    assert {s.service for s in ours} == {"relaygen-serve"}
    segments = [s for s in ours if s.name.startswith("relay.segment")]
    assert segments and all(s.parent_id == generation.span_id for s in segments)
    sent = [s for s in ours if s.attributes.get("gen_ai.operation.name") == "text_completion"]
    assert sent and {s.parent_id for s in sent} <= {generation.span_id} | {
        s.span_id for s in segments
    }
