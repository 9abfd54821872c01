"""Translation between LangChain messages and the relay's chat types (nothing else)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    convert_to_openai_messages,
)
from langchain_core.messages import InvalidToolCall as LCInvalidToolCall
from langchain_core.messages import ToolCall as LCToolCall
from langchain_core.messages.ai import UsageMetadata
from langchain_core.messages.tool import tool_call_chunk

from ..chat.exchange import ChatResponse, ContentDelta, ReasoningDelta, ToolCallDelta
from ..chat.tool_calls import InvalidToolCall, ToolCall
from ..relay.result import RelayResult

REASONING_KEY = "reasoning_content"
EARLIER_TURN_PARTS = frozenset({"reasoning", "thinking", "tool_call"})
"""Content blocks of an earlier assistant turn (``output_version="v1"``, other providers'
messages) that are not sent as text: the reasoning, left out as the chat templates leave it
out, and the calls, which go as ``tool_calls``."""


def to_openai(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """OpenAI-format dicts for the chat template; earlier turns' reasoning is left out.
    Media blocks stay, for the shared check to refuse with their place (the models read
    text only)."""
    converted = convert_to_openai_messages(list(messages))
    for message in converted:
        message.pop(REASONING_KEY, None)
        content = message.get("content")
        if message["role"] == "assistant" and isinstance(content, list):
            message["content"] = [
                part
                for part in content
                if not (isinstance(part, dict) and part.get("type") in EARLIER_TURN_PARTS)
            ]
    return converted


MODELS_KEY = "relay_models"
"""``response_metadata`` key of a streamed chunk: the model that wrote its text, as a list of
one (``["large"]`` or ``["small"]``), because LangChain merges chunks by adding their
metadata: a string would be concatenated ("largesmall"), a list is joined, so a merged
message lists the writer of each chunk in order."""


def delta_chunk(event: ReasoningDelta | ContentDelta | ToolCallDelta) -> AIMessageChunk:
    """The message chunk of one streamed event, naming the model that wrote it."""
    written_by = {MODELS_KEY: [event.model]}
    if isinstance(event, ReasoningDelta):
        return AIMessageChunk(
            content="",
            additional_kwargs={REASONING_KEY: event.text},
            response_metadata=written_by,
        )
    if isinstance(event, ContentDelta):
        return AIMessageChunk(content=event.text, response_metadata=written_by)
    call = event.call
    arguments = (
        json.dumps(call.arguments, ensure_ascii=False) if isinstance(call, ToolCall) else call.text
    )
    # Each call arrives whole, so it needs no merge index; an index would also be taken as
    # the content-block index by output_version="v1" and merge the call into the reasoning.
    return AIMessageChunk(
        content="",
        tool_call_chunks=[tool_call_chunk(name=call.name, args=arguments, id=call.id, index=None)],
        response_metadata=written_by,
    )


def final_chunk(
    response: ChatResponse, model_name: str, *, with_usage: bool = True
) -> AIMessageChunk:
    """The last chunk of a stream: usage over both models (unless ``stream_usage=False``)
    and the response metadata, naming the model that wrote the last segment."""
    metadata = response_metadata(response, model_name)
    if response.last_model is not None:
        metadata[MODELS_KEY] = [response.last_model]
    return AIMessageChunk(
        content="",
        usage_metadata=usage_metadata(response.result) if with_usage else None,
        response_metadata=metadata,
        chunk_position="last",
    )


def message(response: ChatResponse, model_name: str) -> AIMessage:
    """The whole answer as one message: content, reasoning, tool calls and usage."""
    additional = {REASONING_KEY: response.reasoning} if response.reasoning else {}
    return AIMessage(
        content=response.content,
        additional_kwargs=additional,
        tool_calls=[_tool_call(c) for c in response.tool_calls],
        invalid_tool_calls=[_invalid_tool_call(c) for c in response.invalid_tool_calls],
        usage_metadata=usage_metadata(response.result),
        response_metadata=response_metadata(response, model_name),
        id=response.result.generation_id,
    )


def usage_metadata(result: RelayResult) -> UsageMetadata:
    """Tokens summed over both models and all their requests.

    Every segment re-sends the text so far, so ``input_tokens`` counts a prefix once per
    request; ``input_token_details.cache_read`` shows how much of it the prefix cache served
    (left out when a server did not say: unknown, not 0).
    """
    cached = result.cached_tokens
    return UsageMetadata(
        input_tokens=result.prompt_tokens,
        output_tokens=result.completion_tokens,
        total_tokens=result.prompt_tokens + result.completion_tokens,
        input_token_details={} if cached is None else {"cache_read": cached},
        output_token_details={"reasoning": result.reasoning_tokens},
    )


def response_metadata(response: ChatResponse, model_name: str) -> dict[str, Any]:
    return {
        "model_name": model_name,
        "finish_reason": response.finish_reason,
        "relay": response.result.summary(),
    }


def _tool_call(call: ToolCall) -> LCToolCall:
    return LCToolCall(name=call.name, args=call.arguments, id=call.id, type="tool_call")


def _invalid_tool_call(call: InvalidToolCall) -> LCInvalidToolCall:
    return LCInvalidToolCall(
        name=call.name, args=call.text, id=call.id, error=call.error, type="invalid_tool_call"
    )
