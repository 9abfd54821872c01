"""The request side of ``POST /v1/responses``: the Responses API's input items, tools and text
format, checked and turned into the same chat turn a chat completion runs::

    body = parse_body(raw_bytes)                    # as for chat completions
    request = ResponsesRequest.of(body, limits)     # ApiError(400) naming the field
    turn = request.chat_request(defaults, generation_id="resp_...")

Input becomes chat messages: a string is one user message and ``instructions`` a system
message before the rest; a message item (role user, system, developer or assistant; text
parts) is a message; ``function_call`` items are the tool calls of an assistant message (calls
in a row share one, after the assistant text they follow); a ``function_call_output`` item is
a tool message and must answer a call made earlier in the input. ``reasoning`` items are
dropped: the Qwen3 and DeepSeek-R1 templates drop earlier turns' reasoning too. Any other item,
a hosted tool (web search, file search, ...) and fields the relay cannot honour are refused
with a 400 naming them; nothing is stored, so ``previous_response_id`` is refused with the
advice to send the whole conversation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictBool,
    ValidationError,
)

from ..chat.exchange import ChatRequest, joined_text, normalize_tool_choice
from ..chat.response_format import ResponseFormat
from ..upstream.config import MODEL_SAMPLING_FIELDS, OptionalSampling, SamplingConfig
from .errors import ApiError
from .fields import IGNORED_FIELDS, REFUSED, declared_fields
from .protocol import (
    ROLES,
    FunctionSpec,
    answer_format,
    check_message,
    pydantic_error,
    relay_message,
)
from .settings import ServerSettings

_NOT_STORED = (
    "this server keeps no responses; send the whole conversation in input (the earlier "
    "output items included) and store false, or leave store out"
)
RESPONSES_REFUSED: Mapping[str, str] = {
    "previous_response_id": _NOT_STORED,
    "store": _NOT_STORED,
    "conversation": _NOT_STORED,
    "background": "a background response is stored to be polled, and this server keeps none; "
    "stream the response instead",
    "include": "the relay has no logprobs, encrypted reasoning or hosted-tool results to "
    "include; the reasoning comes whole in the reasoning item",
    "top_logprobs": REFUSED["top_logprobs"],
    "truncation": "the relay does not drop input to fit the context window; a prompt over it "
    "is answered 400 context_length_exceeded: trim the input",
    "max_tool_calls": "the relay cannot cap the tool calls of a response; send "
    "parallel_tool_calls false for at most one",
    "prompt": "a stored prompt template lives on OpenAI's platform; send instructions and input",
    "service_tier": REFUSED["service_tier"],
    "moderation": REFUSED["moderation"],
    "context_management": "the relay does not compact the input; send it as it should be read",
}
"""Responses fields the relay cannot honour, with what to do instead (400 naming the field)."""

RESPONSES_OFF_VALUES: Mapping[str, tuple[Any, ...]] = {
    "store": (False,),
    "background": (False,),
    "include": ([],),
    "top_logprobs": (0,),
    "truncation": ("disabled",),
}
"""Values of refused fields that ask for nothing the relay lacks (null too)."""

RESPONSES_IGNORED = {name: IGNORED_FIELDS[name] for name in IGNORED_FIELDS if name != "metadata"}
"""Hints dropped without a word (``metadata`` is echoed in the response, as OpenAI does)."""

ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")
MESSAGE_ROLES = tuple(role for role in ROLES if role != "tool")
"""The roles of a message item (a tool's result is a function_call_output item)."""


class _FunctionTool(FunctionSpec):
    """A function tool in the Responses (flat) form: the chat form's function, with its type."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]

    def chat_tool(self) -> dict[str, Any]:
        """The tool in the chat completions form the chat templates render."""
        function = self.model_dump(exclude={"type"}, exclude_none=True)
        return {"type": "function", "function": function}


class _FunctionChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    name: str


class _TextFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class _Text(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: _TextFormat | None = None
    verbosity: Literal["medium"] | None = Field(
        default=None, description="OpenAI's default; the relay has no other"
    )


class _Reasoning(BaseModel):
    """``reasoning``: a summary may be asked for (it is the whole reasoning: nothing summarises
    it); the effort has no setting here."""

    model_config = ConfigDict(extra="forbid")

    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = Field(
        default=None, description="The deprecated name of summary"
    )
    effort: str | None = None


class _StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_obfuscation: StrictBool | None = None  # padding against side channels: no text


class ResponsesRequest(OptionalSampling):
    """The fields of a Responses API request that the relay reads (the sampling fields, with
    vLLM's ranges, are the relay's)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    stream: StrictBool = False
    stream_options: _StreamOptions | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    tools: list[_FunctionTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | _FunctionChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    text: _Text | None = None
    metadata: dict[str, str] | None = None
    reasoning: _Reasoning | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    _messages: list[dict[str, Any]] = PrivateAttr(default_factory=list)
    _answer_format: ResponseFormat | None = PrivateAttr(default=None)

    @classmethod
    def of(cls, body: Any, limits: ServerSettings) -> ResponsesRequest:
        """Validate a parsed body; every problem is a 400 naming its field."""
        declared = declared_fields(
            body,
            cls.model_fields,
            RESPONSES_IGNORED,
            refused=RESPONSES_REFUSED,
            off_values=RESPONSES_OFF_VALUES,
            requests="Responses requests",
        )
        _refuse_hosted_tools(declared.get("tools"))
        try:
            request = cls.model_validate(declared)
        except ValidationError as invalid:
            raise pydantic_error(invalid) from None
        request._check(limits)
        return request

    def _check(self, limits: ServerSettings) -> None:
        if self.max_output_tokens is not None and self.max_output_tokens > limits.max_tokens_limit:
            raise ApiError(
                400,
                f"max_output_tokens {self.max_output_tokens} is more than this server's limit "
                f"of {limits.max_tokens_limit}",
                param="max_output_tokens",
            )
        if self.tool_choice not in (None, "auto", "none") and not self.tools:
            raise ApiError(400, "tool_choice needs tools", param="tool_choice")
        if self.reasoning is not None and self.reasoning.effort is not None:
            raise ApiError(
                400,
                f"reasoning.effort: {REFUSED['reasoning_effort']}",
                param="reasoning.effort",
                code="unsupported_parameter",
            )
        self._answer_format = answer_format(self.text.format if self.text else None, "text.format")
        self._messages = messages = self.messages()
        if len(messages) > limits.max_messages:
            raise ApiError(
                400,
                f"the input makes {len(messages)} messages, more than this server's limit of "
                f"{limits.max_messages}",
                param="input",
            )

    def messages(self) -> list[dict[str, Any]]:
        """The input as chat messages (see the module docstring); a bad item is a 400."""
        messages: list[dict[str, Any]] = []
        if self.instructions:
            messages.append({"role": "system", "content": self.instructions})
        if isinstance(self.input, str):
            messages.append({"role": "user", "content": self.input})
            return messages
        if not self.input:
            raise ApiError(400, "input must hold at least one item", param="input")
        calls: set[str] = set()
        for index, item in enumerate(self.input):
            _add_item(messages, f"input[{index}]", item, calls)
        if not [m for m in messages if m["role"] != "system"]:
            raise ApiError(400, "input holds no message to answer", param="input")
        return messages

    def chat_request(self, defaults: SamplingConfig, generation_id: str) -> ChatRequest:
        """The relay turn this request asks for; sampling unset here takes the server's."""
        overrides: dict[str, Any] = {name: getattr(self, name) for name in MODEL_SAMPLING_FIELDS}
        overrides["max_tokens"] = self.max_output_tokens
        sampling = defaults.model_copy(update={k: v for k, v in overrides.items() if v is not None})
        choice = self.tool_choice
        wanted = (
            {"function": {"name": choice.name}} if isinstance(choice, _FunctionChoice) else choice
        )
        messages = self._messages or self.messages()
        for index, message in enumerate(messages):
            check_message(index, message)
        try:
            return ChatRequest(
                messages=[relay_message(m) for m in messages],
                tools=[tool.chat_tool() for tool in self.tools or ()],
                tool_choice=normalize_tool_choice(wanted),
                parallel_tool_calls=self.parallel_tool_calls is not False,
                response_format=self._answer_format,
                sampling=sampling,
                chat_template_kwargs=self.chat_template_kwargs or {},
                generation_id=generation_id,
            )
        except (ValueError, KeyError) as invalid:
            raise ApiError(400, f"tool_choice: {invalid}", param="tool_choice") from None

    @property
    def wants_summary(self) -> bool:
        """The request asks for a reasoning summary: the whole reasoning is sent as it."""
        asked = self.reasoning
        return asked is not None and (asked.summary or asked.generate_summary) is not None

    def echo(self, sampling: SamplingConfig) -> dict[str, Any]:
        """The request fields a response object repeats (`sampling`: what the relay used)."""
        choice = self.tool_choice
        answer_format = self.text.format if self.text and self.text.format else None
        return {
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "metadata": self.metadata or {},
            "parallel_tool_calls": self.parallel_tool_calls is not False,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "text": {
                "format": answer_format.model_dump(by_alias=True, exclude_none=True)
                if answer_format
                else {"type": "text"}
            },
            "tool_choice": choice.model_dump()
            if isinstance(choice, _FunctionChoice)
            else choice or "auto",
            "tools": [tool.model_dump(exclude_none=True) for tool in self.tools or ()],
            "reasoning": self.reasoning.model_dump() if self.reasoning else None,
            "user": None,
        }


def _refuse_hosted_tools(tools: Any) -> None:
    """A hosted tool (web search, file search, ...) by its type, before pydantic's union."""
    if not isinstance(tools, list):
        return
    for index, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise ApiError(
                400,
                f"tools[{index}] is of type {kind!r}: the relay runs function tools only (the "
                "models call them and the client runs them); hosted tools such as web search "
                "need OpenAI's platform",
                param=f"tools[{index}].type",
                code="unsupported_parameter",
            )


def _add_item(
    messages: list[dict[str, Any]], where: str, item: dict[str, Any], calls: set[str]
) -> None:
    """Append input `item` to `messages` (see the module docstring); `calls` holds the call
    ids made so far."""
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        messages.append(_message(where, item))
    elif kind == "function_call":
        call_id = _text_field(where, item, "call_id")
        name, arguments = _text_field(where, item, "name"), _text_field(where, item, "arguments")
        function = {"name": name, "arguments": arguments}
        call = {"id": call_id, "type": "function", "function": function}
        if messages and messages[-1]["role"] == "assistant":  # its text, or the calls before
            messages[-1].setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        calls.add(call_id)
    elif kind == "function_call_output":
        call_id = _text_field(where, item, "call_id")
        if call_id not in calls:
            raise ApiError(
                400,
                f"{where}.call_id {call_id[:64]!r} answers no function_call before it in the "
                "input; send the function_call item first",
                param=f"{where}.call_id",
            )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": _output(where, item)})
    elif kind == "reasoning":
        return  # earlier reasoning: the templates leave it out
    else:
        shown = kind if not isinstance(kind, str) or len(kind) <= 64 else kind[:64] + "..."
        raise ApiError(
            400,
            f"{where} is of type {shown!r}; the relay takes input items of type "
            f"{', '.join(ITEM_TYPES)} (an item_reference needs a stored response, and this "
            "server keeps none)",
            param=f"{where}.type",
        )


def _message(where: str, item: dict[str, Any]) -> dict[str, Any]:
    """A message item as a chat message: its role, and its text parts joined."""
    role = item.get("role")
    if role not in MESSAGE_ROLES:
        raise ApiError(
            400,
            f"{where}.role is {role!r}; it must be one of {', '.join(MESSAGE_ROLES)}",
            param=f"{where}.role",
        )
    content = item.get("content")
    if isinstance(content, list):
        content = joined_text(_part_text(f"{where}.content[{i}]", p) for i, p in enumerate(content))
    elif not isinstance(content, str):
        raise ApiError(
            400, f"{where}.content must be a string or a list of text parts", param=where
        )
    return {"role": role, "content": content}


_TEXT_PARTS = ("input_text", "output_text", "text")


def _part_text(where: str, part: Any) -> str:
    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
    if kind not in _TEXT_PARTS:
        raise ApiError(
            400,
            f"{where} is of type {kind!r}; the relay serves text models, so content parts "
            "must be input_text or output_text",
            param=where,
        )
    text = part.get("text")
    if not isinstance(text, str):
        raise ApiError(400, f"{where}.text must be a string", param=f"{where}.text")
    return text


def _output(where: str, item: dict[str, Any]) -> str:
    output = item.get("output")
    if isinstance(output, list):
        return joined_text(_part_text(f"{where}.output[{i}]", p) for i, p in enumerate(output))
    if not isinstance(output, str):
        raise ApiError(
            400, f"{where}.output must be a string or a list of text parts", param=f"{where}.output"
        )
    return output


def _text_field(where: str, item: dict[str, Any], name: str) -> str:
    value = item.get(name)
    if not isinstance(value, str) or (name != "arguments" and not value):
        raise ApiError(400, f"{where}.{name} must be a non-empty string", param=f"{where}.{name}")
    return value
