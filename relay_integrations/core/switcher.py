"""The relay: one async state machine over a large and a small model.

Read :meth:`RelaySwitcher._relay` top to bottom for the method:

1. the large model reasons, stopping on a switch cue or on the end of reasoning;
2. after a cue, the small model finishes the sentence (or writes its segment cap), and hands
   back to the large model; it may not end the reasoning unless the policy lets it;
3. after the end of reasoning, the answer model (the small one by default) writes the answer.

Usage::

    async with RelaySwitcher(RelayConfig.from_env()) as relay:
        async for event in relay.stream([{"role": "user", "content": "What is 7 * 6?"}]):
            if isinstance(event, TextDelta):
                print(event.text, end="")          # tagged event.model, event.phase
            elif isinstance(event, RelayDone):
                print(event.result.stats)
        result = await relay.generate([{"role": "user", "content": "And 7 * 7?"}])
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from typing import Any, Literal

from .closing import AsyncClosing
from .config import CONTEXT_MARGIN, ModelRole, RelayConfig, RequestHook, SamplingConfig
from .cues import CueSet
from .endpoint import Endpoint, UpstreamFailure
from .errors import ContextOverflowError, CueArtifactError, EndpointError
from .final_event import final_event
from .generation import WRITE_ON, Anticipate, Generation, RequestEnd, TurnDecision
from .head_start import NextTurn
from .reasoning import PromptReasoning
from .rendering import ChatInput, Message, PromptRenderer, RenderedPrompt, ServerChatTemplate
from .result import RelayDone, RelayEvent, RelayResult, SegmentDone, SegmentEnd
from .sentences import SENTENCE_STOPS, is_sentence_end, may_end_here

ROLES: tuple[ModelRole, ModelRole] = ("large", "small")
_State = Literal["large", "small", "answer", "done"]
_AFTER_LARGE: dict[SegmentEnd, _State] = {
    "cue": "small",
    "end_of_reasoning": "answer",
    "reasoning_budget": "answer",
}
_AFTER_SMALL: dict[SegmentEnd, _State] = {
    "length": "done",
    "end_of_reasoning": "answer",
    "reasoning_budget": "answer",
}


class RelaySwitcher(AsyncClosing):
    """Runs relay generations over two vLLM endpoints; one instance serves many at once."""

    def __init__(
        self,
        config: RelayConfig,
        *,
        cues: CueSet | None = None,
        renderer: PromptRenderer | None = None,
        endpoints: Mapping[ModelRole, Endpoint] | None = None,
    ) -> None:
        """`cues` (default: loaded from ``config.cues``), `renderer` (default: each server's
        own chat template) and `endpoints` (default: one :class:`Endpoint` per model of
        ``config``; pass your own to share them or to watch their requests with a
        :class:`~relay_integrations.core.observer.RequestObserver`). The switcher closes the
        endpoints it uses when it is closed."""
        self.config = config
        self.cues = cues if cues is not None else CueSet.load(config.cues)
        self.renderer: PromptRenderer = renderer or ServerChatTemplate()
        given = dict(endpoints or {})
        if any(key not in ROLES or e.role != key for key, e in given.items()):
            mapped = {key: e.role for key, e in given.items()}
            raise ValueError(f"endpoints map 'large' and 'small' to their own role, not {mapped}")
        self.endpoints: dict[ModelRole, Endpoint] = {
            role: given.get(role) or Endpoint(config.endpoint(role), role) for role in ROLES
        }

    async def aclose(self) -> None:
        await asyncio.gather(*(e.aclose() for e in self.endpoints.values()))

    async def generate(self, messages: Sequence[Message], **options: Any) -> RelayResult:
        """Run one generation to the end; options as for :meth:`stream`."""
        return (await final_event(self.stream(messages, **options), RelayDone)).result

    async def stream(
        self,
        messages: Sequence[Message],
        *,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        sampling: SamplingConfig | None = None,
        stop: Sequence[str] = (),
        answer_extra_body: Mapping[str, Any] | None = None,
        request_hook: RequestHook | None = None,
        extra_body: Mapping[str, Any] | None = None,
        generation_id: str | None = None,
    ) -> AsyncGenerator[RelayEvent, None]:
        """Stream one generation as events: text deltas, finished segments, then the result.

        ``stop`` sequences apply to the answer only. ``answer_extra_body`` adds vLLM fields to
        the answer's request (e.g. ``structured_outputs`` for a forced JSON answer).
        ``extra_body`` adds vLLM fields to every request of both models (the endpoints' own
        ``extra_body`` under them); ``request_hook`` adds fields to every request.
        ``generation_id`` (unique; default ``relay-<uuid>``) is sent upstream in the session
        header and, suffixed with a request number, as ``X-Request-Id``, so vLLM's logs name
        the generation. Raises :class:`EndpointError`, with the partial result, when an
        endpoint fails beyond what the policy absorbs.
        """
        chat = ChatInput(list(messages), tools, dict(chat_template_kwargs or {}))
        started = time.perf_counter()
        large, small = await asyncio.gather(
            self._prepare("large", chat), self._prepare("small", chat), return_exceptions=True
        )
        prepared: dict[ModelRole, tuple[RenderedPrompt, int | None]] = {}
        for role, outcome in zip(ROLES, (large, small), strict=True):
            if isinstance(outcome, UpstreamFailure):
                if role == "small" and self.config.policy.on_small_failure == "use_large":
                    continue  # unreachable small model: the large one writes everything
                raise EndpointError(role, outcome.detail, kind=outcome.kind) from outcome
            if isinstance(outcome, BaseException):
                raise outcome
            prepared[role] = outcome
        _check_fits(prepared)
        run = Generation(
            generation_id=generation_id or f"relay-{uuid.uuid4().hex}",
            config=self.config,
            endpoints=self.endpoints,
            prompts={role: prompt for role, (prompt, _) in prepared.items()},
            context_windows={role: window for role, (_, window) in prepared.items()},
            sampling=sampling or self.config.sampling,
            request_hook=request_hook,
            extra_body=extra_body or {},
            started=started,
        )
        run.small_available = "small" in prepared
        try:
            async for event in self._relay(run, stop, answer_extra_body or {}):
                yield event
        except UpstreamFailure as failure:
            partial = run.result("error")
            raise EndpointError(failure.role, failure.detail, partial, failure.kind) from failure
        finally:
            await run.aclose()

    async def _relay(
        self, run: Generation, stop: Sequence[str], answer_extra_body: Mapping[str, Any]
    ) -> AsyncIterator[RelayEvent]:
        """The method, one turn at a time."""
        policy = self.config.policy
        state: _State = "large" if run.phase == "reasoning" else "answer"
        finish: SegmentEnd = "stop"
        if state == "large" and run.small_available and policy.warm_small_prompt:
            run.warm_up("small")  # the config holds the two models on two servers
        while state != "done":
            if state == "large":
                async for delta in run.turn(
                    "large",
                    decide=self._after_large,
                    stops=lambda: self._large_stops(run),
                    anticipate=self._before_cue(run),
                ):
                    yield delta
                ended = run.segments[-1].ended_by
                if ended == "stop" and run.phase == "reasoning":
                    state = "answer"  # it ended without closing the reasoning: answer anyway
                else:
                    state = _AFTER_LARGE.get(ended, "done")
            elif state == "small":
                try:
                    async for delta in run.turn(
                        "small",
                        decide=self._after_small,
                        stops=lambda: self.reasoning_stops("small"),
                        cap=policy.max_small_tokens,
                        anticipate=self._before_sentence_end(run),
                    ):
                        yield delta
                    ended = run.segments[-1].ended_by
                except UpstreamFailure:
                    if policy.on_small_failure == "raise":
                        raise
                    run.small_available, ended = False, "failed"
                state = _AFTER_SMALL.get(ended, "large")
            else:
                role = self._answer_model(run)
                try:
                    async for delta in run.turn(
                        role,
                        decide=_after_answer,
                        stops=lambda: stop,
                        extra_body={"include_stop_str_in_output": False, **answer_extra_body},
                    ):
                        yield delta
                    ended, state = run.segments[-1].ended_by, "done"
                except UpstreamFailure:
                    if role == "large" or policy.on_small_failure == "raise":
                        raise
                    run.small_available, ended = False, "failed"
            if state == "answer" and run.phase == "reasoning":  # the reasoning is over
                if ended != "end_of_reasoning":
                    run.close_reasoning()  # the model did not write the marker: the relay does
                for delta in run.flush(run.segments[-1].model):
                    yield delta
                run.end_reasoning()
            finish = ended
            yield SegmentDone(run.segments[-1])
        for delta in run.flush(run.segments[-1].model):
            yield delta
        yield RelayDone(run.result("length" if finish == "length" else "stop"))

    def reasoning_stops(self, role: ModelRole) -> tuple[str, ...]:
        """The stop strings of `role`'s turns in the reasoning (the end of reasoning, then the
        cues or the sentence ends), most important first: a server that takes only a few gets
        the end of reasoning (the endpoint finds the others past its limit in the stream)."""
        if role == "small":
            return (self.config.markers.end, *SENTENCE_STOPS)
        return (self.config.markers.end, *self.cues.stop_strings)

    def _large_stops(self, run: Generation) -> tuple[str, ...]:
        if run.phase == "answer":  # the model answered without reasoning: no switching
            return ()
        if not run.small_available:
            return (self.config.markers.end,)
        return self.reasoning_stops("large")

    def _before_cue(self, run: Generation) -> Anticipate | None:
        """The small turn, when the large model's text ends one token short of a cue."""
        policy = self.config.policy
        if not policy.speculative_handoff:
            return None

        def anticipate(turn_tokens: int) -> NextTurn | None:
            if run.phase != "reasoning" or not run.small_available:
                return None
            if turn_tokens <= policy.cooldown_tokens:
                return None
            cue = self.cues.pending(run.transcript)
            if cue is None:
                return None
            cap = policy.max_small_tokens
            return NextTurn(
                "small", self.reasoning_stops("small"), cue.completion, cue.confirmed_by, cap
            )

        return anticipate

    def _before_sentence_end(self, run: Generation) -> Anticipate | None:
        """The large turn, when the small model's text ends in a likely sentence end."""
        if not self.config.policy.speculative_handoff:
            return None

        def anticipate(turn_tokens: int) -> NextTurn | None:
            if run.phase != "reasoning" or not may_end_here(run.transcript):
                return None
            return NextTurn("large", self._large_stops(run), "", " \n")

        return anticipate

    def _after_large(self, end: RequestEnd) -> TurnDecision:
        """A large request ended: at a cue (hand off at its hand-off point, unless it came
        within the cooldown), at the end of reasoning, at the budget, or at its own end."""
        if end.finish_reason == "length":
            return TurnDecision("length")
        if end.stop_reason == self.config.markers.end:
            return TurnDecision("end_of_reasoning")
        if not isinstance(end.stop_reason, str):
            return TurnDecision("stop")
        if end.phase != "reasoning":
            return WRITE_ON  # a cue fired in an answer written without reasoning: write on
        match = self.cues.match_stop(end.transcript, end.stop_reason)
        if match is None or end.turn_tokens <= self.config.policy.cooldown_tokens:
            return WRITE_ON  # not a cue here, or right after taking control: write on
        return TurnDecision("cue", cut=match.handoff, cue=match.cue)

    def _after_small(self, end: RequestEnd) -> TurnDecision:
        """A small request ended: at the end of reasoning (kept only if the policy lets the
        small model end it), at a sentence end (cut to a token boundary), or at its cap."""
        marker, transcript = self.config.markers.end, end.transcript
        if end.stop_reason == marker:
            if self.config.policy.small_may_end_reasoning:
                return TurnDecision("end_of_reasoning")
            return TurnDecision(
                "small_ended_reasoning", cut=len(transcript[: -len(marker)].rstrip())
            )
        if end.stop_reason in SENTENCE_STOPS:
            sentence_ended = is_sentence_end(transcript)
            # write on from a token boundary; "e.g. ", "3. " inside math, ...: the sentence goes on
            cut = len(transcript.rstrip()) if sentence_ended or end.stop_reason.strip() else None
            return TurnDecision("sentence_end" if sentence_ended else None, cut=cut)
        if end.finish_reason == "length":
            capped = end.turn_tokens >= self.config.policy.max_small_tokens
            return TurnDecision("segment_cap" if capped else "length")
        return TurnDecision("stop")  # end of sequence mid-reasoning: the large model decides

    def _answer_model(self, run: Generation) -> ModelRole:
        policy = self.config.policy
        role = (
            policy.no_reasoning_model if run.mode is PromptReasoning.CLOSED else policy.answer_model
        )
        return role if run.small_available else "large"

    async def _prepare(self, role: ModelRole, chat: ChatInput) -> tuple[RenderedPrompt, int | None]:
        """The model's prompt and context window; checks the cue set was made for this model."""
        endpoint = self.endpoints[role]
        info = await endpoint.model_info()  # fetched once per endpoint, then cached
        pair = self.cues.model_pair
        mismatch = pair.mismatch(role, info.id, info.root) if pair is not None else None
        if mismatch is not None and not self.config.allow_model_mismatch:
            raise CueArtifactError(
                self.cues.source,
                f"{mismatch}. Calibrate this pair (relaygen calibrate) or set "
                "allow_model_mismatch=True to use it anyway.",
            )
        return await self.renderer.render(endpoint, chat), info.max_model_len


def _after_answer(end: RequestEnd) -> TurnDecision:
    return TurnDecision("length" if end.finish_reason == "length" else "stop")


def _check_fits(prepared: Mapping[ModelRole, tuple[RenderedPrompt, int | None]]) -> None:
    """Refuse, before the first token, a prompt that leaves a model no room to write (both
    models are named, so the error says how far each is over)."""
    counts = {r: p.token_count for r, (p, w) in prepared.items() if p.token_count and w}
    windows = {r: w for r, (p, w) in prepared.items() if p.token_count and w}
    if any(counts[r] + CONTEXT_MARGIN >= windows[r] for r in counts):
        raise ContextOverflowError(counts, windows)
