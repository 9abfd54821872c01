"""The speculative hand-off: the next model's request, opened before the hand-off it belongs
to is certain.

A whole-word hand-off is confirmed by the token after it: the large model's `` Now`` is a cue
only once `` we`` (not ``here``) follows, the small model's ``.`` ends a sentence only once a
space follows. Waiting for that token costs one decoding step of the model that writes it;
meanwhile the other server is idle. So when the text reaches such a point, the relay opens
the request the next turn would send (the same prompt, stops and allowance), and the next
turn adopts it if, once the hand-off is confirmed, it is exactly the request it would have
sent; otherwise (the token continued the word, the allowance came out different) it is
closed, and vLLM aborts it after its prefill::

    handoff = SpeculativeHandoff(endpoint, upcoming, request, numbered, transcript)
    ...  # its first piece is read meanwhile
    if handoff.serves(role, request_the_turn_would_send, transcript):
        pieces = handoff.pieces()  # the same stream, read on
    else:
        await handoff.discard()
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass

from ..upstream.config import ModelRole
from ..upstream.endpoint import CompletionRequest, Endpoint, StreamPiece


@dataclass(frozen=True)
class NextTurn:
    """The turn that follows if the hand-off at the end of the text is confirmed."""

    role: ModelRole
    stops: Sequence[str]
    completion: str
    """What the next token must write for the hand-off (a cue's comma), or nothing."""
    confirmed_by: str
    """Characters that confirm the hand-off when the text goes on with one of them (none:
    the stop string fires once the completion is written)."""
    cap: int | None = None


class SpeculativeHandoff:
    """One request opened ahead of its turn; its first piece is read in a task."""

    def __init__(
        self,
        endpoint: Endpoint,
        upcoming: NextTurn,
        request: CompletionRequest,
        numbered: CompletionRequest,
        transcript: str,
    ) -> None:
        self.role: ModelRole = upcoming.role
        self.confirmed_by = upcoming.confirmed_by
        self.request = request  # as the turn builds it (no request number)
        self.transcript = transcript  # the text the hand-off must leave for it to serve
        self._stream = endpoint.stream_completion(numbered)
        self._first = asyncio.create_task(_first_piece(self._stream))

    def may_serve(self, transcript: str) -> bool:
        """Whether `transcript` (the current request's text so far) may still hand off where
        this request starts: it has not reached that point yet, or went on past it with a
        confirming character (the server stops there; whether the stop's text comes in the
        request's last chunk or one before differs by server)."""
        if self.transcript.startswith(transcript):
            return True
        following = transcript[len(self.transcript) : len(self.transcript) + 1]
        return transcript.startswith(self.transcript) and following in self.confirmed_by

    def serves(self, role: ModelRole, request: CompletionRequest, transcript: str) -> bool:
        """Whether this is the request a turn of `role` would send now, at `transcript`."""
        return role == self.role and request == self.request and transcript == self.transcript

    async def pieces(self) -> AsyncGenerator[StreamPiece, None]:
        """The stream, from its first piece (errors as the endpoint raises them)."""
        first = await self._first
        if first is None:
            return
        yield first
        async for piece in self._stream:
            yield piece

    async def discard(self) -> None:
        """Close the request (vLLM aborts it); its outcome, error or not, is dropped."""
        self._first.cancel()
        await asyncio.wait([self._first])
        if not self._first.cancelled():
            self._first.exception()  # retrieved: an error of a request nobody uses is moot
        await self._stream.aclose()


async def _first_piece(stream: AsyncGenerator[StreamPiece, None]) -> StreamPiece | None:
    return await anext(stream, None)
