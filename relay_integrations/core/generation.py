"""The state of one relay generation, and the turns in which one model writes.

A turn is what the method calls a segment: one model writing until something hands control
on. It may take several requests (a false sentence end, a stream that broke and resumed), but
every request's prompt is the model's rendered prefix plus the transcript so far, so the
server's prefix cache prefills only what that model has not seen.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .config import CONTEXT_MARGIN, ModelRole, RelayConfig, SamplingConfig
from .endpoint import (
    CompletionRequest,
    Endpoint,
    StreamInterrupted,
    StreamPiece,
    UpstreamFailure,
)
from .head_start import HeadStart, NextTurn
from .reasoning import PromptReasoning, Releaser, split_reasoning, starts_with
from .rendering import RenderedPrompt
from .result import (
    FinishReason,
    ModelUsage,
    Phase,
    RelayResult,
    RelayStats,
    Segment,
    SegmentEnd,
    TextDelta,
)

RequestHook = Callable[[ModelRole, Phase, str], Mapping[str, Any]]
"""Extra request fields per request, from (model, phase, transcript so far)."""


@dataclass(frozen=True)
class RequestEnd:
    """How one request ended, as the turn's decision function sees it."""

    finish_reason: str | None
    stop_reason: str | int | None
    turn_tokens: int


Decide = Callable[[RequestEnd], SegmentEnd | None]
"""Decides, after each request of a turn, how the turn ended (None: write on)."""

Anticipate = Callable[[int], NextTurn | None]
"""Given the turn's tokens once the next one arrives: the turn that follows if that token
confirms a hand-off at the end of the transcript, else None (see :mod:`.head_start`)."""


class Generation:
    """Mutable state of one generation: transcript, phase, usage, timing."""

    def __init__(
        self,
        *,
        generation_id: str,
        config: RelayConfig,
        endpoints: Mapping[ModelRole, Endpoint],
        prompts: Mapping[ModelRole, RenderedPrompt],
        context_windows: Mapping[ModelRole, int | None],
        sampling: SamplingConfig,
        request_hook: RequestHook | None = None,
        extra_body: Mapping[str, Any] | None = None,
        started: float | None = None,
    ) -> None:
        self.id = generation_id
        self.config = config
        self.endpoints = endpoints
        self.prompts = prompts
        self.context_windows = context_windows
        self.sampling = sampling
        self.request_hook = request_hook
        self.extra_body = dict(extra_body or {})
        self.mode = PromptReasoning.of(prompts["large"].text, config.markers)
        self.transcript = ""
        self.phase: Phase = "answer" if self.mode is PromptReasoning.CLOSED else "reasoning"
        self.small_available = True
        self.cue: str | None = None  # the cue that ended the last large turn, set by its decide
        self.segments: list[Segment] = []
        self.usage = {"large": ModelUsage(), "small": ModelUsage()}
        self.reasoning_tokens = 0
        self.seconds = {"large": 0.0, "small": 0.0}
        self.started = started if started is not None else time.perf_counter()  # rendering too
        self.first_token_at: float | None = None
        self.requests_sent = 0
        self.speculative_handoffs = 0  # hand-offs whose request was opened ahead and used
        self.speculative_misses = 0  # requests opened ahead and closed unused
        self._ahead: HeadStart | None = None
        self._releaser = self._new_releaser()

    @property
    def generated_tokens(self) -> int:
        return sum(u.completion_tokens for u in self.usage.values())

    def room(self, role: ModelRole) -> int:
        """Tokens `role` may still write: the budget, its context window, the reasoning limit."""
        room = self.sampling.max_tokens - self.generated_tokens
        window, prompt_tokens = self.context_windows[role], self.prompts[role].token_count
        if window is not None and prompt_tokens is not None:
            room = min(room, window - prompt_tokens - self.generated_tokens - CONTEXT_MARGIN)
        return min(room, self._reasoning_room())

    def _reasoning_room(self) -> int:
        """Tokens the reasoning may still take: its limit, and the answer's reserve."""
        if self.phase != "reasoning":
            return self.sampling.max_tokens
        policy, budget = self.config.policy, self.sampling.max_tokens
        reserve = min(policy.answer_reserve_tokens, budget // 4)
        room = budget - reserve - self.generated_tokens
        if policy.max_reasoning_tokens is not None:
            room = min(room, policy.max_reasoning_tokens - self.reasoning_tokens)
        return room

    def close_reasoning(self) -> None:
        """End the reasoning on the model's behalf (reasoning limit, or it stopped unclosed)."""
        self.transcript = self.transcript.rstrip() + "\n" + self.config.markers.end

    def end_reasoning(self) -> None:
        """The reasoning ended at the end of the transcript: the answer phase starts."""
        self.phase = "answer"
        self._releaser = self._new_releaser()

    def truncate(self, length: int) -> None:
        """Cut the transcript at a hand-off point (only ever text not yet released)."""
        self.transcript = self.transcript[:length]

    async def turn(
        self,
        role: ModelRole,
        *,
        decide: Decide,
        stops: Callable[[], Sequence[str]],
        cap: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
        anticipate: Anticipate | None = None,
    ) -> AsyncIterator[TextDelta]:
        """Let `role` write until `decide` ends the turn; yields visible text as it arrives.

        With `anticipate`, the next turn's request is opened where the text may hand off,
        and the next turn uses it if it is the request it would send. The finished segment
        is appended to ``self.segments``. Raises :class:`UpstreamFailure` when the endpoint
        fails beyond its retries and resumes.
        """
        phase = self.phase
        start, began = len(self.transcript), time.perf_counter()
        usage, resumes = ModelUsage(), 0  # usage of this turn; its tokens count against `cap`
        ended: SegmentEnd | None = None
        try:
            while ended is None:
                allowance = self.room(role)
                if cap is not None:
                    allowance = min(allowance, cap - usage.completion_tokens)
                if allowance <= 0:
                    capped = cap is not None and usage.completion_tokens >= cap
                    ended = "segment_cap" if capped else self._length()
                    break
                request = self._request(role, allowance, stops(), extra_body)
                finish: tuple[str | None, str | int | None] = (None, None)
                pieces = 0
                try:
                    async for piece in await self._stream(role, request):
                        if piece.text:
                            pieces += 1
                            self.transcript += piece.text
                            for delta in self._release(role):
                                yield delta
                            if piece.finish_reason is None:
                                await self._look_ahead(anticipate, usage.completion_tokens, pieces)
                        if piece.finish_reason is not None:
                            finish = (piece.finish_reason, piece.stop_reason)
                        if piece.completion_tokens is not None:
                            self._count(
                                role,
                                phase,
                                usage,
                                piece.prompt_tokens or 0,
                                piece.cached_tokens,
                                piece.completion_tokens,
                            )
                except StreamInterrupted as broken:
                    # The text that arrived stays (its pieces count as tokens); resume from it.
                    await self._drop_ahead()
                    self._count(role, phase, usage, 0, 0, pieces)
                    resumes += 1
                    if resumes > self.config.policy.max_resumes:
                        raise UpstreamFailure(role, broken.cause) from broken
                    continue
                ended = decide(RequestEnd(finish[0], finish[1], usage.completion_tokens))
                if ended == "length":
                    # The request's allowance ran out. If the phase changed while it ran (a
                    # model that answered without reasoning is no longer held to the
                    # answer's reserve), room is left: write on; the loop's top ends the turn
                    # when none is.
                    ended = None if pieces and self.room(role) > 0 else self._length()
                if ended is None or (self._ahead and self._ahead.transcript != self.transcript):
                    await self._drop_ahead()  # no hand-off, or not where it was foreseen
        finally:
            self.seconds[role] += time.perf_counter() - began
            self.segments.append(
                Segment(
                    model=role,
                    phase=phase,
                    text=self.transcript[start:],
                    ended_by=ended or "failed",
                    cue=self.cue if ended == "cue" else None,
                    usage=usage,
                    seconds=time.perf_counter() - began,
                )
            )

    async def _stream(
        self, role: ModelRole, request: CompletionRequest
    ) -> AsyncIterator[StreamPiece]:
        """The request's stream: the one opened ahead if it is this request, else a new one."""
        ahead = self._ahead
        if ahead is not None and ahead.serves(role, request, self.transcript):
            self._ahead = None
            self.speculative_handoffs += 1
            return ahead.pieces()
        await self._drop_ahead()
        return self.endpoints[role].stream_completion(self._numbered(request))

    async def _look_ahead(self, anticipate: Anticipate | None, counted: int, pieces: int) -> None:
        """After a piece that did not end the request (`pieces` of it so far, `counted`
        tokens of the turn before it): close the request opened ahead if the text went on
        past its hand-off, and open one if the text may hand off here."""
        if self._ahead is not None:
            if self._ahead.may_serve(self.transcript):
                return
            await self._drop_ahead()
        uncounted = pieces + 1  # this request's tokens, the confirming one included
        upcoming = anticipate(counted + uncounted) if anticipate else None
        if upcoming is None:
            return
        allowance = self.room(upcoming.role) - uncounted  # the room once they are counted
        if upcoming.cap is not None:
            allowance = min(allowance, upcoming.cap)
        if allowance > 0:
            target = self.transcript + upcoming.completion
            request = self._request(upcoming.role, allowance, upcoming.stops, None, target)
            endpoint = self.endpoints[upcoming.role]
            self._ahead = HeadStart(endpoint, upcoming, request, self._numbered(request), target)

    async def _drop_ahead(self) -> None:
        if self._ahead is not None:
            ahead, self._ahead = self._ahead, None
            self.speculative_misses += 1
            await ahead.discard()

    async def aclose(self) -> None:
        """Close what is still open (a request opened ahead of a turn that never came)."""
        await self._drop_ahead()

    def _count(
        self,
        role: ModelRole,
        phase: Phase,
        turn: ModelUsage,
        prompt: int,
        cached: int | None,
        completion: int,
    ) -> None:
        """Add one request's usage to the turn, the model and the reasoning."""
        turn.add(prompt, cached, completion)
        self.usage[role].add(prompt, cached, completion)
        if phase == "reasoning":
            self.reasoning_tokens += completion

    def _length(self) -> SegmentEnd:
        """Why there is no room left: the reasoning limit, or the budget/context."""
        if self._reasoning_room() <= 0 and self.sampling.max_tokens > self.generated_tokens:
            return "reasoning_budget"
        return "length"

    def flush(self, role: ModelRole) -> list[TextDelta]:
        """Release what was held back at the end of a phase or of the generation."""
        text = self._releaser.release(self.transcript, final=True)
        return [TextDelta(text, role, self.phase)] if text else []

    def result(self, finish_reason: FinishReason) -> RelayResult:
        reasoning, answer = split_reasoning(self.transcript, self.config.markers, self.mode)
        generated = self.generated_tokens
        return RelayResult(
            generation_id=self.id,
            text=self.transcript,
            reasoning=reasoning,
            answer=answer,
            finish_reason=finish_reason,
            segments=list(self.segments),
            usage={role: usage.model_copy() for role, usage in self.usage.items()},
            stats=RelayStats(
                large_share=self.usage["large"].completion_tokens / generated if generated else 0.0,
                switches=sum(
                    1 for s in self.segments if s.model == "small" and s.phase == "reasoning"
                ),
                seconds=dict(self.seconds),
                total_seconds=time.perf_counter() - self.started,
                time_to_first_token=self.first_token_at,
                speculative_handoffs=self.speculative_handoffs,
                speculative_misses=self.speculative_misses,
            ),
        )

    def _request(
        self,
        role: ModelRole,
        max_tokens: int,
        stops: Sequence[str],
        extra_body: Mapping[str, Any] | None,
        transcript: str | None = None,
    ) -> CompletionRequest:
        """The request `role` sends to write on from `transcript` (default: the one so far)."""
        transcript = self.transcript if transcript is None else transcript
        body = {**self.extra_body, **(extra_body or {})}
        if self.request_hook is not None:
            body.update(self.request_hook(role, self.phase, transcript))
        return CompletionRequest(
            prompt=self.prompts[role].text + transcript,
            max_tokens=max_tokens,
            stop=tuple(stops),
            sampling=self.sampling.request_fields(self.config.endpoint(role).sampling),
            extra_body=body,
            headers={self.config.session_header: self.id},
        )

    def _numbered(self, request: CompletionRequest) -> CompletionRequest:
        """The request as sent: vLLM's own request id (its logs, its response ids) is unique
        per request sent."""
        self.requests_sent += 1
        number = {"X-Request-Id": f"{self.id}-{self.requests_sent}"}
        return replace(request, headers={**request.headers, **number})

    def _release(self, role: ModelRole) -> list[TextDelta]:
        if (
            self.phase == "reasoning"
            and self.mode is PromptReasoning.MODEL_OPENS
            and not self._releaser.started
        ):
            opened = starts_with(self.transcript, self.config.markers.start)
            if opened is None:
                return []
            if not opened:  # the model answered without reasoning
                self.phase = "answer"
                self._releaser = self._new_releaser()
        text = self._releaser.release(self.transcript)
        if not text:
            return []
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter() - self.started
        return [TextDelta(text, role, self.phase)]

    def _new_releaser(self) -> Releaser:
        markers = self.config.markers
        if self.phase == "answer":
            return Releaser(len(self.transcript))
        opener = markers.start if self.mode is PromptReasoning.MODEL_OPENS else None
        return Releaser(len(self.transcript), opener=opener, closer=markers.end)
