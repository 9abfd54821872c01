"""One trace from the relay through vLLM: qwen3-large runs with ``--otlp-traces-endpoint``
(scripts/vllm_servers.sh) and exports its request spans to a small OTLP/HTTP receiver here;
each continues the ``traceparent`` of the relay's request span, so vLLM's spans sit under the
relay's in the relay's trace."""

from __future__ import annotations

import asyncio
import os

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from relay_integrations.relay import (
    CueSet,
    EndpointConfig,
    RelayConfig,
    RelaySwitcher,
    SamplingConfig,
    SwitchPolicy,
)
from relay_integrations.testing import forcing
from tests.fakes.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.integration.conftest import Server

REASONING = "Let me add them. Therefore, the sum is 4. Now we check it."
TRACE = f"<think>\n{REASONING}\n</think>\n\nThe answer is 4."
CUES = CueSet.from_list(["Therefore,", "Now"])


def otlp_port() -> int:
    port = os.environ.get("RELAY_TEST_OTLP_PORT")
    assert port, 'RELAY_TEST_OTLP_PORT is not set: eval "$(scripts/vllm_servers.sh env)"'
    return int(port)


def large_requests(spans: InMemorySpanExporter) -> list[ReadableSpan]:
    """The relay's completion requests to the large model's server."""
    return [
        s
        for s in spans.get_finished_spans()
        if (s.attributes or {}).get("gen_ai.operation.name") == "text_completion"
        and (s.attributes or {}).get("relay.model.role") == "large"
    ]


async def test_vllms_request_spans_sit_under_the_relays(
    qwen_large: Server, qwen_small: Server, spans: InMemorySpanExporter
) -> None:
    config = RelayConfig(
        large=EndpointConfig(base_url=qwen_large.url, model=qwen_large.large_model),
        small=EndpointConfig(base_url=qwen_small.url, model=qwen_small.small_model),
        cues=list(CUES.cues),
        sampling=SamplingConfig(max_tokens=200),
        policy=SwitchPolicy(cooldown_tokens=0),
    )
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    # the receiver starts, waits and stops on worker threads: off the test's loop
    vllm_collector = await asyncio.to_thread(OtlpReceiver(otlp_port()).__enter__)
    try:
        async with RelaySwitcher(config, request_hook=forcing(TRACE)) as relay:
            result = await relay.generate(messages)
        assert result.text == TRACE and result.stats.switches == 2
        (generation,) = [s for s in spans.get_finished_spans() if s.name.startswith("chat ")]
        assert generation.context is not None
        trace_id = f"{generation.context.trace_id:032x}"
        sent = {f"{s.context.span_id:016x}": s for s in large_requests(spans) if s.context}
        finished = {i for i, s in sent.items() if (s.attributes or {})["relay.request.completed"]}

        def all_in(received: list[ReceivedSpan]) -> bool:
            return finished <= {s.parent_id for s in received if s.trace_id == trace_id}

        received = await asyncio.to_thread(vllm_collector.wait_for, all_in)
    finally:
        await asyncio.to_thread(vllm_collector.__exit__, None, None, None)
    ours = [s for s in received if s.trace_id == trace_id]
    assert ours and all(s.parent_id in sent for s in ours)  # each under a relay request
    assert {s.name for s in ours} == {"llm_request"}
    for span in ours:  # vLLM's request id is the relay's X-Request-Id
        relay_id = str((sent[span.parent_id].attributes or {})["relay.request.id"])
        assert relay_id and relay_id in str(span.attributes["gen_ai.request.id"])
