"""A chat turn on the relay: what every adapter needs, written once.

Adapters translate their framework's messages to OpenAI-format dicts and back. Everything in
between lives here: the tool choice, strict tools and the response format become vLLM
structured outputs on the answer (:meth:`ChatRequest.answer_constraint`); the relay's deltas
become reasoning deltas, answer text and tool calls (parsed from the Qwen3/Hermes
``<tool_call>`` format, or from the constrained JSON of a forced call)::

    request = ChatRequest(messages, tools=[weather_tool], tool_choice="required")
    async for event in stream_chat(switcher, request):
        if isinstance(event, ReasoningDelta): ...
        elif isinstance(event, ContentDelta): ...
        elif isinstance(event, ToolCallDelta): ...   # event.index, event.call
        # with stream_chat(..., partial_calls=True), a forced call also comes in pieces:
        elif isinstance(event, ToolCallChunk): ...   # event.index, event.id, event.text
        elif isinstance(event, ChatResponse): ...    # the whole turn, usage and stats
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, overload

from ..relay.request import RelayRequest
from ..relay.result import RelayDone, RelayResult, TextDelta
from ..relay.switcher import RelaySwitcher
from ..upstream.config import ModelRole, SamplingConfig
from .constraints import calls_or_json, forced_call_schema, is_strict, strict_calls
from .response_format import JsonObjectFormat, JsonSchemaFormat, ResponseFormat
from .tool_calls import InvalidToolCall, ToolCall, ToolCallStream, new_call_id, parse_call

Message = dict[str, Any]
ToolChoice = Literal["auto", "none", "required"] | str
"""``auto``, ``none``, ``required`` (any tool), or the name of the tool that must be called."""


@dataclass(frozen=True)
class ChatRequest:
    """One chat turn: OpenAI-format messages and tools, and how the answer must look."""

    messages: Sequence[Message]
    tools: Sequence[dict[str, Any]] = ()
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    stop: Sequence[str] = ()
    sampling: SamplingConfig | None = None
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    """vLLM fields for every request of both models (checked by the adapters)."""
    generation_id: str | None = None
    """Id of the generation upstream (session header, vLLM request ids); unique per turn."""

    def __post_init__(self) -> None:
        check_text_messages(self.messages)
        names = [tool_name(t) for t in self.tools]
        if self.tool_choice not in (None, "auto", "none", "required") and (
            self.tool_choice not in names
        ):
            raise ValueError(
                f"tool_choice {self.tool_choice!r} names no bound tool; the tools are {names}"
            )
        if self.tool_choice == "required" and not self.tools:
            raise ValueError("tool_choice 'required' needs at least one tool")

    @property
    def offered_tools(self) -> list[dict[str, Any]]:
        """The tools the model may call (none with ``tool_choice='none'``)."""
        return [] if self.tool_choice == "none" else list(self.tools)

    @property
    def forced_tools(self) -> list[dict[str, Any]]:
        """The tools one of which the answer must call (empty unless the choice forces it)."""
        if self.tool_choice == "required":
            return list(self.tools)
        if self.tool_choice in (None, "auto", "none"):
            return []
        return [t for t in self.tools if tool_name(t) == self.tool_choice]

    def answer_constraint(self) -> dict[str, Any] | None:
        """The vLLM ``structured_outputs`` field of the answer request, if any.

        A forced tool choice: one call, as bare JSON. Tools offered with a response format:
        tool calls *or* the formatted answer, the model's choice (forcing the format while
        tools are offered would make every agent answer before calling a tool). Only a
        response format: that JSON. Only tools: free text, with the blocks of strict tools
        constrained; none strict, no constraint.
        """
        if self.forced_tools:
            return {"json": forced_call_schema(self.forced_tools)}
        answer_schema = self._answer_schema()
        tools, parallel = self.offered_tools, self.parallel_tool_calls
        if tools and answer_schema is not None:
            return calls_or_json(tools, answer_schema, parallel)
        if tools:
            return strict_calls(tools, parallel) if any(map(is_strict, tools)) else None
        if isinstance(self.response_format, JsonObjectFormat):
            return {"json_object": True}
        return {"json": answer_schema} if answer_schema is not None else None

    def relay_request(self) -> RelayRequest:
        """The relay generation this turn asks for: the tools the template shows (all that
        are given), the answer constrained as :meth:`answer_constraint` says."""
        constraint = self.answer_constraint()
        return RelayRequest(
            self.messages,
            # shown to the model whatever the choice, as vLLM's chat endpoint shows them
            # (unless it runs with --exclude-tools-when-tool-choice-none)
            tools=list(self.tools),
            chat_template_kwargs=self.chat_template_kwargs,
            sampling=self.sampling,
            stop=self.stop,
            answer_extra_body={"structured_outputs": constraint} if constraint else {},
            extra_body=self.extra_body,
            generation_id=self.generation_id,
        )

    def _answer_schema(self) -> dict[str, Any] | None:
        if isinstance(self.response_format, JsonSchemaFormat):
            return self.response_format.schema
        if isinstance(self.response_format, JsonObjectFormat):
            return {"type": "object"}
        return None


@dataclass(frozen=True)
class ReasoningDelta:
    text: str
    model: ModelRole


@dataclass(frozen=True)
class ContentDelta:
    text: str
    model: ModelRole


@dataclass(frozen=True)
class ToolCallDelta:
    """A finished tool call (or an unreadable one), numbered in answer order; ``model`` wrote
    its end."""

    index: int
    call: ToolCall | InvalidToolCall
    model: ModelRole


@dataclass(frozen=True)
class ToolCallChunk:
    """A piece of a forced call as it is written: ``text`` continues the call's JSON
    (``{"name": ..., "arguments": {...}}``); the :class:`ToolCallDelta` with the same index
    ends it, with the same ``id``. Streamed only when asked (``partial_calls=True``)."""

    index: int
    id: str
    text: str
    model: ModelRole


@dataclass(frozen=True)
class ChatResponse:
    """The whole turn: the answer split into content and tool calls, and the relay's result."""

    content: str
    reasoning: str
    tool_calls: list[ToolCall]
    invalid_tool_calls: list[InvalidToolCall]
    finish_reason: Literal["stop", "length", "tool_calls"]
    result: RelayResult

    @property
    def last_model(self) -> ModelRole | None:
        """The model that wrote the last segment (None if nothing was written)."""
        return self.result.segments[-1].model if self.result.segments else None


ChatEvent = ReasoningDelta | ContentDelta | ToolCallDelta | ChatResponse
AnswerPiece = str | ToolCall | InvalidToolCall


@overload
def stream_chat(
    switcher: RelaySwitcher, request: ChatRequest, *, partial_calls: Literal[False] = False
) -> AsyncGenerator[ChatEvent, None]: ...


@overload
def stream_chat(
    switcher: RelaySwitcher, request: ChatRequest, *, partial_calls: bool
) -> AsyncGenerator[ChatEvent | ToolCallChunk, None]: ...


async def stream_chat(
    switcher: RelaySwitcher, request: ChatRequest, *, partial_calls: bool = False
) -> AsyncGenerator[ChatEvent | ToolCallChunk, None]:
    """Run one chat turn on the relay, streaming what a chat client shows.

    With ``partial_calls``, a forced call also streams as :class:`ToolCallChunk` pieces while
    it is written (structured output that grows); calls in ``<tool_call>`` blocks still
    arrive whole.
    """
    forced = bool(request.forced_tools)
    forced_id = new_call_id()  # the forced call's id, in its chunks and once it is whole
    forced_json: list[str] = []  # a forced call's JSON as it is written, parsed at the end
    parser = ToolCallStream() if request.offered_tools and not forced else None
    answer = _Answer()
    result: RelayResult | None = None
    async for event in switcher.stream_request(request.relay_request()):
        if isinstance(event, TextDelta):
            if event.phase == "reasoning":
                yield ReasoningDelta(event.text, event.model)
            elif forced:
                forced_json.append(event.text)
                if partial_calls:
                    yield ToolCallChunk(0, forced_id, event.text, event.model)
            else:
                pieces: list[AnswerPiece] = (
                    [event.text] if parser is None else parser.feed(event.text)
                )
                for chat_event in answer.add(pieces, event.model):
                    yield chat_event
        elif isinstance(event, RelayDone):
            result = event.result
    assert result is not None, "a relay stream always ends with RelayDone"
    last_model = result.segments[-1].model if result.segments else "large"
    if forced and "".join(forced_json).strip():  # nothing written (a stop at once): no call
        call = replace(_forced_call("".join(forced_json), result), id=forced_id)
        for chat_event in answer.add([call], last_model):
            yield chat_event
    elif parser is not None:
        for chat_event in answer.add(parser.close(), last_model):
            yield chat_event
    yield answer.response(result, request.parallel_tool_calls)


@dataclass
class _Answer:
    """The answer as it streams: its text, and its tool calls numbered in answer order."""

    content: list[str] = field(default_factory=list)
    calls: list[ToolCall | InvalidToolCall] = field(default_factory=list)

    def add(
        self, pieces: list[str | ToolCall | InvalidToolCall], model: ModelRole
    ) -> list[ChatEvent]:
        """Take the parsed pieces of the answer; returns the events a chat client shows."""
        events: list[ChatEvent] = []
        for piece in pieces:
            if isinstance(piece, str):
                self.content.append(piece)
                events.append(ContentDelta(piece, model))
            else:
                self.calls.append(piece)
                events.append(ToolCallDelta(len(self.calls) - 1, piece, model))
        return events

    def response(self, result: RelayResult, parallel_tool_calls: bool) -> ChatResponse:
        valid = [c for c in self.calls if isinstance(c, ToolCall)]
        if not parallel_tool_calls:
            valid = valid[:1]
        content = "".join(self.content)
        return ChatResponse(
            # as vLLM's parsers give it: the answer's text as written (a trailing space
            # before a stop string kept), stripped around tool calls
            content=content.strip() if self.calls else content,
            reasoning=result.reasoning,
            tool_calls=valid,
            invalid_tool_calls=[c for c in self.calls if isinstance(c, InvalidToolCall)],
            finish_reason="tool_calls" if valid else _finish(result),
            result=result,
        )


def openai_usage(result: RelayResult) -> dict[str, Any]:
    """Usage in the shape of OpenAI's ``usage`` object, over both models and all their
    requests (each request's prompt counts), reasoning included in the completion.

    ``cached_tokens`` are the prompt tokens the servers' prefix caches served: most of each
    request's prompt after the first, since every switch re-sends the transcript.
    """
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "total_tokens": result.prompt_tokens + result.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": result.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": result.reasoning_tokens},
    }


def normalize_tool_choice(
    choice: str | bool | Mapping[str, Any] | None, required: bool = False
) -> ToolChoice | None:
    """A framework's tool choice as the relay's: ``auto``, ``none``, ``required`` or a name.

    Takes OpenAI's forms (``{"type": "function", "function": {"name": ...}}``, ``"required"``),
    LangChain's (``"any"``, ``True``/``False``) and LlamaIndex's ``tool_required`` flag, which
    turns an unset or ``auto`` choice into ``required``.
    """
    if isinstance(choice, Mapping):
        return str(choice.get("function", choice)["name"])
    if choice is True or choice in ("any", "required"):
        return "required"
    if choice is False:
        return "none"
    if choice is None or choice == "auto":
        return "required" if required else choice
    return str(choice)


def check_text_messages(messages: Sequence[Message]) -> None:
    """Refuse what the two text models cannot read, before any request is sent: no messages
    at all, or a content part other than text (an image, audio, a file)."""
    if not messages:
        raise ValueError("the chat has no messages: give at least one (e.g. the user's question)")
    for index, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for part_index, part in enumerate(content):
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            if kind != "text":
                raise ValueError(
                    f"messages[{index}].content[{part_index}] is of type {kind!r}: the relay's "
                    "models read text only (both are text models), so send text parts only "
                    "(describe an image in words, or extract a file's text first)"
                )


def joined_text(parts: Iterable[str]) -> str:
    """A message's text parts as one string, as vLLM's chat endpoint joins them before the
    chat template (with a newline), so that a chat given in parts is the prompt the model's
    own endpoint would render::

        joined_text(["Describe the Louvre ", "in a few words."])  # 'Describe the Louvre \nin ...'
    """
    return "\n".join(parts)


def tool_name(tool: Mapping[str, Any]) -> str:
    """The function name of an OpenAI-format tool."""
    function = tool.get("function", tool)
    return str(function["name"])


def _forced_call(text: str, result: RelayResult) -> ToolCall | InvalidToolCall:
    if result.finish_reason == "length":
        return InvalidToolCall(text.strip(), "the tool call was cut off by the token limit")
    return parse_call(text)


def _finish(result: RelayResult) -> Literal["stop", "length"]:
    return "length" if result.finish_reason == "length" else "stop"
