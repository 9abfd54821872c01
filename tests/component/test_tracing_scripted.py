"""OpenTelemetry spans of a generation against the scripted fake, read from the SDK's
in-memory exporter: the tree (the generation, a span a segment, a span a request to a
server), their attributes, the ``traceparent`` each server received, and nothing made or
imported when no tracer provider is set."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from llama_index.core.base.llms.types import ChatMessage
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from relay_integrations import __version__
from relay_integrations.langchain import RelayChatModel
from relay_integrations.llama_index import RelayLLM
from relay_integrations.relay import (
    EndpointConfig,
    EndpointError,
    RelayConfig,
    RelayResult,
    RelaySwitcher,
)
from relay_integrations.relay._spans import input_messages
from relay_integrations.testing.scripted_vllm import Fault, ScriptedModel, ScriptedVLLM
from relay_integrations.upstream import tracing
from relay_integrations.upstream.endpoint import Endpoint
from relay_integrations.upstream.rendering import ChatInput, RenderedIds, ServerChatTemplate
from tests.component.test_outages_scripted import pair_config
from tests.component.test_switcher_scripted import MESSAGES, TRACE
from tests.fakes.canary import CANARY
from tests.fakes.capable_model import relay_fields
from tests.fakes.relay_config import make_config


def children(spans: list[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    return [s for s in spans if s.parent is not None and s.parent.span_id == span_id(parent)]


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def finished(spans: InMemorySpanExporter) -> list[ReadableSpan]:
    return list(spans.get_finished_spans())


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.span_id)


def completions(spans: list[ReadableSpan]) -> list[ReadableSpan]:
    return [s for s in spans if attrs(s).get("gen_ai.operation.name") == ("text_completion")]


async def generate(large: ScriptedModel, small: ScriptedModel, **policy: Any) -> RelayResult:
    async with (
        ScriptedVLLM(large, small) as server,
        RelaySwitcher(make_config(server, **policy)) as relay,
    ):
        return await relay.generate(MESSAGES)


async def test_a_generation_is_one_tree_of_segments_and_requests(
    spans: InMemorySpanExporter,
) -> None:
    large, small = ScriptedModel("large", TRACE), ScriptedModel("small", TRACE)
    result = await generate(large, small)
    finished = list(spans.get_finished_spans())
    assert {s.context.trace_id for s in finished if s.context} == {finished[-1].context.trace_id}
    (root,) = [s for s in finished if s.parent is None]
    assert root.name == "chat large" and root.kind is SpanKind.INTERNAL
    scope = root.instrumentation_scope
    assert scope is not None and (scope.name, scope.version) == ("relay_integrations", __version__)
    attributes = attrs(root)
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.request.model"] == "large"
    assert attributes["relay.small.model"] == "small"
    assert attributes["relay.generation.id"] == result.generation_id
    assert attributes["gen_ai.response.finish_reasons"] == (result.finish_reason,)
    assert attributes["relay.switches"] == result.stats.switches == 2
    assert attributes["relay.segments"] == len(result.segments)
    assert attributes["relay.resumes"] == 0 and "relay.degraded" not in attributes
    assert attributes["relay.large_share"] == round(result.stats.large_share, 4)
    for role in ("large", "small"):
        usage = result.usage[role]
        assert attributes[f"relay.usage.{role}.output_tokens"] == usage.completion_tokens
        assert attributes[f"relay.usage.{role}.input_tokens"] == usage.prompt_tokens
    assert attributes["gen_ai.usage.output_tokens"] == sum(
        u.completion_tokens for u in result.usage.values()
    )

    segments = [s for s in children(finished, root) if s.name.startswith("relay.segment")]
    assert [
        (
            attrs(s)["relay.segment.model"],
            attrs(s)["relay.segment.phase"],
            attrs(s)["relay.segment.ended_by"],
            attrs(s).get("relay.segment.cue"),
            attrs(s)["gen_ai.usage.output_tokens"],
        )
        for s in sorted(segments, key=lambda s: attrs(s)["relay.segment.index"])
    ] == [(s.model, s.phase, s.ended_by, s.cue, s.usage.completion_tokens) for s in result.segments]

    # every request a server saw is a CLIENT span, under the generation (the renders, the
    # first request) or under the segment that sent it; its traceparent is that span's
    sent = completions(finished)
    assert len(sent) == len(large.requests) + len(small.requests)
    assert all(s.kind is SpanKind.CLIENT for s in sent)
    under_root = {attrs(s)["relay.request.purpose"] for s in children(sent, root)}
    assert under_root == {"first_request"}
    purposes = [attrs(s)["relay.request.purpose"] for s in sent]
    # a hand-off's request closed before it was sent (its task had not run) makes no span
    opened_ahead = purposes.count("speculative_handoff")
    stats = result.stats
    assert (
        stats.speculative_handoffs
        <= opened_ahead
        <= stats.speculative_handoffs + (stats.speculative_misses)
    )
    parents = {span_id(root)} | {span_id(s) for s in segments}
    assert all(s.parent is not None and s.parent.span_id in parents for s in sent)
    received = [h.get("traceparent", "") for model in (large, small) for h in model.headers]
    trace_id = f"{root.context.trace_id:032x}"
    # version, trace id, parent id (the flags: sampled, and the SDK's random trace id)
    assert {r.rsplit("-", 1)[0] for r in received} == {
        f"00-{trace_id}-{span_id(s):016x}" for s in sent
    }
    renders = [s for s in children(finished, root) if s.name == "POST /tokenize"]
    assert {attrs(r)["relay.model.role"] for r in renders} == {"large", "small"}
    for span in finished:
        for value in attrs(span).values():
            assert "Let me see" not in str(value)  # no text recorded


async def test_a_callers_span_is_the_parent(spans: InMemorySpanExporter) -> None:
    tracer = trace.get_tracer("caller")
    with tracer.start_as_current_span("caller") as caller:
        await generate(ScriptedModel("large", TRACE), ScriptedModel("small", TRACE))
    (root,) = [s for s in spans.get_finished_spans() if s.name == "chat large"]
    assert root.parent is not None and root.parent.span_id == caller.get_span_context().span_id


async def test_a_resumed_stream_is_an_errored_request_and_its_resume(
    spans: InMemorySpanExporter,
) -> None:
    large = ScriptedModel("large", TRACE, faults=[Fault(), Fault(cut_after=3)])
    result = await generate(large, ScriptedModel("small", TRACE), speculative_handoff=False)
    assert result.text == TRACE and result.stats.resumes == 1
    finished = list(spans.get_finished_spans())
    (root,) = [s for s in finished if s.parent is None]
    assert attrs(root)["relay.resumes"] == 1
    sent = completions(finished)
    (broken,) = [s for s in sent if s.status.status_code is StatusCode.ERROR]
    assert attrs(broken)["relay.request.completed"] is False
    assert [e.name for e in broken.events] == ["exception"]
    (resumed,) = [s for s in sent if attrs(s)["relay.request.purpose"] == "resume"]
    assert resumed.parent == broken.parent  # the same segment's


async def test_a_degraded_generation_says_why(spans: InMemorySpanExporter) -> None:
    large = ScriptedVLLM(ScriptedModel("large", TRACE))
    dead = ScriptedVLLM(ScriptedModel("small", TRACE))  # bound, never started: refuses
    async with large, RelaySwitcher(pair_config(large, dead.base_url)) as relay:
        result = await relay.generate(MESSAGES)
    finished = list(spans.get_finished_spans())
    (root,) = [s for s in finished if s.parent is None]
    assert result.stats.degraded is not None
    assert attrs(root)["relay.degraded"] == result.stats.degraded
    failed = [s for s in finished if s.status.status_code is StatusCode.ERROR]
    assert failed and {attrs(s)["relay.model.role"] for s in failed} == {"small"}
    assert root.status.status_code is StatusCode.UNSET  # the generation itself succeeded


async def test_without_a_provider_nothing_is_made() -> None:
    large, small = ScriptedModel("large", TRACE), ScriptedModel("small", TRACE)
    assert tracing.tracer() is None  # opentelemetry is imported here, with no provider set
    await generate(large, small)
    assert all("traceparent" not in h for m in (large, small) for h in m.headers)


def test_without_a_provider_opentelemetry_is_not_imported() -> None:
    """A process that never imports OpenTelemetry runs a generation without importing it."""
    code = (
        "import asyncio, sys\n"
        "from relay_integrations.relay import RelaySwitcher\n"
        "from relay_integrations.testing.scripted_vllm import ScriptedModel, ScriptedVLLM\n"
        "from tests.component.test_switcher_scripted import MESSAGES, TRACE\n"
        "from tests.fakes.relay_config import make_config\n"
        "async def main():\n"
        "    models = ScriptedModel('large', TRACE), ScriptedModel('small', TRACE)\n"
        "    async with ScriptedVLLM(*models) as server:\n"
        "        async with RelaySwitcher(make_config(server)) as relay:\n"
        "            return await relay.generate(MESSAGES)\n"
        "assert asyncio.run(main()).text == TRACE\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]", out.stdout


async def test_the_adapters_calls_hang_under_the_callers_span(
    spans: InMemorySpanExporter, server: ScriptedVLLM
) -> None:
    """LangChain and LlamaIndex, sync (run on the relay's own loop thread) and async: the
    caller's current span is the generation's parent."""
    chat_model = await asyncio.to_thread(RelayChatModel, **relay_fields(server.base_url))
    llm = await asyncio.to_thread(RelayLLM, **relay_fields(server.base_url))
    message = [ChatMessage(role="user", content="What is 2 + 2?")]
    tracer = trace.get_tracer("caller")

    def in_a_thread(name: str, call: Callable[[], object]) -> int:
        with tracer.start_as_current_span(name) as caller:
            call()
        return caller.get_span_context().span_id

    callers = {
        await asyncio.to_thread(in_a_thread, "invoke", lambda: chat_model.invoke("2 + 2?")),
        await asyncio.to_thread(in_a_thread, "chat", lambda: llm.chat(message)),
    }
    for name, call in (("ainvoke", chat_model.ainvoke("2 + 2?")), ("achat", llm.achat(message))):
        with tracer.start_as_current_span(name) as caller:
            await call
        callers.add(caller.get_span_context().span_id)
    roots = [s for s in spans.get_finished_spans() if s.name == "chat large"]
    assert {r.parent.span_id for r in roots if r.parent is not None} == callers
    assert len(roots) == 4


async def test_text_is_recorded_only_when_asked(
    spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GenAI conventions' opt-in: by default no span holds the prompt or the text; with
    OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true the generation's span holds the
    messages in the conventions' shape and each segment's span its text."""
    result = await generate(ScriptedModel("large", TRACE), ScriptedModel("small", TRACE))
    assert not any("2 + 2" in s.to_json() or "sum is 4" in s.to_json() for s in finished(spans))
    spans.clear()
    monkeypatch.setenv(tracing.CAPTURE_CONTENT, "true")
    result = await generate(ScriptedModel("large", TRACE), ScriptedModel("small", TRACE))
    (root,) = [s for s in finished(spans) if s.parent is None]
    assert json.loads(attrs(root)["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": "What is 2 + 2?"}]}
    ]
    (output,) = json.loads(attrs(root)["gen_ai.output.messages"])
    assert output == {
        "role": "assistant",
        "parts": [
            {"type": "reasoning", "content": result.reasoning},
            {"type": "text", "content": result.answer},
        ],
        "finish_reason": "stop",
    }
    segments = sorted(
        (s for s in finished(spans) if s.name.startswith("relay.segment")),
        key=lambda s: int(attrs(s)["relay.segment.index"]),
    )
    assert [attrs(s)["relay.segment.text"] for s in segments] == [s.text for s in result.segments]


def test_messages_in_the_conventions_shape() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    assert input_messages(messages) == [
        {"role": "system", "parts": [{"type": "text", "content": "Be brief."}]},
        {"role": "user", "parts": [{"type": "text", "content": "Weather?"}]},
        {
            "role": "assistant",
            "parts": [
                {
                    "type": "tool_call",
                    "id": "c1",
                    "name": "weather",
                    "arguments": '{"city": "Oslo"}',
                }
            ],
        },
        {
            "role": "tool",
            "parts": [{"type": "tool_call_response", "id": "c1", "response": "sunny"}],
        },
    ]


async def test_no_secret_in_any_span(spans: InMemorySpanExporter) -> None:
    """The canary as both models' key, a header and a proxy's password, and a request that
    fails: the spans (exceptions recorded in them included) never show it (the fixture
    checks every span at the test's end)."""
    large, small = ScriptedModel("large", TRACE), ScriptedModel("small", TRACE)
    async with ScriptedVLLM(large, small) as server:
        secret = {"api_key": CANARY, "extra_headers": {"X-Secret": CANARY}, "max_retries": 0}
        config = RelayConfig(
            large=EndpointConfig(base_url=server.base_url, model="large", **secret),
            small=EndpointConfig(base_url=server.base_url, model="small", **secret),
            cues=["Therefore,", "Now"],
        )
        async with RelaySwitcher(config) as relay:
            assert (await relay.generate(MESSAGES)).text == TRACE
        large.faults.append(Fault(status=500))
        proxy = f"http://user:{CANARY}@127.0.0.1:9"  # nothing listens there: it fails
        failing = EndpointConfig(base_url=server.base_url, model="large", proxy=proxy, **secret)
        proxied = config.model_copy(update={"large": failing})
        async with RelaySwitcher(proxied) as relay:
            with pytest.raises(EndpointError):
                await relay.generate(MESSAGES)
    assert any(s.status.status_code is StatusCode.ERROR for s in finished(spans))


async def test_a_generation_cancelled_while_it_renders_is_closed_early_not_failed(
    spans: InMemorySpanExporter,
) -> None:
    class SlowRender(ServerChatTemplate):
        async def render_ids(self, endpoint: Endpoint, chat: ChatInput) -> RenderedIds:
            await asyncio.sleep(30)
            return await super().render_ids(endpoint, chat)

    async with (
        ScriptedVLLM(ScriptedModel("large", TRACE), ScriptedModel("small", TRACE)) as server,
        RelaySwitcher(make_config(server), renderer=SlowRender()) as relay,
    ):
        generation = asyncio.create_task(relay.generate(MESSAGES))
        await asyncio.sleep(0.2)
        generation.cancel()
        with pytest.raises(asyncio.CancelledError):
            await generation
    (root,) = [s for s in finished(spans) if s.parent is None]
    assert attrs(root)["relay.closed_early"] is True
    assert root.status.status_code is StatusCode.UNSET and not root.events
