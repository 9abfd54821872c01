"""The response side of ``POST /v1/responses``: relay chat events as a Responses API ``response``
object, or as its stream of semantic events.

The output holds a ``reasoning`` item (the reasoning text, whole, in one ``reasoning_text``
part: both models wrote it; when the request asks for a summary, the same whole text is its
one ``summary_text``, as nothing summarises it), a ``message`` item with the answer as
``output_text``, and a ``function_call`` item per tool call. The relay's own figures ride
along in an extra ``relay`` field (as in chat completions); every text delta event's
``relay.model`` names the model that wrote it. A stream goes::

    response.created, response.in_progress
    response.output_item.added (reasoning), response.content_part.added,
        response.reasoning_text.delta ..., response.reasoning_text.done,
        response.content_part.done, response.output_item.done
        (with a summary asked for: response.reasoning_summary_part.added after the content
        part's, a response.reasoning_summary_text.delta after each reasoning_text.delta,
        response.reasoning_summary_text.done and response.reasoning_summary_part.done
        before the item's done)
    response.output_item.added (message), response.content_part.added,
        response.output_text.delta ..., response.output_text.done, ...
    response.output_item.added (function_call), response.function_call_arguments.delta,
        response.function_call_arguments.done, response.output_item.done
    response.completed | response.incomplete (the token budget) | response.failed

Events carry ``sequence_number``; the SSE ``event:`` line names each one's type::

    wire = ResponsesWire(id="resp_...", model="large", echo=request.echo(), summary=False)
    wire.opening()              # [b"event: response.created\\ndata: {...}\\n\\n", ...]
    wire.event(ContentDelta("Hi", "small"))
    wire.closing(chat_response)
    wire.whole(chat_response)   # the response object, for a request without stream
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from ..chat.exchange import ChatEvent, ChatResponse, ContentDelta, ReasoningDelta, ToolCallDelta
from ..chat.tool_calls import ToolCall
from ..relay.result import RelayResult
from ..upstream.config import ModelRole
from .errors import ApiError
from .public import client_summary

ItemKind = Literal["reasoning", "message"]
Status = Literal["in_progress", "completed", "incomplete", "failed"]


def responses_usage(result: RelayResult) -> dict[str, Any]:
    """Usage in the Responses API's shape, over both models and all their requests. Cached
    tokens are those the prefix caches served; cache writes the rest of the input, which vLLM's
    prefix caching computes and keeps (in whole blocks). Both are 0 when a server did not
    report its cached tokens (``relay.usage`` says which: ``cache_unreported``)."""
    cached = result.cached_tokens
    return {
        "input_tokens": result.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": cached or 0,
            "cache_write_tokens": 0 if cached is None else result.prompt_tokens - cached,
        },
        "output_tokens": result.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": result.reasoning_tokens},
        "total_tokens": result.prompt_tokens + result.completion_tokens,
    }


@dataclass
class _Open:
    """The reasoning or message item being streamed: its place, id and text so far."""

    kind: ItemKind
    index: int
    id: str
    text: list[str] = field(default_factory=list)


@dataclass
class ResponsesWire:
    """Builds one response's object and events: one id, model, creation time, and the request
    fields a response echoes (`echo`: instructions, tools, tool_choice, sampling, ...)."""

    id: str
    model: str
    echo: dict[str, Any]
    parallel_tool_calls: bool = True
    summary: bool = False
    """The request asked for a reasoning summary: the reasoning is sent as it too."""
    created_at: int = field(default_factory=lambda: int(time.time()))
    _sequence: int = 0
    _items: list[dict[str, Any]] = field(default_factory=list)
    _open: _Open | None = None
    _calls: int = 0

    # --- a response without stream -------------------------------------------------------

    def whole(self, response: ChatResponse) -> dict[str, Any]:
        """The finished response object."""
        items: list[dict[str, Any]] = []
        if response.reasoning:
            items.append(self._reasoning(self._item_id("rs", 0), response.reasoning, "completed"))
        if response.content or (not items and not response.tool_calls):  # as a stream has it
            items.append(self._message(self._item_id("msg", 0), response.content, "completed"))
        for number, call in enumerate(response.tool_calls):
            items.append(_function_call(self._item_id("fc", number), call, "completed"))
        return self._response(_status(response.result), items, response.result, response)

    # --- a stream ------------------------------------------------------------------------

    def opening(self) -> list[bytes]:
        """The events that open a stream."""
        started = self._response("in_progress", [], None)
        return [
            self._event("response.created", response=started),
            self._event("response.in_progress", response=started),
        ]

    def event(self, event: ChatEvent) -> list[bytes]:
        """The events of one delta of the answer (a whole tool call is one delta)."""
        if isinstance(event, ReasoningDelta | ContentDelta):
            kind: ItemKind = "reasoning" if isinstance(event, ReasoningDelta) else "message"
            events = [] if self._open and self._open.kind == kind else self._switch_to(kind)
            assert self._open is not None
            self._open.text.append(event.text)
            name = "reasoning_text" if kind == "reasoning" else "output_text"
            fields: dict[str, Any] = {"delta": event.text, "relay": {"model": event.model}}
            if kind == "message":
                fields["logprobs"] = []
            events.append(self._event(f"response.{name}.delta", **self._at(self._open), **fields))
            if kind == "reasoning" and self.summary:
                events.append(
                    self._event(
                        "response.reasoning_summary_text.delta",
                        **self._in_summary(self._open),
                        delta=event.text,
                        relay={"model": event.model},
                    )
                )
            return events
        if isinstance(event, ToolCallDelta) and isinstance(event.call, ToolCall):
            if self._calls and not self.parallel_tool_calls:
                return []  # the response keeps the first call only
            return self._close_open() + self._call_events(event.call, event.model)
        return []  # an unreadable call: named in relay.invalid_tool_calls at the end

    def closing(self, response: ChatResponse) -> list[bytes]:
        """The events that end a stream: the open item done, then the whole response."""
        events = self._close_open()
        status = _status(response.result)
        if not self._items:
            events += self._switch_to("message") + self._close_open()
        done = self._response(status, list(self._items), response.result, response)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        events.append(self._event(kind, response=done))
        return events

    def failure(self, error: ApiError) -> list[bytes]:
        """The events that end a stream that failed: what was written, as items left
        incomplete, and ``response.failed`` with the error (``relay.error``: the relay's own
        status and code, as chat completions gives them; ``relay.partial``: the partial
        result, when there is one)."""
        events = self._close_open(status="incomplete")
        failed = self._response("failed", list(self._items), None)
        failed["error"] = {"code": _error_code(error.status), "message": error.message}
        failed["relay"] = {
            "error": {"status": error.status, "code": error.code or error.kind},
            **error.extra.get("relay", {}),
        }
        events.append(self._event("response.failed", response=failed))
        return events

    # --- helpers -------------------------------------------------------------------------

    def _switch_to(self, kind: ItemKind) -> list[bytes]:
        """Close the open item and open one of `kind`: added events."""
        events = self._close_open()
        index = len(self._items)
        prefix = "rs" if kind == "reasoning" else "msg"
        opened = self._open = _Open(kind, index, self._item_id(prefix, index))
        item = (
            self._reasoning(opened.id, None, "in_progress")
            if kind == "reasoning"
            else self._message(opened.id, None, "in_progress")
        )
        events.append(self._event("response.output_item.added", output_index=index, item=item))
        part = _part(kind, "")
        events.append(self._event("response.content_part.added", **self._at(opened), part=part))
        if kind == "reasoning" and self.summary:
            summary = _summary_text("")
            events.append(
                self._event(
                    "response.reasoning_summary_part.added",
                    **self._in_summary(opened),
                    part=summary,
                )
            )
        return events

    def _close_open(self, status: Status = "completed") -> list[bytes]:
        """The done events of the open item, which joins the output."""
        opened, self._open = self._open, None
        if opened is None:
            return []
        # the deltas as sent, so that a client's sum of them is this text, and the whole
        # response's (the relay already trims the reasoning; the answer keeps its end)
        text = "".join(opened.text)
        where = self._at(opened)
        if opened.kind == "reasoning":
            done = self._event("response.reasoning_text.done", **where, text=text)
            item = self._reasoning(opened.id, text, status)
        else:
            done = self._event("response.output_text.done", **where, text=text, logprobs=[])
            item = self._message(opened.id, text, status)
        part = self._event("response.content_part.done", **where, part=_part(opened.kind, text))
        events = [done, part]
        if opened.kind == "reasoning" and self.summary:
            at = self._in_summary(opened)
            cut = {"status": "incomplete"} if status == "incomplete" else {}
            events += [
                self._event("response.reasoning_summary_text.done", **at, text=text),
                self._event(
                    "response.reasoning_summary_part.done", **at, part=_summary_text(text), **cut
                ),
            ]
        self._items.append(item)
        finished = self._event("response.output_item.done", output_index=opened.index, item=item)
        return [*events, finished]

    def _call_events(self, call: ToolCall, model: ModelRole) -> list[bytes]:
        index = len(self._items)
        item_id = self._item_id("fc", self._calls)
        self._calls += 1
        item = _function_call(item_id, call, "completed")
        where = {"item_id": item_id, "output_index": index}
        self._items.append(item)
        started = {**item, "arguments": "", "status": "in_progress"}
        return [
            self._event("response.output_item.added", output_index=index, item=started),
            self._event(
                "response.function_call_arguments.delta",
                **where,
                delta=item["arguments"],
                relay={"model": model},
            ),
            self._event(
                "response.function_call_arguments.done",
                **where,
                arguments=item["arguments"],
                name=call.name,
            ),
            self._event("response.output_item.done", output_index=index, item=item),
        ]

    def _response(
        self,
        status: Status,
        output: list[dict[str, Any]],
        result: RelayResult | None,
        response: ChatResponse | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.model,
            "output": output,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"}
            if status == "incomplete"
            else None,
            "usage": responses_usage(result) if result is not None and status != "failed" else None,
            "previous_response_id": None,
            "background": False,
            "store": False,
            "truncation": "disabled",
            **self.echo,
        }
        if status in ("completed", "incomplete"):
            body["completed_at"] = int(time.time())
        if response is not None:
            fields = client_summary(response.result)
            if response.invalid_tool_calls:
                fields["invalid_tool_calls"] = [
                    {"text": call.text, "error": call.error} for call in response.invalid_tool_calls
                ]
            body["relay"] = fields
        return body

    def _event(self, kind: str, **fields: Any) -> bytes:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        data = json.dumps(event, ensure_ascii=False)
        return f"event: {kind}\ndata: {data}\n\n".encode()

    def _at(self, opened: _Open) -> dict[str, Any]:
        return {"item_id": opened.id, "output_index": opened.index, "content_index": 0}

    def _in_summary(self, opened: _Open) -> dict[str, Any]:
        return {"item_id": opened.id, "output_index": opened.index, "summary_index": 0}

    def _item_id(self, prefix: str, number: int) -> str:
        return f"{prefix}_{self.id.removeprefix('resp_')}_{number}"

    def _reasoning(self, item_id: str, text: str | None, status: Status) -> dict[str, Any]:
        content = [] if text is None else [_part("reasoning", text)]
        summary = [_summary_text(text)] if self.summary and text is not None else []
        return {
            "type": "reasoning",
            "id": item_id,
            "summary": summary,
            "content": content,
            "status": status,
        }

    @staticmethod
    def _message(item_id: str, text: str | None, status: Status) -> dict[str, Any]:
        return {
            "type": "message",
            "id": item_id,
            "role": "assistant",
            "status": status,
            "content": [] if text is None else [_part("message", text)],
        }


def _part(kind: ItemKind, text: str) -> dict[str, Any]:
    if kind == "reasoning":
        return {"type": "reasoning_text", "text": text}
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _summary_text(text: str) -> dict[str, Any]:
    return {"type": "summary_text", "text": text}


def _function_call(item_id: str, call: ToolCall, status: Status) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call.id,
        "name": call.name,
        "arguments": json.dumps(call.arguments, ensure_ascii=False),
        "status": status,
    }


def _error_code(status: int) -> str:
    """The Responses API's error code for a failure the relay answers `status` for (the
    API's codes are a fixed list; the relay's own code is in ``relay.error``)."""
    if status == 429:
        return "rate_limit_exceeded"
    return "invalid_prompt" if status == 400 else "server_error"


def _status(result: RelayResult) -> Status:
    return "incomplete" if result.finish_reason == "length" else "completed"
