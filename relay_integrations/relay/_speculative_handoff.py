"""The speculative hand-off: the next model's request, opened before the hand-off it belongs
to is certain.

A whole-word hand-off is confirmed by the token after it: the large model's `` Now`` is a cue
only once `` we`` (not ``here``) follows, the small model's ``.`` ends a sentence only once a
space follows. Waiting for that token costs one decoding step of the model that writes it;
meanwhile the other server is idle. So when the text reaches such a point, the relay opens
the request the next turn would send (the same prompt, stops and allowance), and the next
turn adopts it if, once the hand-off is confirmed, it is exactly the request it would have
sent; otherwise (the token continued the word, the allowance came out different) it is
closed, and vLLM aborts it after its prefill. The request is built by the function that
builds every turn's request, from the next turn's row of the table, so the two agree by
construction; the comparison guards the text and the allowance. A generation holds at most
one, in its :class:`HandoffSlot`::

    slot = HandoffSlot()
    slot.hold(SpeculativeHandoff(endpoint, "small", " ,", request, numbered, transcript))
    ...  # its first piece is read meanwhile
    pieces = slot.take(role, request_the_turn_would_send, transcript)  # the same stream, or
    if pieces is None:                                                  # None: not this one
        await slot.discard()
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from ..upstream.config import ModelRole
from ..upstream.endpoint import CompletionRequest, Endpoint, StreamPiece


class SpeculativeHandoff:
    """One request opened ahead of its turn (by `role`, at `transcript`, which the text goes
    on from with one of `confirmed_by`); its first piece is read in a task."""

    def __init__(
        self,
        endpoint: Endpoint,
        role: ModelRole,
        confirmed_by: str,
        request: CompletionRequest,
        numbered: CompletionRequest,
        transcript: str,
        counted: bool = True,
    ) -> None:
        """`counted`: in the slot's used and missed counts (a hand-off's request opened
        ahead; not a generation's first request, opened before the small model's prompt is
        known)."""
        self.role: ModelRole = role
        self.counted = counted
        self.confirmed_by = confirmed_by
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


class HandoffSlot:
    """The one request opened ahead a generation may hold (a speculative hand-off, or its
    first request), and how many requests opened ahead of a hand-off were used and how many
    closed unused."""

    def __init__(self) -> None:
        self.handoff: SpeculativeHandoff | None = None
        self.used = 0
        self.missed = 0

    def hold(self, handoff: SpeculativeHandoff) -> None:
        self.handoff = handoff

    def take(
        self, role: ModelRole, request: CompletionRequest, transcript: str
    ) -> AsyncGenerator[StreamPiece, None] | None:
        """The held request's stream if it is the one a turn of `role` sends now (the slot
        is then empty), else None."""
        handoff = self.handoff
        if handoff is None or not handoff.serves(role, request, transcript):
            return None
        self.handoff, self.used = None, self.used + handoff.counted
        return handoff.pieces()

    def may_serve(self, transcript: str) -> bool:
        """Whether a request is held and may still serve from `transcript` on."""
        return self.handoff is not None and self.handoff.may_serve(transcript)

    def foreseen(self, transcript: str) -> bool:
        """Whether nothing is held, or the held request starts at `transcript`."""
        return self.handoff is None or self.handoff.transcript == transcript

    async def discard(self) -> None:
        """Close the held request, if any (it counts as missed)."""
        if self.handoff is not None:
            handoff, self.handoff = self.handoff, None
            self.missed += handoff.counted
            await handoff.discard()


async def _first_piece(stream: AsyncGenerator[StreamPiece, None]) -> StreamPiece | None:
    return await anext(stream, None)
