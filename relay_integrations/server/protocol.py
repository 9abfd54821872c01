"""The request side of ``POST /v1/chat/completions``: parsed, checked, turned into a relay turn.

Everything a client sends is checked here, before any upstream request, and each problem
becomes a 400 that names the field and says what to send instead::

    body = parse_body(raw_bytes)                # ApiError(400): malformed, too deep, surrogates
    request = ChatCompletionRequest.of(body, limits)  # ApiError(400) naming the field
    turn = request.chat_request(defaults, generation_id="chatcmpl-...")

Fields that would change what the client gets back and that the relay cannot honour
(``n > 1``, ``logprobs``, ``reasoning_effort``, ...) are refused with the reason, and so is any
unknown field: only hints that cannot change the answer (``user``, ``metadata``) are dropped
(:mod:`.fields`; the table is in docs/deployment.md).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictBool,
    ValidationError,
    field_validator,
)

from ..chat.exchange import ChatRequest, joined_text, normalize_tool_choice
from ..chat.habits import REFUSED_FIELDS
from ..chat.response_format import ResponseFormat, response_format_of
from ..upstream.config import MODEL_SAMPLING_FIELDS, OptionalSampling, SamplingConfig
from .errors import ApiError
from .fields import IGNORED_FIELDS, declared_fields
from .settings import ServerSettings

ROLES = ("system", "developer", "user", "assistant", "tool")
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_JSON_DEPTH = 64
"""Containers inside containers a body may nest (a tool's JSON schema ~25 levels deep fits);
deeper bodies are refused before anything walks them recursively."""
MAX_NUMBER_DIGITS = 100
_SURROGATE = re.compile(r"[\ud800-\udfff]")


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: StrictBool = False
    # OpenAI pads chunks against side channels; padding cannot change the text (ignored).
    include_obfuscation: StrictBool | None = None


class FunctionSpec(BaseModel):
    """A function tool's name, description and JSON-schema parameters, checked."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not TOOL_NAME.match(name):
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
    function: FunctionSpec


class _FunctionName(BaseModel):
    name: str


class _NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: _FunctionName


class _JsonSchema(BaseModel):
    name: str = "response"
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class _ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: _JsonSchema | None = None


class ChatCompletionRequest(OptionalSampling):
    """The fields of an OpenAI chat completion request that the relay reads (the sampling
    fields, with vLLM's ranges, are the relay's)."""

    model_config = ConfigDict(extra="forbid")  # `of` refuses or drops the others first

    model: str
    messages: list[dict[str, Any]]
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logit_bias: dict[str, float] | None = None
    stop: str | list[str] | None = None
    n: int = 1
    logprobs: bool | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["auto", "none", "required"] | _NamedToolChoice | None = None
    parallel_tool_calls: StrictBool = True
    response_format: _ResponseFormat | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    _answer_format: ResponseFormat | None = PrivateAttr(default=None)

    @classmethod
    def of(cls, body: Any, limits: ServerSettings) -> ChatCompletionRequest:
        """Validate a parsed body; every problem is a 400 naming its field."""
        declared = declared_fields(body, cls.model_fields, IGNORED_FIELDS)
        try:
            request = cls.model_validate(declared)
        except ValidationError as invalid:
            raise pydantic_error(invalid) from None
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
            raise ApiError(
                400,
                f"logprobs are not available through the relay: {REFUSED_FIELDS['logprobs']}",
                param="logprobs",
                code="unsupported_parameter",
            )
        if self.logit_bias:
            raise ApiError(
                400,
                f"logit_bias: {REFUSED_FIELDS['logit_bias']}",
                param="logit_bias",
                code="unsupported_parameter",
            )
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
        self._check_stop(limits)
        if self.tool_choice not in (None, "auto", "none") and not self.tools:
            raise ApiError(400, "tool_choice needs tools", param="tool_choice")
        self._answer_format = answer_format(self.response_format, "response_format")

    def _check_stop(self, limits: ServerSettings) -> None:
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        if len(stops) > limits.max_stop_strings:
            raise ApiError(
                400,
                f"stop holds {len(stops)} strings; this server takes at most "
                f"{limits.max_stop_strings}",
                param="stop",
            )
        for index, stop in enumerate(stops):
            where = "stop" if isinstance(self.stop, str) else f"stop[{index}]"
            if not stop:
                raise ApiError(400, f"{where} is empty; a stop string has text", param="stop")
            if len(stop) > limits.max_stop_length:
                raise ApiError(
                    400,
                    f"{where} is {len(stop)} characters long; this server takes stop strings "
                    f"of at most {limits.max_stop_length}",
                    param="stop",
                )

    def chat_request(self, defaults: SamplingConfig, generation_id: str) -> ChatRequest:
        """The relay turn this request asks for; sampling unset here takes the server's.

        Clients cannot set upstream fields.
        """
        overrides = {name: getattr(self, name) for name in MODEL_SAMPLING_FIELDS}
        overrides["max_tokens"] = self.budget
        sampling = defaults.model_copy(update={k: v for k, v in overrides.items() if v is not None})
        stop: Sequence[str] = [self.stop] if isinstance(self.stop, str) else (self.stop or ())
        tools = [t.model_dump(exclude_none=True, by_alias=True) for t in self.tools or ()]
        choice = self.tool_choice
        tool_choice = choice.model_dump() if isinstance(choice, _NamedToolChoice) else choice
        try:
            return ChatRequest(
                messages=[relay_message(m) for m in self.messages],
                tools=tools,
                tool_choice=normalize_tool_choice(tool_choice),
                parallel_tool_calls=self.parallel_tool_calls,
                response_format=self._answer_format,
                stop=stop,
                sampling=sampling,
                chat_template_kwargs=self.chat_template_kwargs or {},
                generation_id=generation_id,
            )
        except (ValueError, KeyError) as invalid:
            raise ApiError(400, f"tool_choice: {invalid}", param="tool_choice") from None


def answer_format(given: BaseModel | None, where: str) -> ResponseFormat | None:
    """A request's validated response format as the relay's; a 400 naming `where` if it
    has no schema to follow."""
    if given is None:
        return None
    try:
        return response_format_of(given.model_dump(by_alias=True, exclude_none=True), where)
    except ValueError as invalid:
        raise ApiError(400, str(invalid), param=where) from None


def pydantic_error(invalid: ValidationError) -> ApiError:
    """A request model's validation error as a 400 naming the field."""
    errors = invalid.errors()
    # a union's branches each fail; the one that got furthest names the problem
    first = max(
        (e for e in errors if e["loc"][:1] == errors[0]["loc"][:1]),
        key=lambda e: len(e["loc"]),
    )
    param = _param(first["loc"])
    return ApiError(400, f"{param}: {first['msg']}", param=param)


class _BadNumber(ValueError):
    """A JSON number the relay cannot carry (raised from json.loads' number hooks)."""


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_NUMBER_DIGITS:
        raise _BadNumber(f"a number has more than {MAX_NUMBER_DIGITS} digits")
    return int(text)


def _parse_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise _BadNumber(f"the number {text[:40]} is too large for a float")
    return number


def _parse_constant(name: str) -> float:
    raise _BadNumber(f"{name} is not a JSON number")


def parse_body(raw: bytes) -> Any:
    """The JSON of a request body, or a 400 that says where it is malformed.

    Stricter than :func:`json.loads`: no ``NaN``/``Infinity``, no numbers beyond a float or
    longer than 100 digits, no lone UTF-16 surrogates (``"\\ud800"``: valid JSON escapes, but
    no UTF-8 text can carry them upstream), and no nesting deeper than ``MAX_JSON_DEPTH``.
    """
    try:
        body = json.loads(
            raw,
            parse_int=_parse_int,
            parse_float=_parse_float,
            parse_constant=_parse_constant,
        )
    except RecursionError:
        raise ApiError(400, _too_deep("the body")) from None
    except _BadNumber as bad:
        raise ApiError(400, f"the request body is not valid JSON: {bad}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as malformed:
        raise ApiError(400, f"the request body is not valid JSON: {malformed}") from None
    _check_json(body)
    return body


def _too_deep(where: str) -> str:
    return f"the request body nests JSON deeper than {MAX_JSON_DEPTH} levels (at {where})"


def _check_json(body: Any) -> None:
    """Refuse nesting past MAX_JSON_DEPTH and strings with lone surrogates, naming where.

    One pass without recursion; only containers are pushed, so a long flat array costs one
    type check per item.
    """
    if isinstance(body, str) and _SURROGATE.search(body):
        raise _surrogate("the body", "body")
    if not isinstance(body, dict | list):
        return
    stack: list[tuple[Any, int, tuple[str | int, ...]]] = [(body, 1, ())]
    while stack:
        value, depth, path = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ApiError(400, _too_deep(_where(path)), param=_where(path))
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if isinstance(key, str) and not key.isascii() and _SURROGATE.search(key):
                raise _surrogate(f"a key of {_where(path)}", _where(path))
            if isinstance(item, str):
                if not item.isascii() and _SURROGATE.search(item):
                    where = _where((*path, key))
                    raise _surrogate(where, where)
            elif isinstance(item, dict | list):
                stack.append((item, depth + 1, (*path, key)))


def _surrogate(what: str, param: str) -> ApiError:
    return ApiError(
        400,
        f"{what} holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape); strings "
        "must be valid Unicode",
        param=param,
    )


def _where(path: Sequence[str | int]) -> str:
    """A JSON path as the errors name fields: ``messages[0].content``; ``body`` for the top."""
    text = ""
    for part in path:
        name = part if isinstance(part, int) or len(part) <= 64 else part[:64] + "..."
        text += f"[{name}]" if isinstance(name, int) else (f".{name}" if text else name)
    return text if len(text) <= 200 else "..." + text[-200:]  # an error message, not an echo


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
    for key in ("name", "tool_call_id", "reasoning", "reasoning_content", "refusal"):
        if message.get(key) is not None and not isinstance(message[key], str):
            raise ApiError(400, f"{where}.{key} must be a string", param=f"{where}.{key}")
    if message.get("tool_calls") is not None:
        _check_tool_calls(where, message["tool_calls"])
    if role == "tool" and not isinstance(message.get("tool_call_id"), str):
        raise ApiError(
            400,
            f"{where} has role 'tool' but no tool_call_id naming the call it answers",
            param=f"{where}.tool_call_id",
        )


def _check_tool_calls(where: str, calls: Any) -> None:
    """An assistant's earlier calls, as OpenAI writes them (the template renders each)."""
    if not isinstance(calls, list):
        raise ApiError(400, f"{where}.tool_calls must be a list", param=f"{where}.tool_calls")
    for index, call in enumerate(calls):
        call_where = f"{where}.tool_calls[{index}]"
        function = call.get("function") if isinstance(call, dict) else None
        if (
            not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
            or not isinstance(function.get("arguments"), str | dict)
            or not isinstance(call.get("id", ""), str)
            or call.get("type", "function") != "function"
        ):
            raise ApiError(
                400,
                f"{call_where} must be {{'id': str, 'type': 'function', 'function': "
                "{'name': str, 'arguments': a JSON string}}",
                param=call_where,
            )


def relay_message(message: dict[str, Any]) -> dict[str, Any]:
    """A checked message as the chat template takes it: text parts joined as vLLM joins them,
    reasoning dropped.

    Earlier turns' reasoning is left out, as the Qwen3 and DeepSeek-R1 templates do; a
    ``developer`` message is a ``system`` one for open models.
    """
    content = message.get("content")
    if isinstance(content, list):
        content = joined_text(part["text"] for part in content)
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
        elif str(item).lstrip("_")[:1].isupper():
            continue  # a union branch that is a model (_NamedToolChoice)
        else:
            parts.append(str(item)[:64])
    return ".".join(parts)[:200] or "body"
