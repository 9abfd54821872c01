"""Translation between LlamaIndex chat messages and the relay's chat types (nothing else)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    MessageRole,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
)

from ..chat.exchange import ChatResponse as RelayResponse
from ..chat.exchange import openai_usage
from ..chat.tool_calls import PartialToolCall, ToolCall

_ROLES = {
    MessageRole.SYSTEM: "system",
    MessageRole.DEVELOPER: "system",
    MessageRole.USER: "user",
    MessageRole.ASSISTANT: "assistant",
    MessageRole.CHATBOT: "assistant",
    MessageRole.MODEL: "assistant",
    MessageRole.TOOL: "tool",
    MessageRole.FUNCTION: "tool",
}


def to_openai(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """OpenAI-format dicts for the chat template; earlier turns' thinking is left out."""
    return [_message(m) for m in messages]


def _message(message: ChatMessage) -> dict[str, Any]:
    unsupported = {
        b.block_type
        for b in message.blocks
        if not isinstance(b, TextBlock | ThinkingBlock | ToolCallBlock)
    }
    if unsupported:
        raise ValueError(
            f"RelayLLM serves text models; a message holds {sorted(unsupported)} blocks"
        )
    role = _ROLES.get(message.role, "user")
    # joined as ChatMessage.content joins them (and OpenAILike sends them), not as vLLM
    # joins a list of text parts
    text = "".join(b.text for b in message.blocks if isinstance(b, TextBlock))
    out: dict[str, Any] = {"role": role, "content": text}
    calls = [_openai_call(b) for b in message.blocks if isinstance(b, ToolCallBlock)]
    # Our own messages carry their calls twice (blocks, and OpenAI dicts for LlamaIndex's
    # streaming parsers); other LLMs' messages may carry them only in additional_kwargs.
    calls = calls or list(message.additional_kwargs.get("tool_calls") or [])
    if calls:
        out["tool_calls"] = calls
    if role == "tool":
        out["tool_call_id"] = message.additional_kwargs.get("tool_call_id", "")
    return out


def _openai_call(block: ToolCallBlock) -> dict[str, Any]:
    arguments = block.tool_kwargs
    return {
        "id": block.tool_call_id or f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {
            "name": block.tool_name,
            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
        },
    }


def tool_call_block(call: ToolCall | PartialToolCall) -> ToolCallBlock:
    """A call, or a call still being written (its name is empty until it is whole)."""
    return ToolCallBlock(
        tool_call_id=call.id, tool_name=call.name or "", tool_kwargs=call.arguments
    )


def assistant_message(
    reasoning: str, content: str, calls: Sequence[ToolCall | PartialToolCall]
) -> ChatMessage:
    """An assistant message: a thinking block, the answer text, then the tool calls.

    The calls are also in ``additional_kwargs["tool_calls"]`` (OpenAI's form): LlamaIndex's
    structured streaming (``process_streaming_objects``) looks there to know that a streamed
    response holds calls, then reads them with ``get_tool_calls_from_response``.
    """
    blocks: list[Any] = []
    if reasoning:
        blocks.append(ThinkingBlock(content=reasoning))
    blocks.append(TextBlock(text=content))
    call_blocks = [tool_call_block(c) for c in calls]
    message = ChatMessage(role=MessageRole.ASSISTANT, blocks=blocks + call_blocks)
    if call_blocks:
        message.additional_kwargs["tool_calls"] = [_openai_call(b) for b in call_blocks]
    return message


def chat_response(
    response: RelayResponse, model_name: str, delta: str | None = None
) -> ChatResponse:
    """The whole turn: blocks in the message, usage and relay stats beside it (``delta`` is
    set when it ends a stream)."""
    message = assistant_message(response.reasoning, response.content, response.tool_calls)
    if response.invalid_tool_calls:
        message.additional_kwargs["invalid_tool_calls"] = [
            {"text": c.text, "error": c.error, "name": c.name} for c in response.invalid_tool_calls
        ]
    return ChatResponse(
        message=message,
        raw=raw(response),
        delta=delta,
        additional_kwargs=usage(response, model_name),
    )


def raw(response: RelayResponse) -> dict[str, Any]:
    """``usage`` in OpenAI's shape, over both models (LlamaIndex's token counter reads
    ``raw["usage"]`` and looks no further once it is there), and the whole ``result``."""
    return {"usage": openai_usage(response.result), "result": response.result.model_dump()}


def usage(response: RelayResponse, model_name: str) -> dict[str, Any]:
    """Token counts over both models under OpenAI's names, flat beside the response (as
    LlamaIndex's ``OpenAI`` puts them; the token counter reads ``raw["usage"]``)."""
    result = response.result
    return {
        "model_name": model_name,
        "finish_reason": response.finish_reason,
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "total_tokens": result.prompt_tokens + result.completion_tokens,
        "cached_tokens": result.cached_tokens,
        "reasoning_tokens": result.reasoning_tokens,
        "relay": result.summary(),
    }
