"""The state of one relay generation, and the turns in which one model writes.

A turn is what the method calls a segment: one model writing until something hands control
on. It may take several requests (a false sentence end, a stream that broke and resumed), but
every request's prompt is the model's rendered prefix plus the transcript so far, so the
server's prefix cache prefills only what that model has not seen.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import Any

from .config import CONTEXT_MARGIN, ModelRole, Phase, RelayConfig, RequestHook, SamplingConfig
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
    RelayResult,
    RelayStats,
    Segment,
    SegmentEnd,
    TextDelta,
)
from .upstream_errors import explain_broken_stream
from .warm_up import PromptWarmUp

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RequestEnd:
    """How one request ended, as the turn's decision function sees it: the server's finish
    and stop reasons, the turn's tokens so far, and the transcript and phase it left."""

    finish_reason: str | None
    stop_reason: str | int | None
    turn_tokens: int
    transcript: str
    phase: Phase


@dataclass(frozen=True)
class TurnDecision:
    """What a request's end means for its turn, as a value the turn applies: how the turn
    ended (None: the model writes on), where to cut the transcript first (the hand-off point
    of a cue, the end of a sentence), and the cue that handed off."""

    ended: SegmentEnd | None
    cut: int | None = None
    cue: str | None = None


WRITE_ON = TurnDecision(None)

Decide = Callable[[RequestEnd], TurnDecision]
"""Decides, after each request of a turn, how the turn ended."""

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
        self.segments: list[Segment] = []
        self.usage = {"large": ModelUsage(), "small": ModelUsage()}
        self.reasoning_tokens = 0
        self.seconds = {"large": 0.0, "small": 0.0}
        self.started = started if started is not None else time.perf_counter()  # rendering too
        self.first_token_at: float | None = None
        self.requests_sent = 0
        self.speculative_handoffs = 0  # hand-offs whose request was opened ahead and used
        self.speculative_misses = 0  # requests opened ahead and closed unused
        self.resumes = 0  # streams that broke mid-way and went on from the text so far
        self._ahead: HeadStart | None = None
        self._warm_up: PromptWarmUp | None = None
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

        Each request's end goes to `decide`, whose :class:`TurnDecision` the turn applies.
        With `anticipate`, the next turn's request is opened where the text may hand off,
        and the next turn uses it if it is the request it would send. The finished segment
        is appended to ``self.segments``. Raises :class:`UpstreamFailure` when the endpoint
        fails beyond its retries and resumes.
        """
        phase, start, began = self.phase, len(self.transcript), time.perf_counter()
        usage, resumes = ModelUsage(), 0  # usage of this turn; its tokens count against `cap`
        decision: TurnDecision = WRITE_ON
        try:
            while decision.ended is None:
                allowance = self._allowance(role, cap, usage)
                if allowance <= 0:
                    decision = TurnDecision(self._out_of_room(cap, usage))
                    break
                request = self._request(role, allowance, stops(), extra_body)
                sent = _Sent()
                try:
                    async with aclosing(
                        self._send(role, phase, request, usage, sent, anticipate)
                    ) as deltas:
                        async for delta in deltas:
                            yield delta
                except StreamInterrupted as broken:
                    # The text that arrived stays (and its tokens count); resume from it.
                    await self._drop_ahead()
                    self._count(role, phase, usage, 0, 0, sent.written)
                    resumes += 1
                    config = self.endpoints[role].config
                    if resumes > self.config.policy.max_resumes:
                        detail = explain_broken_stream(broken.cause, role, config, resumes)
                        raise UpstreamFailure(role, broken.cause, detail) from broken
                    self.resumes += 1
                    logger.warning(
                        "generation %s: the %s stream from %s broke after %d characters (%s); "
                        "resuming from the text so far (%d of SwitchPolicy.max_resumes=%d)",
                        self.id,
                        role,
                        config.base_url,
                        len(broken.text),
                        str(broken.cause) or type(broken.cause).__name__,
                        resumes,
                        self.config.policy.max_resumes,
                    )
                    continue
                end = RequestEnd(
                    sent.finish_reason,
                    sent.stop_reason,
                    usage.completion_tokens,
                    self.transcript,
                    self.phase,
                )
                decision = await self._apply(role, decide(end), sent.pieces)
        finally:
            self.seconds[role] += time.perf_counter() - began
            self.segments.append(
                Segment(
                    model=role,
                    phase=phase,
                    text=self.transcript[start:],
                    ended_by=decision.ended or "failed",
                    cue=decision.cue if decision.ended == "cue" else None,
                    usage=usage,
                    seconds=time.perf_counter() - began,
                )
            )

    def _allowance(self, role: ModelRole, cap: int | None, turn: ModelUsage) -> int:
        """Tokens the next request of the turn may write: the room left, and the turn's cap."""
        allowance = self.room(role)
        if cap is not None:
            allowance = min(allowance, cap - turn.completion_tokens)
        return allowance

    def _out_of_room(self, cap: int | None, turn: ModelUsage) -> SegmentEnd:
        capped = cap is not None and turn.completion_tokens >= cap
        return "segment_cap" if capped else self._length()

    async def _send(
        self,
        role: ModelRole,
        phase: Phase,
        request: CompletionRequest,
        turn: ModelUsage,
        sent: _Sent,
        anticipate: Anticipate | None,
    ) -> AsyncGenerator[TextDelta, None]:
        """Stream one request into the transcript, yielding the text released; `sent`
        records its pieces and how it ended, `turn` its usage."""
        async with aclosing(await self._stream(role, request)) as pieces:
            async for piece in pieces:
                if piece.text:
                    sent.pieces += 1
                    sent.tokens = piece.tokens
                    self.transcript += piece.text
                    for delta in self._release(role):
                        yield delta
                    if piece.finish_reason is None:
                        await self._look_ahead(anticipate, turn.completion_tokens, sent.written)
                if piece.finish_reason is not None:
                    sent.finish_reason, sent.stop_reason = piece.finish_reason, piece.stop_reason
                if piece.completion_tokens is not None:
                    prompt, cached = piece.prompt_tokens or 0, piece.cached_tokens
                    self._count(role, phase, turn, prompt, cached, piece.completion_tokens)

    async def _apply(self, role: ModelRole, decision: TurnDecision, pieces: int) -> TurnDecision:
        """Carry out a request's decision: cut the transcript, settle a request that ran out
        of allowance, and close the request opened ahead if the turn does not hand off
        where it was foreseen. Returns the decision as it stands."""
        if decision.cut is not None:
            self.transcript = self.transcript[: decision.cut]  # only text not yet released
        if decision.ended == "length":
            # The request's allowance ran out. If the phase changed while it ran (a model
            # that answered without reasoning is no longer held to the answer's reserve),
            # room is left: write on; the turn ends at its next request when none is.
            room_left = pieces > 0 and self.room(role) > 0
            decision = WRITE_ON if room_left else replace(decision, ended=self._length())
        if decision.ended is None or (self._ahead and self._ahead.transcript != self.transcript):
            await self._drop_ahead()  # no hand-off, or not where it was foreseen
        return decision

    async def _stream(
        self, role: ModelRole, request: CompletionRequest
    ) -> AsyncGenerator[StreamPiece, None]:
        """The request's stream: the one opened ahead if it is this request, else a new one."""
        ahead = self._ahead
        if ahead is not None and ahead.serves(role, request, self.transcript):
            self._ahead = None
            self.speculative_handoffs += 1
            return ahead.pieces()
        await self._drop_ahead()
        return self.endpoints[role].stream_completion(self._numbered(request))

    async def _look_ahead(self, anticipate: Anticipate | None, counted: int, written: int) -> None:
        """After a piece that did not end the request (`written` tokens of it so far,
        `counted` tokens of the turn before it): close the request opened ahead if the text
        went on past its hand-off, and open one if the text may hand off here."""
        if self._ahead is not None:
            if self._ahead.may_serve(self.transcript):
                return
            await self._drop_ahead()
        uncounted = written + 1  # this request's tokens, the confirming one included
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

    def warm_up(self, role: ModelRole) -> None:
        """Send `role` its prompt now, one token, so that its server's prefix cache holds it
        by `role`'s first turn (see :mod:`.warm_up`)."""
        request = CompletionRequest(
            prompt=self.prompts[role].text,
            max_tokens=1,
            extra_body=self.extra_body,
            headers={self.config.session_header: self.id},
        )
        self._warm_up = PromptWarmUp(self.endpoints[role], self._numbered(request))

    async def aclose(self) -> None:
        """Close what is still open (a request opened ahead of a turn that never came, the
        prompt's warm-up)."""
        await self._drop_ahead()
        if self._warm_up is not None:
            await self._warm_up.close()

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
                resumes=self.resumes,
                warm_up=self._warm_up.usage if self._warm_up else None,
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


@dataclass
class _Sent:
    """One request as it streams: the pieces that carried text, the tokens the server
    counted up to the last of them, and how it ended."""

    pieces: int = 0
    tokens: int | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None

    @property
    def written(self) -> int:
        """Tokens written so far: the server's count, else one a piece (a piece may carry
        several tokens, a server that does not count them gets an estimate)."""
        return self.tokens if self.tokens is not None else self.pieces
