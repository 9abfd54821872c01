"""The relay as a framework adapter holds it: one switcher per event loop, sync calls on a
background loop, chat turns, token counts. Both adapters use this, so neither re-implements
the plumbing::

    client = RelayClient(settings.relay_config(), settings.load_cues())
    response = await client.respond(ChatRequest(messages))      # on the caller's loop
    response = client.run(client.respond(ChatRequest(messages)))  # from sync code, anywhere
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator, Coroutine, Generator
from typing import Any, TypeVar

from .chat import ChatEvent, ChatRequest, ChatResponse, stream_chat
from .config import RelayConfig
from .cues import CueSet
from .rendering import PromptRenderer
from .switcher import RelaySwitcher
from .sync import BackgroundLoop

T = TypeVar("T")


class RelayClient:
    """Switchers per event loop (HTTP clients belong to one loop) over one configuration."""

    def __init__(
        self, config: RelayConfig, cues: CueSet, renderer: PromptRenderer | None = None
    ) -> None:
        self.config = config
        self.cues = cues
        self.renderer = renderer
        self._switchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, RelaySwitcher] = (
            weakref.WeakKeyDictionary()
        )
        self._background = BackgroundLoop()

    def switcher(self) -> RelaySwitcher:
        """The switcher of the running event loop, made on first use."""
        loop = asyncio.get_running_loop()
        switcher = self._switchers.get(loop)
        if switcher is None:
            switcher = RelaySwitcher(self.config, cues=self.cues, renderer=self.renderer)
            self._switchers[loop] = switcher
        return switcher

    def stream(self, request: ChatRequest) -> AsyncIterator[ChatEvent]:
        """One chat turn, streamed (see :func:`~relay_integrations.core.chat.stream_chat`)."""
        return stream_chat(self.switcher(), request)

    async def respond(self, request: ChatRequest) -> ChatResponse:
        """One chat turn, to its end."""
        async for event in self.stream(request):
            if isinstance(event, ChatResponse):
                return event
        raise AssertionError("a chat stream always ends with its response")

    async def count_tokens(self, body: dict[str, Any]) -> int:
        """``POST /tokenize`` on the large model's server (a prompt, or messages and tools)."""
        endpoint = self.switcher().endpoints["large"]
        response = await endpoint.post_json("/tokenize", {"model": self.config.large.model, **body})
        return int(response["count"])

    async def context_window(self) -> int | None:
        """The large model's context window, as its server reports it."""
        return (await self.switcher().endpoints["large"].model_info()).max_model_len

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine from sync code, even inside a running event loop."""
        return self._background.run(coroutine)

    def iterate(self, stream: AsyncIterator[T]) -> Generator[T, None, None]:
        """Iterate an async stream from sync code; leaving early closes it."""
        return self._background.iterate(stream)
