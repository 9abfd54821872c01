"""``RelayLLM``: RelayGen as a LlamaIndex function-calling LLM."""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncGenerator, Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from llama_index.core.base.llms.generic_utils import (
    achat_to_completion_decorator,
    astream_chat_to_completion_decorator,
    chat_to_completion_decorator,
    stream_chat_to_completion_decorator,
)
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
    ToolCallBlock,
)
from llama_index.core.constants import DEFAULT_CONTEXT_WINDOW as DEFAULT_WINDOW
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.program.function_program import get_function_tool
from llama_index.core.program.utils import FlexibleModel, get_program_for_llm
from llama_index.core.prompts import PromptTemplate
from llama_index.core.types import BasePydanticProgram, Model, PydanticProgramMode
from pydantic import ConfigDict, Field

from ..chat.exchange import (
    ChatRequest,
    ContentDelta,
    ReasoningDelta,
    ToolCallChunk,
    ToolCallDelta,
    normalize_tool_choice,
)
from ..chat.exchange import ChatResponse as RelayResponse
from ..chat.settings import RelaySettings
from ..chat.tool_calls import PartialCalls, PartialToolCall, ToolCall
from ..relay.sync import loop_running_here
from ..upstream.errors import RelayError
from . import messages as convert

if TYPE_CHECKING:
    from llama_index.core.tools.types import BaseTool

logger = logging.getLogger(__name__)
MODEL_KEY = "relay_model"
"""``additional_kwargs`` key of a streamed response: the model that wrote its delta."""


class RelayLLM(RelaySettings, FunctionCallingLLM):
    """A large reasoning model and a small one, switching inside each generation (RelayGen).

    Setup: serve both models with vLLM (``VLLM_MAX_STOP_STRINGS=1024 vllm serve ...`` is best;
    a stock server works too).
    Unset fields come from ``RELAY_LARGE__BASE_URL``, ``RELAY_LARGE__MODEL``,
    ``RELAY_SMALL__BASE_URL``, ``RELAY_SMALL__MODEL``, ``RELAY_CUES`` and ``RELAY_API_KEY``::

        from llama_index.core import Settings
        from relay_integrations.llama_index import RelayLLM

        Settings.llm = RelayLLM(
            large_url="http://gpu-a:8000/v1", large_model="Qwen/Qwen3-32B",
            small_url="http://gpu-b:8001/v1", small_model="Qwen/Qwen3-1.7B",
            cues="builtin:qwen3-32b--qwen3-1.7b", max_tokens=8192,
        )

        response = Settings.llm.chat([ChatMessage(role="user", content="17 * 23?")])
        response.message.content                 # the answer only
        response.message.blocks[0]               # ThinkingBlock: the reasoning
        response.additional_kwargs["relay"]      # large-model share, switches, usage per model

        for delta in Settings.llm.stream_chat(messages):
            print(delta.additional_kwargs.get("thinking_delta", ""), delta.delta, end="")

    Tools: ``chat_with_tools`` / ``FunctionAgent`` render tools through the model's own chat
    template; ``tool_required=True`` constrains the answer to a call with vLLM structured
    outputs, which is also how ``structured_predict`` and ``as_structured_llm`` get valid
    objects. The policy keeps 1024 tokens (at most a quarter of ``max_tokens``) for the
    answer, so a long reasoning never hands an agent (``ReActAgent`` retries empty replies)
    an empty reply.
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    refused_fields: ClassVar[Mapping[str, str]] = {
        "streaming": "use stream_chat() or astream_chat() (stream_complete for prompts)",
    }
    implied_fields: ClassVar[Mapping[str, Any]] = {
        "is_chat_model": True,
        "is_function_calling_model": True,
    }

    context_window: int | None = Field(
        default=None, description="Context window; None asks the large model's server"
    )
    strict: bool = Field(
        default=False,
        description="Hold every tool call's arguments to its tool's schema, as OpenAILike's "
        "strict (per call: chat_with_tools(..., strict=...))",
    )

    @classmethod
    def class_name(cls) -> str:
        return "RelayLLM"

    @property
    def metadata(self) -> LLMMetadata:
        """The context window and the output budget: ``num_output`` is ``max_tokens`` capped
        at half the window, so that prompt helpers leave room for retrieved context (the relay
        clips a generation to the window anyway).

        The window is ``context_window`` if set; else the large model's ``max_model_len`` as
        its server reports it, learned by the first request of any model of the same
        endpoints (sync or async). Before that:

        - read from sync code that runs no event loop (a script building a query engine), it
          is asked for now: the wait holds up only the caller, which is about to wait for a
          generation anyway, and prompts are packed by the real window from the first query;
        - read inside a running event loop (LlamaIndex reads ``metadata`` synchronously in
          agents' async steps), it is LlamaIndex's ``DEFAULT_CONTEXT_WINDOW`` (3900, what
          ``OpenAILike`` gives unless told) until a request has learned the real one: a
          blocking call there would stall every task of the loop, and could never end if the
          loop itself serves the answer (a scripted server in a test).

        So a window read early may differ between sync and async code: set ``context_window``
        for the same metadata everywhere from the first read.
        """
        window = self._window()
        return LLMMetadata(
            context_window=window,
            num_output=min(self.max_tokens, window // 2),
            is_chat_model=True,
            is_function_calling_model=True,
            model_name=self.model_name,
        )

    def _window(self) -> int:
        """The window as :attr:`metadata` says, asked for only where no event loop runs."""
        if self.context_window is not None:
            return self.context_window
        client = self._client
        if client.served_window is None:
            if loop_running_here():
                _assumed_window(client.config.large.base_url, "no request has learned it yet")
                return DEFAULT_WINDOW
            try:
                client.run(client.context_window())
            except RelayError as exc:
                _assumed_window(client.config.large.base_url, str(exc))
                return DEFAULT_WINDOW
        return client.served_window or DEFAULT_WINDOW

    async def _learn_window(self) -> None:
        """Ask the server for its window before a request (once per endpoint and loop), so
        that ``metadata`` read later, even inside an event loop, gives the real one."""
        if self.context_window is None and self._client.served_window is None:
            await self._client.context_window()

    # -- chat -----------------------------------------------------------------------------
    # The public methods carry LlamaIndex's callback events; the completion methods reuse the
    # undecorated ones, so that a completion is one LLM event (a callback-wrapped chat inside
    # it would be a second, and TokenCountingHandler would count its tokens twice).

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return await self._achat(messages, **kwargs)

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return self._chat(messages, **kwargs)

    @llm_chat_callback()
    async def astream_chat(
        self, messages: Sequence[ChatMessage], **kwargs: Any
    ) -> ChatResponseAsyncGen:
        return await self._astream_chat(messages, **kwargs)

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        return self._stream_chat(messages, **kwargs)

    async def _achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return await self._respond(self._request(messages, kwargs))

    def _chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return self._client.run(self._respond(self._request(messages, kwargs)))

    async def _respond(self, request: ChatRequest) -> ChatResponse:
        await self._learn_window()
        return convert.chat_response(await self._client.respond(request), self.model_name)

    async def _astream_chat(
        self, messages: Sequence[ChatMessage], **kwargs: Any
    ) -> ChatResponseAsyncGen:
        await self._learn_window()
        return self._stream(self._request(messages, kwargs))

    def _stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        self._client.run(self._learn_window())
        return self._client.iterate(self._stream(self._request(messages, kwargs)))

    async def _stream(self, request: ChatRequest) -> AsyncGenerator[ChatResponse, None]:
        """Deltas as LlamaIndex streams them: ``delta`` is answer text, thinking goes in
        ``additional_kwargs["thinking_delta"]``, ``message`` holds everything so far (a forced
        call as far as it is written, so that structured output grows); each names the model
        that wrote it in ``additional_kwargs["relay_model"]``; the last response carries
        usage (``raw["usage"]``) and relay stats."""
        reasoning, content = "", ""
        calls: dict[int, ToolCall | PartialToolCall] = {}
        partial = PartialCalls()
        async for event in self._client.stream(request, partial_calls=True):
            if isinstance(event, RelayResponse):
                last = convert.chat_response(event, self.model_name, delta="")
                if event.last_model is not None:
                    last.additional_kwargs[MODEL_KEY] = event.last_model
                yield last
                return
            extra: dict[str, Any] = {MODEL_KEY: event.model}
            delta = ""
            if isinstance(event, ReasoningDelta):
                reasoning += event.text
                extra["thinking_delta"] = event.text
            elif isinstance(event, ContentDelta):
                content += event.text
                delta = event.text
            elif isinstance(event, ToolCallChunk):
                calls[event.index] = partial.feed(event.index, event.id, event.text)
            elif isinstance(event, ToolCallDelta):
                if isinstance(event.call, ToolCall):
                    calls[event.index] = event.call
                else:  # unreadable: the last response lists it as invalid
                    calls.pop(event.index, None)
            message = convert.assistant_message(reasoning, content, list(calls.values()))
            yield ChatResponse(message=message, delta=delta, additional_kwargs=extra)

    # -- completion -----------------------------------------------------------------------

    @llm_completion_callback()
    async def acomplete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        return await achat_to_completion_decorator(self._achat)(prompt, **kwargs)

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return chat_to_completion_decorator(self._chat)(prompt, **kwargs)

    @llm_completion_callback()
    async def astream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseAsyncGen:
        return await astream_chat_to_completion_decorator(self._astream_chat)(prompt, **kwargs)

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        return stream_chat_to_completion_decorator(self._stream_chat)(prompt, **kwargs)

    # -- structured output ----------------------------------------------------------------

    def _structured_stream_call(
        self,
        output_cls: type[Model],
        prompt: PromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> Generator[Model | list[Model] | FlexibleModel | list[FlexibleModel], None, None]:
        """``stream_structured_predict`` (and ``as_structured_llm(...).stream_chat``) with
        the call forced, as ``structured_predict`` forces it."""
        program = self._structured_program(output_cls, prompt)
        return program.stream_call(llm_kwargs=llm_kwargs, **prompt_args)

    async def _structured_astream_call(
        self,
        output_cls: type[Model],
        prompt: PromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> AsyncGenerator[Model | list[Model] | FlexibleModel | list[FlexibleModel], None]:
        """The async twin of :meth:`_structured_stream_call`."""
        program = self._structured_program(output_cls, prompt)
        return await program.astream_call(llm_kwargs=llm_kwargs, **prompt_args)

    def _structured_program(
        self, output_cls: type[Model], prompt: PromptTemplate
    ) -> BasePydanticProgram[Model]:
        """LlamaIndex's program for this LLM, with the output's tool named as the choice.

        ``FunctionCallingProgram.stream_call`` leaves out the ``tool_required=True`` that its
        ``__call__`` passes: without a forced choice a streamed object would exist only if
        the model chose to call the tool, and would not be valid by construction.
        """
        forced: dict[str, Any] = {}
        if self.pydantic_program_mode in (
            PydanticProgramMode.DEFAULT,
            PydanticProgramMode.FUNCTION,
        ):
            forced["tool_choice"] = get_function_tool(output_cls).metadata.name
        return get_program_for_llm(
            output_cls, prompt, self, pydantic_program_mode=self.pydantic_program_mode, **forced
        )

    # -- tools ----------------------------------------------------------------------------

    def _prepare_chat_with_tools(
        self,
        tools: Sequence[BaseTool],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        tool_required: bool = False,
        tool_choice: str | dict[str, Any] | None = None,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Tools for the chat template; ``tool_required`` (or a tool's name as
        ``tool_choice``) constrains the answer to a call, ``strict=True`` (as in LlamaIndex's
        ``OpenAI``; default: the ``strict`` field) the arguments of every call to its tool's
        schema."""
        messages = list(chat_history or [])
        if isinstance(user_msg, str):
            user_msg = ChatMessage(role=MessageRole.USER, content=user_msg)
        if user_msg is not None:
            messages.append(user_msg)
        strict = self.strict if strict is None else strict
        specs = [_openai_tool(t, strict) for t in tools]
        return {
            "messages": messages,
            "tools": specs or None,
            "tool_choice": normalize_tool_choice(tool_choice, required=tool_required),
            "parallel_tool_calls": allow_parallel_tool_calls,
            **kwargs,
        }

    def get_tool_calls_from_response(
        self, response: ChatResponse, error_on_no_tool_call: bool = True, **kwargs: Any
    ) -> list[ToolSelection]:
        calls = [b for b in response.message.blocks if isinstance(b, ToolCallBlock)]
        if not calls and error_on_no_tool_call:
            raise ValueError(
                "expected a tool call, got none; the answer was: "
                f"{(response.message.content or '')[:200]!r}"
            )
        return [
            ToolSelection(
                tool_id=call.tool_call_id or call.tool_name,
                tool_name=call.tool_name,
                tool_kwargs=call.tool_kwargs if isinstance(call.tool_kwargs, dict) else {},
            )
            for call in calls
        ]

    # -- plumbing -------------------------------------------------------------------------

    def _request(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> ChatRequest:
        call = dict(kwargs)
        tools = call.pop("tools", None) or ()
        tool_choice = call.pop("tool_choice", None)
        return self.chat_request(
            convert.to_openai(messages),
            call,
            tools=tools,
            tool_choice=tool_choice if tools else None,
            parallel_tool_calls=call.pop("parallel_tool_calls", True),
        )


@functools.cache
def _assumed_window(url: str, reason: str) -> None:
    """Say once per server and reason that ``metadata`` gives LlamaIndex's default window."""
    logger.warning(
        "context window of %s unknown (%s): assuming LlamaIndex's default, %d tokens; set "
        "RelayLLM(context_window=...) to give it",
        url,
        reason,
        DEFAULT_WINDOW,
    )


def _openai_tool(tool: BaseTool, strict: bool) -> dict[str, Any]:
    """The tool in OpenAI's format, as LlamaIndex's ``OpenAI`` and ``OpenAILike`` send a
    function-calling model's tools (the chat template renders them into the prompt, so the
    prompt is theirs): ``strict`` stated either way, no properties beyond the parameters'.
    A recursive model's parameters keep the root ``$ref`` that LlamaIndex's
    ``ToolMetadata.get_parameters_dict`` leaves out: without it they would admit any
    object."""
    spec = tool.metadata.to_openai_tool(skip_length_check=True)
    function = spec["function"]
    fn_schema = tool.metadata.fn_schema
    root = fn_schema.model_json_schema().get("$ref") if fn_schema is not None else None
    parameters = {**function["parameters"], "additionalProperties": False}
    function["parameters"] = parameters if root is None else {**parameters, "$ref": root}
    function["strict"] = strict
    return spec
