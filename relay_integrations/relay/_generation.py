"""One relay generation, and how it plays a turn of the method (:mod:`._turns`).

A turn is what the method calls a segment: one model writing until something hands control
on. It may take several requests (a false sentence end, a stream that broke and resumed), but
every request's prompt is the model's rendered prefix plus the transcript so far (in its
token ids where it has them: :mod:`._prompts`), so the server's prefix cache prefills only
what that model has not seen::

    async for event in run.play(turn):  # its text as it arrives, then its SegmentDone
        ...

The generation's other jobs are parts of their own: what it may still write
(:class:`~._budget.Budget`), what it used (:class:`~._tally.Tally`), what the caller may see
(:class:`~._visible.VisibleText`), the request opened ahead of a hand-off
(:class:`~._speculative_handoff.HandoffSlot`), and what it does when a server fails it
(:class:`~._recovery.Recovery`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import replace
from functools import partial

from ..upstream import tracing
from ..upstream.config import ModelRole
from ..upstream.endpoint import (
    CompletionRequest,
    Endpoint,
    StreamInterrupted,
    UpstreamFailure,
)
from ..upstream.rendering import RenderedIds, RenderedPrompt
from ._budget import Budget
from ._prompts import Prompts
from ._recovery import Recovery
from ._requests import TurnRequests
from ._spans import segment_attributes, segment_span
from ._speculative_handoff import HandoffSlot, SpeculativeHandoff
from ._tally import Tally
from ._turns import WRITE_ON, MethodTurns, RequestEnd, Turn, TurnDecision, Upcoming
from ._visible import VisibleText
from ._warm_up import PromptWarmUp
from .config import Phase, RelayConfig, RequestHook
from .reasoning import PromptReasoning, partial_suffix, split_reasoning
from .request import RelayRequest
from .result import (
    FinishReason,
    ModelUsage,
    RelayResult,
    RelayStats,
    Segment,
    SegmentDone,
    TextDelta,
)

Forecast = Callable[[int], Upcoming | None]
"""Given the turn's tokens once the next one arrives: the turn a confirmed hand-off there
leads to, or None."""


class Generation:
    """The state of one generation: transcript, phase, segments, and the parts above."""

    def __init__(
        self,
        request: RelayRequest,
        *,
        config: RelayConfig,
        turns: MethodTurns,
        endpoints: Mapping[ModelRole, Endpoint],
        prompts: Mapping[ModelRole, RenderedPrompt | RenderedIds],
        mode: PromptReasoning,
        context_windows: Mapping[ModelRole, int | None],
        request_hook: RequestHook | None = None,
        started: float | None = None,
        span: tracing.Span | None = None,
    ) -> None:
        """`prompts` holds the models' rendered prompts known when the generation is made (the
        large model's: its first request may be opened while the small model's is rendered,
        :meth:`open_first`); before the generation is played, :meth:`admit_small` gives the
        small model's, or :meth:`degrade` says why the large model writes everything. `mode`:
        how the large model's prompt leaves the reasoning; `span`: the generation's trace span,
        the parent of its segments' spans (None when not tracing)."""
        self.id = generation_id = request.generation_id or f"relay-{uuid.uuid4().hex}"
        self.config = config
        self.turns = turns
        self.endpoints = endpoints
        self.answer_stops = tuple(request.stop)
        self.answer_extra_body = request.answer_extra_body
        sampling = request.sampling or config.sampling
        self.mode = mode
        self.transcript = ""
        self.phase: Phase = "answer" if self.mode is PromptReasoning.CLOSED else "reasoning"
        self.small_available = True
        self.degraded: str | None = None
        """Why the large model wrote what the small one would have (its server failed or is
        known down), or None."""
        self.segments: list[Segment] = []
        self.started = started if started is not None else time.perf_counter()  # rendering too
        self.tally = Tally()
        self.budget = Budget(
            sampling.max_tokens,
            dict(context_windows),
            {role: prompt.token_count for role, prompt in prompts.items()},
            config.policy,
        )
        self.visible = VisibleText(config.markers, self.mode, self.phase, self.started)
        self.handoff = HandoffSlot()
        self.recovery = Recovery(generation_id, config, endpoints, self.tally)
        self.prompts = Prompts(prompts)
        self.requests = TurnRequests(
            generation_id, config, turns, self.prompts, sampling, request_hook, request.extra_body
        )
        self._warm_up: PromptWarmUp | None = None
        self.span = span
        self._segment_span: tracing.Span | None = None  # the turn being played's

    def open_first(self, turn: Turn) -> None:
        """Open `turn`'s first request now, if the large model writes it: it is held as a
        request opened ahead (the turn adopts it if it is the request the turn sends once
        the small model's prompt is known, else it is closed), so that the large model's
        prefill runs while the small model's prompt is rendered."""
        role = self.turns.writer(turn, self)
        allowance = self.budget.allowance(role, self.phase, self.tally, turn.cap, 0)
        if role != "large" or allowance <= 0:
            return
        request = self.requests.build(self, turn, role, allowance)
        numbered = self.requests.numbered(request)
        # its first piece's task retries within the deadline
        with self.recovery.scope(), tracing.current(self.span, "first_request"):
            first = SpeculativeHandoff(
                self.endpoints[role], role, "", request, numbered, self.transcript, counted=False
            )
        self.handoff.hold(first)

    def admit_small(self, prompt: RenderedPrompt | RenderedIds, window: int | None) -> None:
        """The small model's prompt, rendered after the generation was made (before it is
        played)."""
        self.prompts.add("small", prompt)
        budget = self.budget
        windows = {**budget.windows, "small": window}
        prompt_tokens = {**budget.prompt_tokens, "small": prompt.token_count}
        self.budget = replace(budget, windows=windows, prompt_tokens=prompt_tokens)

    def degrade(self, reason: str) -> None:
        """The small model cannot serve this generation (`reason`): the large one writes
        everything."""
        self.small_available, self.degraded = False, reason

    async def play(self, turn: Turn) -> AsyncIterator[TextDelta | SegmentDone]:
        """Let the turn's writer write until the turn's decision ends it: yields the visible
        text as it arrives, then the turn's :class:`SegmentDone` (the segment is also in
        ``self.segments``, even when the turn raises).

        When the small model fails beyond its retries and the policy says ``use_large``, the
        turn ends ``failed`` and the small model is not asked again in this generation; any
        other failure raises :class:`UpstreamFailure`.
        """
        role, phase = self.turns.writer(turn, self), self.phase
        start, began = len(self.transcript), time.perf_counter()
        usage = ModelUsage()  # this turn's; its tokens count against the turn's cap
        decision = TurnDecision("failed")
        model = self.config.endpoint(role).model
        self._segment_span = segment_span(self.span, model, role, phase, len(self.segments))
        try:
            async for item in self._requests(role, turn, usage):
                if isinstance(item, TurnDecision):
                    decision = item
                else:
                    yield item
        except UpstreamFailure as failure:
            if role == "large" or self.config.policy.on_small_failure == "raise":
                raise
            self.degrade(f"the small model's server failed: {failure.reason}")
        finally:
            self.tally.seconds[role] += time.perf_counter() - began
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
            if self._segment_span is not None:
                tracing.finish(self._segment_span, segment_attributes(segment))
        yield SegmentDone(segment)

    async def _requests(
        self, role: ModelRole, turn: Turn, usage: ModelUsage
    ) -> AsyncGenerator[TextDelta | TurnDecision, None]:
        """The turn's requests, one after another until a decision ends the turn: their
        visible text, then that decision. A stream that breaks mid-way resumes from the text
        so far, and a server that is out is waited for (:class:`Recovery`)."""
        phase, resumes, decision = self.phase, 0, WRITE_ON
        forecast = partial(self.turns.upcoming, turn, self)
        start, resumed = len(self.transcript), False
        while decision.ended is None:
            tokens = usage.completion_tokens
            allowance = self.budget.allowance(role, self.phase, self.tally, turn.cap, tokens)
            if allowance <= 0:
                ended = self.budget.out_of_room(self.phase, self.tally, turn.cap, tokens)
                decision = TurnDecision(ended)
                break
            request = self.requests.build(self, turn, role, allowance)
            if resumed:
                request = self._goes_on(request, self.transcript[start:])
            end: RequestEnd | None = None
            try:
                purpose: tracing.Purpose = "resume" if resumed else "completion"
                sent = self._send(role, phase, request, usage, forecast, purpose)
                async with aclosing(sent) as items:
                    async for item in items:
                        if isinstance(item, RequestEnd):
                            end = item
                        else:
                            yield item
            except StreamInterrupted as broken:
                resumes, resumed = resumes + 1, True
                self.recovery.resume(role, broken, resumes)
                continue
            except UpstreamFailure as failure:
                await self.recovery.wait_for(role, failure, written=bool(self.transcript))
                continue
            assert end is not None, "a request that did not break ends with its RequestEnd"
            resumed = False
            decision = self.turns.decide(turn, end)
            await self._apply(decision)
        yield decision

    async def _send(
        self,
        role: ModelRole,
        phase: Phase,
        request: CompletionRequest,
        turn: ModelUsage,
        forecast: Forecast,
        purpose: tracing.Purpose,
    ) -> AsyncGenerator[TextDelta | RequestEnd, None]:
        """Stream one request into the transcript: the text released, then how the request
        ended. Its usage goes to `turn`; a broken stream's text stays, and its tokens count
        (the server's count up to the last piece, else one a piece). A stream that broke
        after the server had ended the request (its finish came, or its text holds a stop)
        ended there: only a stream that broke mid-way raises :class:`StreamInterrupted`.
        The request is opened within the generation's recovery deadline, and its first
        piece ends a recovery (:class:`~._recovery.Recovery`); `purpose`: why it is sent (its
        trace span says)."""
        pieces, tokens, counted, start = 0, None, False, len(self.transcript)
        finish_reason: str | None = None
        stop_reason: str | int | None = None
        stream = self.handoff.take(role, request, self.transcript)
        if stream is None:
            await self.handoff.discard()
            stream = self.endpoints[role].stream_completion(self.requests.numbered(request))
        track, asked = self.prompts.track(role), request.prompt
        try:
            async with aclosing(stream):
                # the endpoint retries here, within the deadline; its span under the segment's
                with self.recovery.scope(), tracing.current(self._segment_span, purpose):
                    piece = await anext(stream, None)
                self.recovery.recovered()
                if track is not None and piece is not None and not isinstance(asked, str):
                    # the text's ids kept; the written ones too, unless they may lag it
                    follow = request.extra_body.get("include_stop_str_in_output", True)
                    track.sent(asked, piece.tail_ids, bool(follow) or not request.stop)
                while piece is not None:
                    if track is not None and (piece.text or piece.token_ids):
                        track.wrote(piece.text, piece.token_ids)
                    if piece.text:
                        pieces, tokens = pieces + 1, piece.tokens
                        self.transcript += piece.text
                        for delta in self._release(role):
                            yield delta
                        if piece.finish_reason is None:
                            written = pieces if tokens is None else tokens
                            await self._open_handoff(forecast, turn.completion_tokens, written)
                    if piece.finish_reason is not None:
                        finish_reason, stop_reason = piece.finish_reason, piece.stop_reason
                    if piece.completion_tokens is not None:
                        prompt, cached = piece.prompt_tokens or 0, piece.cached_tokens
                        completed, counted = piece.completion_tokens, True
                        self.tally.count(role, phase, turn, prompt, cached, completed)
                    try:  # not anext(stream, None): its wrapper costs a piece ~40 ns more
                        piece = await stream.__anext__()
                    except StopAsyncIteration:
                        piece = None
        except StreamInterrupted:
            await self.handoff.discard()
            if track is not None:
                track.ended(at_stop_string=True)  # its last piece's ids may be cut short
            if not counted:
                self.tally.count(role, phase, turn, 0, 0, pieces if tokens is None else tokens)
            if finish_reason is None:
                finish_reason, stop_reason = _stopped_in(self.transcript[start:], request.stop)
            if finish_reason is None:
                self._take_back_partial_stop(start, request.stop)
                raise
            # the server had ended the request (its finish came, or a stop it ends at): the
            # break cost its last events, not text. Resumed, the model would write on past
            # the stop (after the end of reasoning: the answer, in the reasoning's turn).
        else:
            if track is not None:
                track.ended(at_stop_string=isinstance(stop_reason, str))
        yield RequestEnd(
            finish_reason,
            stop_reason,
            turn.completion_tokens,
            self.transcript,
            self.phase,
            pieces,
            room=self.budget.room(role, self.phase, self.tally),
            spent=self.budget.spent(self.phase, self.tally),
        )

    @staticmethod
    def _goes_on(request: CompletionRequest, written: str) -> CompletionRequest:
        """`request`, resuming a request of the turn that broke after `written`: where a
        stop string may have begun in it (one the caller was shown, which
        :meth:`_take_back_partial_stop` cannot take back), the endpoint looks for the stop
        across the two, as the uninterrupted request would have ended there."""
        if any(partial_suffix(written, stop) for stop in request.stop if stop):
            return replace(request, written=written)
        return request

    def _take_back_partial_stop(self, start: int, stops: Sequence[str]) -> None:
        """A stream that broke inside one of its stop strings (``</think`` of ``</think>``, a
        cue's first letters): resumed from there, the server would never see the stop whole,
        its first part being in the prompt, and the model would write on past it (the answer
        in the reasoning's turn). The part is taken back, so that the resumed request writes
        the stop again; only what the caller has not been shown (a possible marker is held
        back until it is decided)."""
        written = self.transcript[start:]
        partial = max((partial_suffix(written, stop) for stop in stops if stop), default=0)
        keep = max(len(self.transcript) - partial, self.visible.released_to, start)
        self.transcript = self.transcript[:keep]
        self.prompts.cut(keep)

    async def _apply(self, decision: TurnDecision) -> None:
        """Carry out the table's decision on a request's end: cut the transcript, and discard
        the speculative hand-off if the turn does not hand off where it was foreseen."""
        if decision.cut is not None:
            self.transcript = self.transcript[: decision.cut]  # only text not yet released
            self.prompts.cut(decision.cut)
        if decision.ended is None or not self.handoff.foreseen(self.transcript):
            await self.handoff.discard()  # no hand-off, or not where it was foreseen

    async def _open_handoff(self, forecast: Forecast, counted: int, written: int) -> None:
        """After a piece that did not end the request (`written` tokens of it so far,
        `counted` tokens of the turn before it): discard the speculative hand-off if the text
        went on past its point, and open one if the text may hand off here."""
        if self.handoff.handoff is not None:
            if self.handoff.may_serve(self.transcript):
                return
            await self.handoff.discard()
        uncounted = written + 1  # this request's tokens, the confirming one included
        upcoming = forecast(counted + uncounted)
        if upcoming is None:
            return
        turn = upcoming.turn
        role = self.turns.writer(turn, self)
        if not self.budget.affords_early_request(role, self.tally, pending=uncounted):
            return
        budget, phase, tally = self.budget, self.phase, self.tally
        allowance = budget.allowance(role, phase, tally, turn.cap, 0, pending=uncounted)
        if allowance > 0:
            target = self.transcript + upcoming.completion
            request = self.requests.build(self, turn, role, allowance, target)
            numbered = self.requests.numbered(request)
            endpoint = self.endpoints[role]
            span = self._segment_span
            # its first piece's task retries within the deadline
            with self.recovery.scope(), tracing.current(span, "speculative_handoff"):
                handoff = SpeculativeHandoff(
                    endpoint, role, upcoming.confirmed_by, request, numbered, target
                )
            self.handoff.hold(handoff)

    def _release(self, role: ModelRole) -> list[TextDelta]:
        """The text the caller may see since the last release. A model that was to open its
        reasoning and wrote an answer instead starts the answer phase."""
        opened = self.visible.reasoning_opened(self.transcript, self.phase)
        if opened is None:
            return []
        if not opened:
            self._start_answer()
        return self.visible.release(self.transcript, role, self.phase)

    def end_reasoning(self, marker_written: bool) -> list[TextDelta]:
        """The walk reached the answer: close the reasoning on the model's behalf unless it
        wrote the end marker (the reasoning budget, or it stopped unclosed), release what was
        held back, and start the answer phase. Returns the text released."""
        if not marker_written:
            kept = self.transcript.rstrip()
            self.prompts.cut(len(kept))
            self.transcript = kept + "\n" + self.config.markers.end
        released = self.flush(self.segments[-1].model)
        self._start_answer()
        return released

    def _start_answer(self) -> None:
        """The one place the answer phase begins (the walk reached the answer turn, or the
        model answered without reasoning): what is released from here on is answer text."""
        self.phase = "answer"
        self.visible.restart(len(self.transcript), "answer")

    def flush(self, role: ModelRole) -> list[TextDelta]:
        """Release what was held back at the end of a phase or of the generation."""
        return self.visible.flush(self.transcript, role, self.phase)

    def warm_up(self, role: ModelRole) -> None:
        """Send `role` its prompt now, one token, so that its server's prefix cache holds it
        by `role`'s first turn (see :mod:`._warm_up`)."""
        request = self.requests.numbered(self.requests.prompt_only(role))
        with tracing.current(self.span, "warm_up"):
            self._warm_up = PromptWarmUp(self.endpoints[role], request)

    async def aclose(self) -> None:
        """Close what is still open (a speculative hand-off to a turn that never came, the
        prompt's warm-up)."""
        await self.handoff.discard()
        if self._warm_up is not None:
            await self._warm_up.close()

    def result(self, finish_reason: FinishReason) -> RelayResult:
        reasoning, answer = split_reasoning(self.transcript, self.config.markers, self.mode)
        tally, generated = self.tally, self.tally.generated
        large_share = tally.usage["large"].completion_tokens / generated if generated else 0.0
        switches = sum(1 for s in self.segments if s.model == "small" and s.phase == "reasoning")
        return RelayResult(
            generation_id=self.id,
            text=self.transcript,
            reasoning=reasoning,
            answer=answer,
            finish_reason=finish_reason,
            segments=list(self.segments),
            usage={role: usage.model_copy() for role, usage in tally.usage.items()},
            stats=RelayStats(
                large_share=large_share,
                switches=switches,
                seconds=dict(tally.seconds),
                total_seconds=time.perf_counter() - self.started,
                time_to_first_token=self.visible.first_token_at,
                speculative_handoffs=self.handoff.used,
                speculative_misses=self.handoff.missed,
                resumes=tally.resumes,
                degraded=self.degraded,
                warm_up=self._warm_up.usage if self._warm_up else None,
            ),
        )


def _stopped_in(text: str, stops: Sequence[str]) -> tuple[str | None, str | None]:
    """How the server ended a request whose stream broke after `text`, if it did: at the
    first of its `stops` that `text` holds (the server ends at a stop, the stop's text kept),
    else (None, None)."""
    found = [(text.find(stop) + len(stop), stop) for stop in stops if stop and stop in text]
    if not found:
        return None, None
    return "stop", min(found)[1]
