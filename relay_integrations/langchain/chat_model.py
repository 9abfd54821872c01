"""``RelayChatModel``: RelayGen as a LangChain chat model, a drop-in for ``ChatOpenAI``."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from operator import itemgetter
from typing import Any, Literal, TypeVar

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.exceptions import ContextOverflowError, OutputParserException
from langchain_core.language_models import BaseChatModel, LangSmithParams, LanguageModelInput
from langchain_core.language_models.model_profile import ModelProfile
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.output_parsers import (
    JsonOutputKeyToolsParser,
    JsonOutputParser,
    PydanticOutputParser,
    PydanticToolsParser,
)
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.v1 import BaseModel as BaseModelV1
from pydantic.v1 import ValidationError as ValidationErrorV1

from ..chat.exchange import ChatRequest, ChatResponse, normalize_tool_choice
from ..chat.response_format import (
    FORMAT_TYPES,
    JsonObjectFormat,
    JsonSchemaFormat,
    ResponseFormat,
    response_format_of,
)
from ..chat.settings import RelaySettings
from ..relay.errors import ContextOverflowError as RelayOverflow
from . import messages as convert

StructuredOutputMethod = Literal["function_calling", "json_schema", "json_mode"]
T = TypeVar("T")


class RelayContextOverflowError(ContextOverflowError, RelayOverflow):
    """The prompt does not fit a model's window: LangChain's ``ContextOverflowError`` (so
    ``with_fallbacks`` and retry logic can tell it apart) and the relay's (with
    ``prompt_tokens`` and ``windows`` per model)."""

    def __init__(self, overflow: RelayOverflow) -> None:
        RelayOverflow.__init__(self, overflow.prompt_tokens, overflow.windows)


async def _as_langchain_errors(events: AsyncIterator[T]) -> AsyncIterator[T]:
    """`events`, with the relay's context overflow raised as LangChain's; leaving early closes
    `events` at once (and so its upstream requests)."""
    try:
        async for event in events:
            yield event
    except RelayOverflow as overflow:
        raise RelayContextOverflowError(overflow) from overflow
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()


class RelayChatModel(RelaySettings, BaseChatModel):
    """A large reasoning model and a small one, switching inside each generation (RelayGen).

    The large model reasons; whenever it writes a calibrated switch cue ("Therefore,", ...)
    the small model finishes the sentence and hands back; after ``</think>`` the small model
    writes the answer. Both are vLLM OpenAI-compatible servers.

    Setup:
        Serve both models with vLLM (``VLLM_MAX_STOP_STRINGS=1024 vllm serve ...`` is
        best; a stock server works too), then
        ``pip install relay-integrations``. Unset fields come from ``RELAY_LARGE__BASE_URL``,
        ``RELAY_LARGE__MODEL``, ``RELAY_SMALL__BASE_URL``, ``RELAY_SMALL__MODEL``,
        ``RELAY_CUES`` and ``RELAY_API_KEY``.

    Instantiate:
        .. code-block:: python

            from relay_integrations.langchain import RelayChatModel

            llm = RelayChatModel(
                large_url="http://gpu-a:8000/v1", large_model="Qwen/Qwen3-32B",
                small_url="http://gpu-b:8001/v1", small_model="Qwen/Qwen3-1.7B",
                cues="builtin:qwen3-32b--qwen3-1.7b",   # or a `relaygen calibrate` artifact
                temperature=0.6, max_tokens=8192, timeout=120, max_retries=3,
            )

    Invoke:
        .. code-block:: python

            msg = llm.invoke("How many primes are below 30?")
            msg.content                                  # the answer only
            msg.additional_kwargs["reasoning_content"]   # the reasoning, both models' text

    Stream:
        .. code-block:: python

            for chunk in llm.stream("How many primes are below 30?"):
                print(chunk.additional_kwargs.get("reasoning_content", ""), chunk.text, end="")

    Async:
        .. code-block:: python

            msg = await llm.ainvoke("...")
            async for chunk in llm.astream("..."): ...
            msgs = await llm.abatch(["...", "..."])     # concurrent generations

    Tool calling:
        .. code-block:: python

            def get_weather(city: str) -> str:
                \"\"\"Weather in a city.\"\"\"

            llm_with_tools = llm.bind_tools([get_weather], tool_choice="auto")
            llm_with_tools.invoke("Weather in Paris?").tool_calls
            # [{'name': 'get_weather', 'args': {'city': 'Paris'}, 'id': 'call_...'}]

        ``tool_choice`` is ``auto``, ``any``/``required``, ``none`` or a tool's name; a forced
        choice constrains the answer with vLLM structured outputs, so the call is well-formed.
        ``bind_tools(..., strict=True)`` constrains every call's arguments to its tool's schema.

    Structured output:
        .. code-block:: python

            class Answer(BaseModel):
                value: int
                reason: str

            llm.with_structured_output(Answer).invoke("...")      # json_schema (default)
            llm.with_structured_output(Answer, method="function_calling", include_raw=True)

    Usage:
        ``msg.usage_metadata``: input and output tokens summed over both models and all
        their requests, ``input_token_details.cache_read`` (prefix-cache hits) and
        ``output_token_details.reasoning``.

    Response metadata:
        ``msg.response_metadata``: ``model_name``, ``finish_reason`` and ``relay`` (the
        large-model share of written tokens, switches, time, usage per model).
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    streaming: bool = Field(
        default=False,
        description="invoke() streams, so callbacks see each token (as ChatOpenAI's streaming)",
    )
    stream_usage: bool = Field(
        default=True, description="Usage on the last streamed chunk (per call: stream_usage=)"
    )

    @property
    def _llm_type(self) -> str:
        return "relay-chat"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "large_model": self.large_model,
            "small_model": self.small_model,
            "cues": self.cues,
            **self.sampling().model_dump(),
        }

    def _resolve_model_profile(self) -> ModelProfile | None:
        return ModelProfile(
            text_inputs=True,
            image_inputs=False,
            audio_inputs=False,
            pdf_inputs=False,
            video_inputs=False,
            reasoning_output=True,
            text_outputs=True,
            tool_calling=True,
            tool_choice=True,
            tool_call_streaming=True,
            structured_output=True,
            max_output_tokens=self.max_tokens,
        )

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = LangSmithParams(
            ls_provider="relay",
            ls_model_name=kwargs.get("model", self.model_name),
            ls_model_type="chat",
            ls_temperature=kwargs.get("temperature", self.temperature),
            ls_max_tokens=kwargs.get("max_tokens", self.max_tokens),
        )
        if stop_sequences := stop or self.stop:
            params["ls_stop"] = stop_sequences
        return params

    # -- generation ---------------------------------------------------------------------

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        stream_usage = kwargs.pop("stream_usage", None)
        with_usage = self.stream_usage if stream_usage is None else bool(stream_usage)
        answer_format = kwargs.get("response_format")
        request = self._request(messages, stop, kwargs)
        async for event in _as_langchain_errors(self._client.stream(request)):
            if isinstance(event, ChatResponse):
                chunk = convert.final_chunk(event, self.model_name, with_usage=with_usage)
                if answer_format is not None:
                    chunk.additional_kwargs["parsed"] = _parsed(event, answer_format)
            else:
                chunk = convert.delta_chunk(event)
            generation = ChatGenerationChunk(message=chunk)
            if run_manager is not None:
                await run_manager.on_llm_new_token(generation.text, chunk=generation)
            yield generation

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        answer_format = kwargs.get("response_format")
        try:
            response = await self._client.respond(self._request(messages, stop, kwargs))
        except RelayOverflow as overflow:
            raise RelayContextOverflowError(overflow) from overflow
        message = convert.message(response, self.model_name)
        if answer_format is not None:
            message.additional_kwargs["parsed"] = _parsed(response, answer_format)
        info = {"finish_reason": response.finish_reason}
        return ChatResult(generations=[ChatGeneration(message=message, generation_info=info)])

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return self._client.run(self._agenerate(messages, stop, None, **kwargs))

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        for generation in self._client.iterate(self._astream(messages, stop, None, **kwargs)):
            if run_manager is not None:
                run_manager.on_llm_new_token(generation.text, chunk=generation)
            yield generation

    # -- tools and structured output ------------------------------------------------------

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: dict[str, Any] | str | bool | None = None,
        parallel_tool_calls: bool | None = None,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools, rendered by the model's own chat template.

        ``tool_choice``: ``"auto"`` (default), ``"none"``, ``"any"``/``"required"``/``True``
        (some tool must be called), or a tool's name (or ``{"type": "function", "function":
        {"name": ...}}``). ``parallel_tool_calls=False`` keeps only the first call.
        ``strict=True`` (as in ``ChatOpenAI``): the arguments of every call are constrained
        by vLLM structured outputs to the tool's schema (all fields required, no others).
        With ``response_format=`` bound too (``create_agent(..., response_format=...)``),
        the answer is either tool calls or that JSON, the model's choice, and the tools are
        strict unless ``strict=False`` (as ``ChatOpenAI`` makes them).
        """
        if kwargs.get("response_format") and strict is None:
            strict = True
        formatted = [_openai_tool(tool, strict) for tool in tools]
        bound: dict[str, Any] = {"tools": formatted, **kwargs}
        if tool_choice is not None:
            bound["tool_choice"] = normalize_tool_choice(tool_choice)
        if parallel_tool_calls is not None:
            bound["parallel_tool_calls"] = parallel_tool_calls
        return self.bind(**bound)

    def with_structured_output(
        self,
        schema: dict[str, Any] | type | None = None,
        *,
        method: StructuredOutputMethod = "json_schema",
        include_raw: bool = False,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, dict[str, Any] | BaseModel]:
        """A model whose answer is parsed into `schema`, constrained by vLLM structured outputs.

        ``method``: ``"json_schema"`` (the answer is JSON valid against the schema),
        ``"function_calling"`` (a forced tool call), or ``"json_mode"`` (any JSON object;
        say in the prompt which keys you want). ``include_raw=True`` returns
        ``{"raw": AIMessage, "parsed": ..., "parsing_error": ...}``. The answer is
        constrained whatever ``strict`` says; ``strict=True`` with ``function_calling``
        also makes every field of the schema required, as OpenAI's strict mode does.
        """
        if kwargs:
            raise TypeError(f"unsupported arguments: {sorted(kwargs)}")
        if method != "json_mode" and schema is None:
            raise ValueError(f"method {method!r} needs a schema")
        if method == "function_calling":
            llm, output_parser = self._forced_tool_call(schema, strict)
        elif method in ("json_schema", "json_mode"):
            llm, output_parser = self._json_answer(schema, method)
        else:
            raise ValueError(
                f"unknown method {method!r}: use function_calling, json_schema or json_mode"
            )
        if not include_raw:
            return llm | output_parser
        parsed = RunnablePassthrough.assign(
            parsed=itemgetter("raw") | output_parser, parsing_error=lambda _: None
        )
        fallback = RunnablePassthrough.assign(parsed=lambda _: None)
        return RunnableMap(raw=llm) | parsed.with_fallbacks(
            [fallback], exception_key="parsing_error"
        )

    def _forced_tool_call(
        self, schema: Any, strict: bool | None
    ) -> tuple[Runnable[LanguageModelInput, BaseMessage], Runnable[Any, Any]]:
        """``with_structured_output(method="function_calling")``: the model and its parser."""
        tool = convert_to_openai_tool(schema)
        name = tool["function"]["name"]
        traced = {"kwargs": {"method": "function_calling"}, "schema": tool}
        llm = self.bind_tools(
            [schema],
            tool_choice=name,
            parallel_tool_calls=False,
            strict=strict,
            ls_structured_output_format=traced,
        )
        parser: Runnable[Any, Any]
        if isinstance(schema, type) and is_basemodel_subclass(schema):
            parser = PydanticToolsParser(tools=[schema], first_tool_only=True)
        else:
            parser = JsonOutputKeyToolsParser(key_name=name, first_tool_only=True)
        return llm, parser

    def _json_answer(
        self, schema: Any, method: str
    ) -> tuple[Runnable[LanguageModelInput, BaseMessage], Runnable[Any, Any]]:
        """``with_structured_output(method="json_schema" | "json_mode")``: the model and its
        parser."""
        response_format: dict[str, Any] = {"type": "json_object"}
        if method == "json_schema":
            response_format = {
                "type": "json_schema",
                "json_schema": {"schema": _json_schema(schema)},
            }
        traced = {"kwargs": {"method": method}, "schema": schema}
        llm = self.bind(response_format=response_format, ls_structured_output_format=traced)
        parser: Runnable[Any, Any]
        if isinstance(schema, type) and is_basemodel_subclass(schema):
            parser = PydanticOutputParser(pydantic_object=schema)
        else:
            parser = JsonOutputParser()
        return llm, parser

    # -- token counting -------------------------------------------------------------------

    def get_num_tokens(self, text: str) -> int:
        """Tokens of `text` by the large model's server tokenizer (``POST /tokenize``)."""
        body = {"prompt": text, "add_special_tokens": False}
        return self._client.run(self._client.count_tokens(body))

    def get_num_tokens_from_messages(
        self,
        messages: list[BaseMessage],
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool] | None = None,
    ) -> int:
        """Tokens of the chat as the large model's chat template renders it."""
        body: dict[str, Any] = {
            "messages": convert.to_openai(messages),
            "add_generation_prompt": True,
        }
        if tools:
            body["tools"] = [convert_to_openai_tool(tool) for tool in tools]
        return self._client.run(self._client.count_tokens(body))

    # -- plumbing -------------------------------------------------------------------------

    def _request(
        self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]
    ) -> ChatRequest:
        call = {k: v for k, v in kwargs.items() if not k.startswith("ls_")}  # tracing only
        call.pop("stream", None)  # LangChain's own switch between _stream and _generate
        call.pop("stream_usage", None)  # a streaming option; invoke always has usage
        if stop is not None:
            call["stop"] = stop
        return self.chat_request(
            convert.to_openai(messages),
            call,
            tools=call.pop("tools", None) or (),
            tool_choice=normalize_tool_choice(call.pop("tool_choice", None)),
            parallel_tool_calls=call.pop("parallel_tool_calls", True),
            response_format=_response_format(call.pop("response_format", None)),
        )


def _openai_tool(tool: Any, strict: bool | None) -> dict[str, Any]:
    """The tool in OpenAI's format. LangChain inlines a model's definitions, which cannot
    hold a model that contains itself (it cuts the cycle to ``{}``, which admits anything):
    a recursive pydantic model keeps its ``$defs`` and ``$ref`` instead, which the relay's
    grammar resolves."""
    formatted = convert_to_openai_tool(tool, strict=strict)
    if isinstance(tool, type) and issubclass(tool, BaseModel):
        schema = tool.model_json_schema()
        if _recursive(schema.get("$defs") or {}):
            parameters = {k: v for k, v in schema.items() if k not in ("title", "description")}
            formatted["function"]["parameters"] = parameters
    return formatted


def _recursive(definitions: dict[str, Any]) -> bool:
    """Whether a definition refers to itself, directly or through others."""
    refers = {
        name: set(re.findall(r'"#/\$defs/([^"/]+)"', json.dumps(d)))
        for name, d in definitions.items()
    }

    def reaches(start: str, target: str, seen: set[str]) -> bool:
        for name in refers.get(start, ()):
            if name == target or (name not in seen and reaches(name, target, seen | {name})):
                return True
        return False

    return any(reaches(name, name, {name}) for name in definitions)


def _json_schema(schema: dict[str, Any] | type) -> dict[str, Any]:
    """The full JSON schema (with ``$defs``) of a pydantic model (v2 or v1), a TypedDict or a
    JSON schema, as the answer's structured-outputs constraint."""
    if isinstance(schema, type) and issubclass(schema, BaseModelV1):
        return dict(schema.schema())
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        return dict(schema.model_json_schema())
    return dict(convert_to_json_schema(schema))


def _response_format(value: Any) -> ResponseFormat | None:
    """A ``response_format`` as ``ChatOpenAI`` takes it, as the relay's: a pydantic class, a
    TypedDict, a JSON schema, ``{"name": ..., "schema": ...}``, or OpenAI's
    ``{"type": "json_schema", "json_schema": {"schema": ...}}`` and ``{"type": "json_object"}``
    (``{"type": "text"}``: none)."""
    if value is None or isinstance(value, JsonSchemaFormat | JsonObjectFormat):
        return value
    if isinstance(value, type):
        return JsonSchemaFormat(_json_schema(value))
    if not isinstance(value, dict):
        raise TypeError(
            f"response_format {value!r}: give a pydantic class, a TypedDict, a JSON schema "
            'or {"type": "json_object"}'
        )
    if value.get("type") in FORMAT_TYPES:
        return response_format_of(value)
    if "schema" in value and "name" in value:  # the json_schema object alone
        return response_format_of({**value, "type": "json_schema"})
    return JsonSchemaFormat(_json_schema(value))


def _parsed(response: ChatResponse, response_format: Any) -> Any:
    """What ``ChatOpenAI`` puts in ``additional_kwargs["parsed"]``: the answer as an instance
    of a pydantic class given as ``response_format``; None for a schema given as a dict or a
    TypedDict, and for an answer that is tool calls. An answer that is not an instance
    raises, with the answer's text in the error; so does an answer to any response format
    (a JSON schema, a JSON object) that the token limit cut (``ChatOpenAI`` raises
    ``openai.LengthFinishReasonError`` there)."""
    if response.tool_calls:
        return None
    if response.finish_reason == "length" and _response_format(response_format) is not None:
        raise OutputParserException(
            "the answer was cut off by the token limit before its JSON ended, so it does not "
            "follow the response_format: raise max_tokens",
            llm_output=response.content,
        )
    if not (isinstance(response_format, type) and is_basemodel_subclass(response_format)):
        return None
    try:
        if issubclass(response_format, BaseModelV1):
            return response_format.parse_raw(response.content)
        assert issubclass(response_format, BaseModel)
        return response_format.model_validate_json(response.content)
    except (ValidationError, ValidationErrorV1) as invalid:
        raise OutputParserException(
            f"the answer is not a valid {response_format.__name__}: {invalid}",
            llm_output=response.content,
        ) from invalid
