"""The small model's prompt, put in its server's prefix cache while the large model reasons.

The small model's first turn comes at the first cue (or at the answer). Its request would
then prefill the whole prompt (system prompt, retrieved documents, question) on the critical
path, although the small server sat idle through the large model's first segment. So the
relay sends the small model its prompt when the generation starts, asking for one token;
the first turn's request then finds the prompt's cache blocks computed and prefills only
what the large model wrote (``SwitchPolicy.warm_small_prompt``)::

    warm = PromptWarmUp(endpoint, CompletionRequest(prompt=prompt, max_tokens=1))
    ...
    await warm.close()  # at the end of the generation: cancelled if still running
    warm.usage          # what it cost, once it has finished
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import aclosing

from ..upstream.endpoint import CompletionRequest, Endpoint
from ..upstream.errors import RelayError
from .result import ModelUsage

logger = logging.getLogger(__name__)


class PromptWarmUp:
    """One request that only fills a server's prefix cache; its failure costs nothing but
    the warming (the turns' own requests report what is wrong with the server)."""

    def __init__(self, endpoint: Endpoint, request: CompletionRequest) -> None:
        self.usage: ModelUsage | None = None
        """Its usage once it has finished (kept apart from the generation's: it writes
        nothing the generation keeps)."""
        self._task = asyncio.create_task(self._send(endpoint, request))

    async def _send(self, endpoint: Endpoint, request: CompletionRequest) -> None:
        try:
            async with aclosing(endpoint.stream_completion(request)) as pieces:
                async for piece in pieces:
                    if piece.completion_tokens is not None:
                        usage = ModelUsage()
                        usage.add(
                            piece.prompt_tokens or 0, piece.cached_tokens, piece.completion_tokens
                        )
                        self.usage = usage
        except RelayError as failed:
            logger.debug("warming the %s model's prompt failed: %s", endpoint.role, failed)

    async def close(self) -> None:
        """Cancel it if it is still running (vLLM aborts it)."""
        self._task.cancel()
        await asyncio.wait([self._task])
        if not self._task.cancelled() and (error := self._task.exception()) is not None:
            raise error
