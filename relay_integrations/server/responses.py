"""The response side: relay chat events as OpenAI ``chat.completion`` objects and chunks.

Reasoning goes in ``reasoning`` and, for clients written before vLLM renamed it,
``reasoning_content``; the answer in ``content``; tool calls in ``tool_calls``. The relay's
own figures (large-model share, switches, per-model usage, who wrote each segment) ride along
in an extra ``relay`` field, which OpenAI clients keep in ``model_extra``; in a stream, every
chunk's ``relay.model`` names the model that wrote its delta::

    shaper = ResponseShaper(id="chatcmpl-...", model="Qwen/Qwen3-32B")
    shaper.chunk(ReasoningDelta("Let me see", "large"))  # {"object": "chat.completion.chunk", ...}
    shaper.completion(response)                         # {"object": "chat.completion", ...}
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from ..chat.exchange import (
    ChatEvent,
    ChatResponse,
    ContentDelta,
    ReasoningDelta,
    ToolCallDelta,
    openai_usage,
)
from ..chat.tool_calls import InvalidToolCall, ToolCall
from .errors import ApiError
from .public import client_summary


def tool_call(call: ToolCall | InvalidToolCall) -> dict[str, Any]:
    """An OpenAI tool call; an unreadable one passes its raw text on as the arguments."""
    arguments = (
        json.dumps(call.arguments, ensure_ascii=False) if isinstance(call, ToolCall) else call.text
    )
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name or "", "arguments": arguments},
    }


@dataclass
class ResponseShaper:
    """Builds the objects of one response, all with the same id, model and creation time."""

    id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))

    def completion(self, response: ChatResponse) -> dict[str, Any]:
        """The whole answer as a ``chat.completion`` object."""
        message: dict[str, Any] = {"role": "assistant", "content": response.content or None}
        if response.reasoning:
            message["reasoning"] = message["reasoning_content"] = response.reasoning
        if response.tool_calls:
            message["tool_calls"] = [tool_call(call) for call in response.tool_calls]
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": response.finish_reason,
                    "logprobs": None,
                }
            ],
            "usage": openai_usage(response.result),
            "relay": _relay_fields(response),
        }

    def first_chunk(self) -> dict[str, Any]:
        """The chunk that opens a stream: the assistant's role, no text yet."""
        return self._chunk({"role": "assistant", "content": ""})

    def chunk(self, event: ReasoningDelta | ContentDelta | ToolCallDelta) -> dict[str, Any]:
        """One streamed delta, naming the model that wrote it (``relay.model``)."""
        if isinstance(event, ReasoningDelta):
            chunk = self._chunk({"reasoning": event.text, "reasoning_content": event.text})
        elif isinstance(event, ContentDelta):
            chunk = self._chunk({"content": event.text})
        else:
            chunk = self._chunk({"tool_calls": [{"index": event.index, **tool_call(event.call)}]})
        chunk["relay"] = {"model": event.model}
        return chunk

    def final_chunk(self, response: ChatResponse) -> dict[str, Any]:
        """The chunk with the finish reason and the relay's figures (``relay.model``: the
        model that wrote the last segment)."""
        chunk = self._chunk({}, finish_reason=response.finish_reason)
        chunk["relay"] = {"model": response.last_model, **_relay_fields(response)}
        return chunk

    def usage_chunk(self, response: ChatResponse) -> dict[str, Any]:
        """The last chunk when ``stream_options.include_usage``: no choices, the usage."""
        chunk = self._chunk(None)
        chunk["usage"] = openai_usage(response.result)
        return chunk

    def _chunk(
        self, delta: dict[str, Any] | None, finish_reason: str | None = None
    ) -> dict[str, Any]:
        choices = (
            []
            if delta is None
            else [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]
        )
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }


@dataclass
class ChatCompletionsWire:
    """A chat completion as :class:`~.generation.GenerationResponse` writes it: the
    ``chat.completion`` object, or its chunks as ``data:`` events ending in ``[DONE]``
    (`include_usage`: a last chunk with the usage, as ``stream_options`` asks)."""

    shaper: ResponseShaper
    include_usage: bool = False

    def whole(self, response: ChatResponse) -> dict[str, Any]:
        return self.shaper.completion(response)

    def opening(self) -> list[bytes]:
        return [_data(self.shaper.first_chunk())]

    def event(self, event: ChatEvent) -> list[bytes]:
        assert isinstance(event, ReasoningDelta | ContentDelta | ToolCallDelta)
        return [_data(self.shaper.chunk(event))]

    def closing(self, response: ChatResponse) -> list[bytes]:
        events = [_data(self.shaper.final_chunk(response))]
        if self.include_usage:
            events.append(_data(self.shaper.usage_chunk(response)))
        return [*events, DONE]

    def failure(self, error: ApiError) -> list[bytes]:
        return [_data(error.body()), DONE]


DONE = b"data: [DONE]\n\n"


def _data(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk, ensure_ascii=False).encode() + b"\n\n"


def _relay_fields(response: ChatResponse) -> dict[str, Any]:
    fields = client_summary(response.result)
    if response.invalid_tool_calls:
        fields["invalid_tool_calls"] = [
            {**tool_call(call), "error": call.error} for call in response.invalid_tool_calls
        ]
    return fields
