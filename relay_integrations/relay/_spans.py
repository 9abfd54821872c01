"""What the relay's OpenTelemetry spans say: the generation's and each segment's
(:mod:`relay_integrations.upstream.tracing` makes them, and the requests' spans)::

    span = generation_span(config, request)  # None when not tracing
    ...
    tracing.finish(span, generation_attributes(request, result))

No text is recorded unless the GenAI conventions' opt-in asks for it
(``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``): then the generation's
``gen_ai.input.messages`` and ``gen_ai.output.messages`` (the conventions' JSON: roles and
parts) and each segment's ``relay.segment.text``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..upstream import tracing
from ..upstream.config import ModelRole
from .config import Phase, RelayConfig
from .request import RelayRequest
from .result import RelayResult, Segment

Attributes = dict[str, tracing.AttributeValue | None]


def generation_span(config: RelayConfig, request: RelayRequest) -> tracing.Span | None:
    """The span of a generation, started now (None when not tracing)."""
    if tracing.tracer() is None:
        return None
    large = config.large.model
    attributes: dict[str, tracing.AttributeValue] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": large,
        "relay.small.model": config.small.model,
    }
    if request.generation_id is not None:
        attributes["relay.generation.id"] = request.generation_id
    sampling = request.sampling or config.sampling
    if sampling.max_tokens is not None:
        attributes["gen_ai.request.max_tokens"] = sampling.max_tokens
    return tracing.start(f"chat {large}", attributes)


def generation_attributes(request: RelayRequest, result: RelayResult) -> Attributes:
    """What a generation's span says at its end (its messages and text only when asked)."""
    stats = result.stats
    usage = result.usage.values()
    attributes: Attributes = {
        "relay.generation.id": result.generation_id,
        "gen_ai.response.finish_reasons": [result.finish_reason],
        "gen_ai.usage.input_tokens": sum(u.prompt_tokens for u in usage),
        "gen_ai.usage.output_tokens": sum(u.completion_tokens for u in usage),
        "relay.large_share": round(stats.large_share, 4),
        "relay.switches": stats.switches,
        "relay.resumes": stats.resumes,
        "relay.segments": len(result.segments),
        "relay.speculative_handoffs": stats.speculative_handoffs,
        "relay.speculative_misses": stats.speculative_misses,
        "relay.degraded": stats.degraded,
    }
    for role, counted in result.usage.items():
        attributes[f"relay.usage.{role}.input_tokens"] = counted.prompt_tokens
        attributes[f"relay.usage.{role}.output_tokens"] = counted.completion_tokens
    if tracing.captures_content():
        attributes["gen_ai.input.messages"] = json.dumps(input_messages(request.messages))
        output = [{"type": "reasoning", "content": result.reasoning}] if result.reasoning else []
        output.append({"type": "text", "content": result.answer})
        message = {"role": "assistant", "parts": output, "finish_reason": result.finish_reason}
        attributes["gen_ai.output.messages"] = json.dumps([message])
    return attributes


def input_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages (OpenAI's shapes) in the GenAI conventions' shape: a role and parts
    (``text``, ``tool_call``, ``tool_call_response``)."""
    shaped = []
    for message in messages:
        content = message.get("content")
        if message.get("role") == "tool":
            response = {"id": message.get("tool_call_id"), "response": content}
            parts: list[dict[str, Any]] = [{"type": "tool_call_response", **response}]
        elif isinstance(content, str):
            parts = [{"type": "text", "content": content}]
        else:
            parts = [
                {"type": "text", "content": part.get("text", "")}
                for part in content or ()
                if isinstance(part, Mapping) and part.get("type") == "text"
            ]
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            name, arguments = function.get("name"), function.get("arguments")
            parts.append(
                {"type": "tool_call", "id": call.get("id"), "name": name, "arguments": arguments}
            )
        shaped.append({"role": message.get("role"), "parts": parts})
    return shaped


def segment_span(
    parent: tracing.Span | None, model: str, role: ModelRole, phase: Phase, index: int
) -> tracing.Span | None:
    """The span of the `index`-th segment, which `role` (serving `model`) writes now in
    `phase`, beneath its generation's `parent` (None when not tracing)."""
    if parent is None:
        return None
    attributes = {
        "relay.segment.model": role,
        "relay.segment.phase": phase,
        "relay.segment.index": index,
        "gen_ai.request.model": model,
    }
    return tracing.start(f"relay.segment {role}", attributes, parent=parent)


def segment_attributes(segment: Segment) -> Attributes:
    """What a segment's span says at its end (its text only when asked)."""
    return {
        "relay.segment.ended_by": segment.ended_by,
        "relay.segment.cue": segment.cue,
        "relay.segment.seconds": round(segment.seconds, 6),
        "relay.segment.requests": segment.usage.requests,
        "gen_ai.usage.input_tokens": segment.usage.prompt_tokens,
        "gen_ai.usage.output_tokens": segment.usage.completion_tokens,
        "relay.segment.text": segment.text if tracing.captures_content() else None,
    }
