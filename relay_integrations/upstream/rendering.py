"""Turning chat messages into the exact prompt text a model sees, once per generation.

By default the server renders its own chat template: ``POST /tokenize`` with the messages
(and tools, and ``chat_template_kwargs`` such as ``enable_thinking``). The relay keeps the
ids (:meth:`ServerChatTemplate.render_ids`): they are the prefix of every segment's
``/v1/completions`` prompt, so the server neither tokenizes the chat again nor prefills what
the model has seen. :meth:`~ServerChatTemplate.render` also asks ``POST /detokenize`` for the
text (calibration, and the text path).

Servers without ``/tokenize`` take a :class:`JinjaChatTemplate` (needs the ``jinja`` extra)::

    renderer = JinjaChatTemplate(
        "{% for m in messages %}<|im_start|>{{ m.role }}\\n{{ m.content }}<|im_end|>\\n"
        "{% endfor %}<|im_start|>assistant\\n"
    )
    switcher = RelaySwitcher(config, renderer=renderer)
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol, runtime_checkable

import openai

from .answers import Detokenized, Tokenized
from .endpoint import Endpoint, UpstreamFailure
from .errors import InvalidChatError, RenderError

Message = dict[str, Any]
"""A chat message in the OpenAI format (``role``, ``content``, ``tool_calls``, ...)."""


@dataclass(frozen=True)
class ChatInput:
    """What a generation is asked: messages, tools and chat-template arguments."""

    messages: list[Message]
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RenderedPrompt:
    text: str
    token_count: int | None = None


@dataclass(frozen=True)
class RenderedIds:
    """A chat rendered to the model's token ids (no text: nothing was detokenized)."""

    ids: tuple[int, ...]

    @property
    def token_count(self) -> int:
        return len(self.ids)


@runtime_checkable
class PromptRenderer(Protocol):
    """Renders a chat into the prompt text of one endpoint's model."""

    async def render(self, endpoint: Endpoint, chat: ChatInput) -> RenderedPrompt: ...


@runtime_checkable
class TokenRenderer(Protocol):
    """Renders a chat into the token ids of one endpoint's model."""

    async def render_ids(self, endpoint: Endpoint, chat: ChatInput) -> RenderedIds: ...


class ServerChatTemplate:
    """Renders through the server's own chat template (vLLM ``/tokenize``, and ``/detokenize``
    for the text)."""

    async def render(self, endpoint: Endpoint, chat: ChatInput) -> RenderedPrompt:
        tokens = list((await self.render_ids(endpoint, chat)).ids)
        try:
            detokenized = await endpoint.post_json(
                "/detokenize", {"model": endpoint.config.model, "tokens": tokens}, Detokenized
            )
        except UpstreamFailure as failure:
            _raise_render_error(endpoint, failure)
        return RenderedPrompt(text=detokenized.prompt, token_count=len(tokens))

    async def render_ids(self, endpoint: Endpoint, chat: ChatInput) -> RenderedIds:
        body: dict[str, Any] = {
            "model": endpoint.config.model,
            "messages": chat.messages,
            "add_generation_prompt": True,
        }
        if chat.tools:
            body["tools"] = chat.tools
        if chat.chat_template_kwargs:
            body["chat_template_kwargs"] = chat.chat_template_kwargs
        try:
            tokens = (await endpoint.post_json("/tokenize", body, Tokenized)).tokens
        except UpstreamFailure as failure:
            _raise_render_error(endpoint, failure)
        return RenderedIds(tuple(tokens))


def _raise_render_error(endpoint: Endpoint, failure: UpstreamFailure) -> NoReturn:
    """Raise what a failed render means: a server without the route (not vLLM), a chat it
    refused, or the failure itself."""
    if isinstance(failure.cause, openai.NotFoundError):
        path = urllib.parse.urlsplit(str(failure.cause.request.url)).path
        raise RenderError(
            f"{endpoint.role} endpoint {endpoint.config.server_root} has no {path}; "
            "it is not vLLM. Pass renderer=JinjaChatTemplate(<its chat template>)."
        ) from None
    if isinstance(failure.cause, openai.BadRequestError):
        raise InvalidChatError(
            f"{endpoint.role} endpoint could not render the chat: {failure.cause.message}"
        ) from None
    raise failure


class JinjaChatTemplate:
    """Renders a user-supplied Jinja chat template locally (no server round trip).

    ``variables`` are passed to the template too (``bos_token``, ...).
    """

    def __init__(self, template: str, **variables: Any) -> None:
        try:
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:  # pragma: no cover - depends on the installed extras
            raise RenderError(
                "JinjaChatTemplate needs jinja2: pip install 'relay-integrations[jinja]'"
            ) from None
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        self._template = env.from_string(template)
        self._variables = variables

    async def render(self, endpoint: Endpoint, chat: ChatInput) -> RenderedPrompt:
        text = self._template.render(
            messages=chat.messages,
            tools=chat.tools,
            add_generation_prompt=True,
            **self._variables,
            **chat.chat_template_kwargs,
        )
        return RenderedPrompt(text=text)


class CachingRenderer:
    """Renders each distinct chat once per endpoint (calibration asks for the same prompt
    once per sample); concurrent requests for one chat share a single render."""

    def __init__(self, renderer: PromptRenderer) -> None:
        self.renderer = renderer
        self._renders: dict[str, asyncio.Task[RenderedPrompt]] = {}

    async def render(self, endpoint: Endpoint, chat: ChatInput) -> RenderedPrompt:
        key = json.dumps(
            [
                endpoint.config.server_root,
                endpoint.config.model,
                chat.messages,
                chat.tools,
                chat.chat_template_kwargs,
            ],
            sort_keys=True,
            default=str,
        )
        task = self._renders.get(key)
        if task is None or (task.done() and task.exception() is not None):
            task = asyncio.ensure_future(self.renderer.render(endpoint, chat))
            self._renders[key] = task
        return await asyncio.shield(task)
