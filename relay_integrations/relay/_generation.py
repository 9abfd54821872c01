"""The state of one relay generation, and how it plays a turn of the method (:mod:`._turns`).

A turn is what the method calls a segment: one model writing until something hands control
on. It may take several requests (a false sentence end, a stream that broke and resumed), but
every request's prompt is the model's rendered prefix plus the transcript so far, so the
server's prefix cache prefills only what that model has not seen::

    async for event in run.play(turn):  # its text as it arrives, then its SegmentDone
        ...
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from contextlib import aclosing
from dataclasses import replace
from typing import Any

from ..upstream.config import ModelRole, SamplingConfig
from ..upstream.endpoint import (
    CompletionRequest,
    Endpoint,
    StreamInterrupted,
    StreamPiece,
    UpstreamFailure,
)
from ..upstream.rendering import RenderedPrompt
from ._speculative_handoff import SpeculativeHandoff
from ._turns import WRITE_ON, HandoffForecast, RequestEnd, Turn, TurnDecision
from ._warm_up import PromptWarmUp
from .config import CONTEXT_MARGIN, Phase, RelayConfig, RequestHook
from .reasoning import PromptReasoning, Releaser, split_reasoning, starts_with
from .result import (
    FinishReason,
    ModelUsage,
    RelayResult,
    RelayStats,
    Segment,
    SegmentDone,
    SegmentEnd,
    TextDelta,
)

logger = logging.getLogger(__name__)


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
        answer_stops: Sequence[str] = (),
        answer_extra_body: Mapping[str, Any] | None = None,
        started: float | None = None,
        degraded: str | None = None,
    ) -> None:
        """`prompts` holds the models that serve this generation (no small model's prompt:
        the large model writes everything, and `degraded` says why). `answer_stops` and
        `answer_extra_body` apply to the answer's requests only."""
        self.id = generation_id
        self.config = config
        self.endpoints = endpoints
        self.prompts = prompts
        self.context_windows = context_windows
        self.sampling = sampling
        self.request_hook = request_hook
        self.extra_body = dict(extra_body or {})
        self.answer_stops = tuple(answer_stops)
        self.answer_extra_body = dict(answer_extra_body or {})
        self.mode = PromptReasoning.of(prompts["large"].text, config.markers)
        self.transcript = ""
        self.phase: Phase = "answer" if self.mode is PromptReasoning.CLOSED else "reasoning"
        self.small_available = "small" in prompts
        self.degraded = degraded
        """Why the large model wrote what the small one would have (its server failed or is
        known down), or None."""
        self.waited = 0.0  # seconds spent waiting for a server to come back
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
        self._handoff: SpeculativeHandoff | None = None
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

    def end_reasoning(self, marker_written: bool) -> list[TextDelta]:
        """The reasoning is over: close it on the model's behalf unless it wrote the end
        marker (the reasoning budget, or it stopped unclosed), release what was held back,
        and start the answer phase. Returns the text released."""
        if not marker_written:
            self.transcript = self.transcript.rstrip() + "\n" + self.config.markers.end
        released = self.flush(self.segments[-1].model)
        self.phase = "answer"
        self._releaser = self._new_releaser()
        return released

    async def play(self, turn: Turn) -> AsyncIterator[TextDelta | SegmentDone]:
        """Let the turn's writer write until the turn's decision ends it: yields the visible
        text as it arrives, then the turn's :class:`SegmentDone` (the segment is also in
        ``self.segments``, even when the turn raises).

        When the small model fails beyond its retries and the policy says ``use_large``, the
        turn ends ``failed`` and the small model is not asked again in this generation; any
        other failure raises :class:`UpstreamFailure`.
        """
        role, phase = turn.writer(self), self.phase
        start, began = len(self.transcript), time.perf_counter()
        usage = ModelUsage()  # this turn's; its tokens count against the turn's cap
        decision = TurnDecision("failed")
        try:
            async for item in self._requests(role, turn, usage):
                if isinstance(item, TurnDecision):
                    decision = item
                else:
                    yield item
        except UpstreamFailure as failure:
            if role == "large" or self.config.policy.on_small_failure == "raise":
                raise
            self.small_available = False
            self.degraded = f"the small model's server failed: {failure.reason}"
        finally:
            self.seconds[role] += time.perf_counter() - began
            segment = Segment(
                model=role,
                phase=phase,
                text=self.transcript[start:],
                ended_by=decision.ended or "failed",
                cue=decision.cue if decision.ended == "cue" else None,
                usage=usage,
                seconds=time.perf_counter() - began,
            )
            self.segments.append(segment)
        yield SegmentDone(segment)

    async def _requests(
        self, role: ModelRole, turn: Turn, usage: ModelUsage
    ) -> AsyncGenerator[TextDelta | TurnDecision, None]:
        """The turn's requests, one after another until a decision ends the turn: their
        visible text, then that decision. A stream that breaks mid-way resumes from the text
        so far (``SwitchPolicy.max_resumes`` times); a request that finds the server out
        waits for it to come back (:meth:`_wait_for_server`)."""
        phase, resumes, decision = self.phase, 0, WRITE_ON
        while decision.ended is None:
            allowance = self._allowance(role, turn.cap, usage)
            if allowance <= 0:
                decision = TurnDecision(self._out_of_room(turn.cap, usage))
                break
            request = self._request(role, allowance, turn.stops(self), turn.extra_body(self))
            handoff = turn.speculative_handoff(self)
            end: RequestEnd | None = None
            try:
                async with aclosing(self._send(role, phase, request, usage, handoff)) as items:
                    async for item in items:
                        if isinstance(item, RequestEnd):
                            end = item
                        else:
                            yield item
            except StreamInterrupted as broken:
                resumes += 1
                self._resume(role, broken, resumes)
                continue
            except UpstreamFailure as failure:
                await self._wait_for_server(role, failure)
                continue
            assert end is not None, "a request that did not break ends with its RequestEnd"
            decision = await self._apply(role, turn.decide(end), end.pieces)
        yield decision

    def _resume(self, role: ModelRole, broken: StreamInterrupted, resumes: int) -> None:
        """Go on after a broken stream, or give up once the resumes are spent."""
        config = self.endpoints[role].config
        if resumes > self.config.policy.max_resumes:
            raise UpstreamFailure.broken(broken, config, resumes) from broken
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

    async def _wait_for_server(self, role: ModelRole, failure: UpstreamFailure) -> None:
        """After a request found `role`'s server out (no connection, a 502/503/504, its
        breaker open): wait for a probe to find it up again, within what is left of
        ``SwitchPolicy.resume_wait_seconds``, so that a restart loses no text; or raise
        `failure` at once when the generation can go on without the server (the small one's,
        unless the policy says raise), has written nothing yet (nothing to lose: the caller
        may try elsewhere), or the failure is not an outage (a refused request)."""
        policy = self.config.policy
        essential = role == "large" or policy.on_small_failure == "raise"
        if not (essential and self.transcript and failure.outage):
            raise failure
        budget = policy.resume_wait_seconds - self.waited
        endpoint, began, back = self.endpoints[role], time.monotonic(), False
        if budget > 0:
            logger.warning(
                "generation %s: the %s server %s is out (%s); waiting up to %.0f s for it",
                self.id,
                role,
                endpoint.config.base_url,
                failure.reason,
                budget,
            )
            back = await endpoint.availability.wait_until_up(budget)
            self.waited += time.monotonic() - began
        if not back:
            waited = f"{self.waited:.0f} s of SwitchPolicy.resume_wait_seconds"
            raise UpstreamFailure(
                role,
                failure.cause,
                f"{failure.detail} The generation waited {waited} for it to come back.",
                f"{failure.reason}; it did not come back within the {waited}",
            ) from failure

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
        handoff: HandoffForecast | None,
    ) -> AsyncGenerator[TextDelta | RequestEnd, None]:
        """Stream one request into the transcript: the text released, then how the request
        ended. Its usage goes to `turn`; a broken stream's text stays, and its tokens count
        (the server's count up to the last piece, else one a piece)."""
        pieces, tokens = 0, None
        finish_reason: str | None = None
        stop_reason: str | int | None = None
        try:
            async with aclosing(await self._stream(role, request)) as stream:
                async for piece in stream:
                    if piece.text:
                        pieces, tokens = pieces + 1, piece.tokens
                        self.transcript += piece.text
                        for delta in self._release(role):
                            yield delta
                        if piece.finish_reason is None:
                            written = pieces if tokens is None else tokens
                            await self._open_handoff(handoff, turn.completion_tokens, written)
                    if piece.finish_reason is not None:
                        finish_reason, stop_reason = piece.finish_reason, piece.stop_reason
                    if piece.completion_tokens is not None:
                        prompt, cached = piece.prompt_tokens or 0, piece.cached_tokens
                        self._count(role, phase, turn, prompt, cached, piece.completion_tokens)
        except StreamInterrupted:
            await self._discard_handoff()
            self._count(role, phase, turn, 0, 0, pieces if tokens is None else tokens)
            raise
        yield RequestEnd(
            finish_reason,
            stop_reason,
            turn.completion_tokens,
            self.transcript,
            self.phase,
            pieces,
        )

    async def _apply(self, role: ModelRole, decision: TurnDecision, pieces: int) -> TurnDecision:
        """Carry out a request's decision: cut the transcript, settle a request that ran out
        of allowance, and discard the speculative hand-off if the turn does not hand off
        where it was foreseen. Returns the decision as it stands."""
        if decision.cut is not None:
            self.transcript = self.transcript[: decision.cut]  # only text not yet released
        if decision.ended == "length":
            # The request's allowance ran out. If the phase changed while it ran (a model
            # that answered without reasoning is no longer held to the answer's reserve),
            # room is left: write on; the turn ends at its next request when none is.
            room_left = pieces > 0 and self.room(role) > 0
            decision = WRITE_ON if room_left else replace(decision, ended=self._length())
        foreseen = self._handoff is None or self._handoff.transcript == self.transcript
        if decision.ended is None or not foreseen:
            await self._discard_handoff()  # no hand-off, or not where it was foreseen
        return decision

    async def _stream(
        self, role: ModelRole, request: CompletionRequest
    ) -> AsyncGenerator[StreamPiece, None]:
        """The request's stream: the speculative hand-off's if it is this request, else a
        new one."""
        handoff = self._handoff
        if handoff is not None and handoff.serves(role, request, self.transcript):
            self._handoff = None
            self.speculative_handoffs += 1
            return handoff.pieces()
        await self._discard_handoff()
        return self.endpoints[role].stream_completion(self._numbered(request))

    async def _open_handoff(
        self, forecast: HandoffForecast | None, counted: int, written: int
    ) -> None:
        """After a piece that did not end the request (`written` tokens of it so far,
        `counted` tokens of the turn before it): discard the speculative hand-off if the text
        went on past its point, and open one if the text may hand off here."""
        if self._handoff is not None:
            if self._handoff.may_serve(self.transcript):
                return
            await self._discard_handoff()
        uncounted = written + 1  # this request's tokens, the confirming one included
        upcoming = forecast(counted + uncounted) if forecast else None
        if upcoming is None:
            return
        allowance = self.room(upcoming.role) - uncounted  # the room once they are counted
        if upcoming.cap is not None:
            allowance = min(allowance, upcoming.cap)
        if allowance > 0:
            target = self.transcript + upcoming.completion
            request = self._request(upcoming.role, allowance, upcoming.stops, None, target)
            endpoint = self.endpoints[upcoming.role]
            numbered = self._numbered(request)
            self._handoff = SpeculativeHandoff(endpoint, upcoming, request, numbered, target)

    async def _discard_handoff(self) -> None:
        if self._handoff is not None:
            handoff, self._handoff = self._handoff, None
            self.speculative_misses += 1
            await handoff.discard()

    def warm_up(self, role: ModelRole) -> None:
        """Send `role` its prompt now, one token, so that its server's prefix cache holds it
        by `role`'s first turn (see :mod:`._warm_up`)."""
        request = CompletionRequest(
            prompt=self.prompts[role].text,
            max_tokens=1,
            extra_body=self.extra_body,
            headers={self.config.session_header: self.id},
        )
        self._warm_up = PromptWarmUp(self.endpoints[role], self._numbered(request))

    async def aclose(self) -> None:
        """Close what is still open (a speculative hand-off to a turn that never came, the
        prompt's warm-up)."""
        await self._discard_handoff()
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
                degraded=self.degraded,
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
