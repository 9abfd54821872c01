"""The request side of ``POST /v1/chat/completions``: parsed, checked, turned into a relay turn.

Everything a client sends is checked here, before any upstream request, and each problem
becomes a 400 that names the field and says what to send instead::

    body = parse_body(raw_bytes, limits)        # ApiError(400) on malformed JSON or fields
    request = ChatCompletionRequest.of(body, limits)
    turn = request.chat_request(defaults, generation_id="chatcmpl-...")

Unknown fields are ignored, as OpenAI-compatible servers do; fields that would change what the
client gets back and that the relay cannot honour (``n > 1``, ``logprobs``) are refused.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, field_validator

from ..core.chat import (
    ChatRequest,
    JsonObjectFormat,
    JsonSchemaFormat,
    ResponseFormat,
    normalize_tool_choice,
)
from ..core.config import (
    MODEL_SAMPLING_FIELDS,
    MinP,
    Penalty,
    RepetitionPenalty,
    SamplingConfig,
    Temperature,
    TopK,
    TopP,
)
from ..core.generation import RequestHook
from ..core.habits import REFUSED_FIELDS
from .errors import ApiError
from .settings import ServerSettings

ROLES = ("system", "developer", "user", "assistant", "tool")
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class _Function(BaseModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not _TOOL_NAME.match(name):
            raise ValueError("a function name is 1-64 letters, digits, '_' or '-'")
        return name

    @field_validator("parameters")
    @classmethod
    def _parameters(cls, parameters: dict[str, Any] | None) -> dict[str, Any] | None:
        if parameters is not None and parameters.get("type", "object") != "object":
            raise ValueError("function parameters must be a JSON schema of type 'object'")
        return parameters


class Tool(BaseModel):
    type: Literal["function"]
    function: _Function


class _JsonSchema(BaseModel):
    name: str = "response"
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class _ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: _JsonSchema | None = None


class ChatCompletionRequest(BaseModel):
    """The fields of an OpenAI chat completion request that the relay reads."""

    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[dict[str, Any]]
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = None
    seed: int | None = None
    logit_bias: dict[str, float] | None = None
    stop: str | list[str] | None = None
    n: int = 1
    logprobs: bool | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["auto", "none", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool = True
    response_format: _ResponseFormat | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @classmethod
    def of(cls, body: Any, limits: ServerSettings) -> ChatCompletionRequest:
        """Validate a parsed body; every problem is a 400 naming its field."""
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        try:
            request = cls.model_validate(body)
        except ValidationError as invalid:
            first = invalid.errors()[0]
            param = _param(first["loc"])
            raise ApiError(400, f"{param}: {first['msg']}", param=param) from None
        request._check(limits)
        return request

    @property
    def budget(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def _check(self, limits: ServerSettings) -> None:
        if self.n != 1:
            raise ApiError(
                400, f"n is {self.n}; the relay writes one choice per request", param="n"
            )
        if self.logprobs:
            raise ApiError(400, "logprobs are not available through the relay", param="logprobs")
        if self.logit_bias:
            raise ApiError(400, f"logit_bias: {REFUSED_FIELDS['logit_bias']}", param="logit_bias")
        if not self.messages:
            raise ApiError(400, "messages must hold at least one message", param="messages")
        if len(self.messages) > limits.max_messages:
            raise ApiError(
                400,
                f"{len(self.messages)} messages is more than this server's limit of "
                f"{limits.max_messages}",
                param="messages",
            )
        if self.budget is not None and self.budget > limits.max_tokens_limit:
            name = "max_completion_tokens" if self.max_completion_tokens else "max_tokens"
            raise ApiError(
                400,
                f"{name} {self.budget} is more than this server's limit of "
                f"{limits.max_tokens_limit}",
                param=name,
            )
        for index, message in enumerate(self.messages):
            check_message(index, message)
        if self.tool_choice not in (None, "auto", "none") and not self.tools:
            raise ApiError(400, "tool_choice needs tools", param="tool_choice")
        answer_format = self.response_format
        if answer_format and answer_format.type == "json_schema" and not answer_format.json_schema:
            raise ApiError(
                400,
                "response_format of type json_schema needs a json_schema object "
                '({"name": ..., "schema": {...}})',
                param="response_format.json_schema",
            )

    def chat_request(
        self,
        defaults: SamplingConfig,
        generation_id: str,
        request_hook: RequestHook | None = None,
    ) -> ChatRequest:
        """The relay turn this request asks for; sampling unset here takes the server's.

        `request_hook` is the server's (tests and benchmarks force outputs with it); clients
        cannot set upstream fields.
        """
        overrides = {name: getattr(self, name) for name in MODEL_SAMPLING_FIELDS}
        overrides["max_tokens"] = self.budget
        sampling = defaults.model_copy(update={k: v for k, v in overrides.items() if v is not None})
        stop: Sequence[str] = [self.stop] if isinstance(self.stop, str) else (self.stop or ())
        tools = [t.model_dump(exclude_none=True, by_alias=True) for t in self.tools or ()]
        try:
            return ChatRequest(
                messages=[relay_message(m) for m in self.messages],
                tools=tools,
                tool_choice=normalize_tool_choice(self.tool_choice),
                parallel_tool_calls=self.parallel_tool_calls,
                response_format=self._format(),
                stop=stop,
                sampling=sampling,
                chat_template_kwargs=self.chat_template_kwargs or {},
                generation_id=generation_id,
                request_hook=request_hook,
            )
        except (ValueError, KeyError) as invalid:
            raise ApiError(400, f"tool_choice: {invalid}", param="tool_choice") from None

    def _format(self) -> ResponseFormat | None:
        response_format = self.response_format
        if response_format is None or response_format.type == "text":
            return None
        if response_format.type == "json_object":
            return JsonObjectFormat()
        assert response_format.json_schema is not None  # checked in _check
        return JsonSchemaFormat(response_format.json_schema.schema_)


def parse_body(raw: bytes) -> Any:
    """The JSON of a request body, or a 400 that says where it is malformed."""
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as malformed:
        raise ApiError(400, f"the request body is not valid JSON: {malformed}") from None


def check_message(index: int, message: Any) -> None:
    """Refuse a message the chat template cannot take, naming the field to fix."""
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise ApiError(400, f"{where} must be an object with a role", param=where)
    role = message.get("role")
    if role not in ROLES:
        raise ApiError(
            400,
            f"{where}.role is {role!r}; it must be one of {', '.join(ROLES)}",
            param=f"{where}.role",
        )
    content = message.get("content")
    if content is None and not (role == "assistant" and message.get("tool_calls")):
        raise ApiError(400, f"{where}.content is missing", param=f"{where}.content")
    if isinstance(content, list):
        for part_index, part in enumerate(content):
            part_where = f"{where}.content[{part_index}]"
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ApiError(
                    400,
                    f"{part_where} is of type {kind!r}; the relay serves text models, so "
                    "content parts must be of type 'text'",
                    param=part_where,
                )
            if not isinstance(part.get("text"), str):
                raise ApiError(400, f"{part_where}.text must be a string", param=part_where)
    elif content is not None and not isinstance(content, str):
        raise ApiError(
            400, f"{where}.content must be a string or a list of text parts", param=where
        )
    if role == "tool" and not isinstance(message.get("tool_call_id"), str):
        raise ApiError(
            400,
            f"{where} has role 'tool' but no tool_call_id naming the call it answers",
            param=f"{where}.tool_call_id",
        )


def relay_message(message: dict[str, Any]) -> dict[str, Any]:
    """A checked message as the chat template takes it: text parts joined, reasoning dropped.

    Earlier turns' reasoning is left out, as the Qwen3 and DeepSeek-R1 templates do; a
    ``developer`` message is a ``system`` one for open models.
    """
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(part["text"] for part in content)
    converted = {
        key: value
        for key, value in message.items()
        if key not in ("reasoning", "reasoning_content", "content", "name")
    }
    converted["role"] = "system" if message["role"] == "developer" else message["role"]
    converted["content"] = content if content is not None else ""
    return converted


def _param(location: Sequence[int | str]) -> str:
    parts: list[str] = []
    for item in location:
        if isinstance(item, int):
            parts[-1] += f"[{item}]"
        elif item in ("function-after", "literal", "str", "list", "dict") or "[" in str(item):
            continue  # pydantic's union branch names, not fields of the request
        else:
            parts.append(str(item))
    return ".".join(parts) or "body"
