"""The relay: one generation at a time walks the method's table of turns (:mod:`._turns`)
over a large and a small model.

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
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from typing import Any

from ..upstream import tracing
from ..upstream.config import MODEL_ROLES, ModelRole, SamplingConfig
from ..upstream.endpoint import Endpoint, UpstreamFailure
from ..upstream.rendering import (
    ChatInput,
    Message,
    PromptRenderer,
    RenderedIds,
    RenderedPrompt,
    ServerChatTemplate,
    TokenRenderer,
)
from ._generation import Generation
from ._spans import generation_attributes, generation_span
from ._turns import MethodTurns, Turn
from .closing import AsyncClosing
from .config import CONTEXT_MARGIN, RelayConfig, RequestHook
from .cues import CueSet
from .errors import ContextOverflowError, CueArtifactError, EndpointError
from .final_event import final_event
from .reasoning import PromptReasoning
from .request import RelayRequest
from .result import RelayDone, RelayEvent, RelayResult, SegmentDone, SegmentEnd


class RelaySwitcher(AsyncClosing):
    """Runs relay generations over two vLLM endpoints; one instance serves many at once."""

    def __init__(
        self,
        config: RelayConfig,
        *,
        cues: CueSet | None = None,
        renderer: PromptRenderer | None = None,
        endpoints: Mapping[ModelRole, Endpoint] | None = None,
        request_hook: RequestHook | None = None,
    ) -> None:
        """`cues` (default: loaded from ``config.cues``), `renderer` (default: each server's
        own chat template) and `endpoints` (default: one :class:`Endpoint` per model of
        ``config``; pass your own to share them or to watch their requests with a
        :class:`~relay_integrations.upstream.observer.RequestObserver`). The switcher closes the
        endpoints it uses when it is closed. `request_hook` adds fields to every request of
        every generation (tests and benchmarks force known outputs with
        :func:`relay_integrations.testing.forcing`)."""
        self.config = config
        self.request_hook = request_hook
        self.cues = cues if cues is not None else CueSet.load(config.cues)
        self.turns = MethodTurns(config, self.cues)
        self.renderer: PromptRenderer = renderer or ServerChatTemplate()
        renders_ids = isinstance(self.renderer, TokenRenderer)
        if config.prompt_path == "tokens" and not renders_ids:
            raise ValueError(
                f"prompt_path='tokens' needs a renderer that renders token ids (the servers' "
                f"own chat template, the default); {type(self.renderer).__name__} renders "
                "text. Use prompt_path='auto' or 'text' with it."
            )
        self.prompt_path = "tokens" if renders_ids and config.prompt_path != "text" else "text"
        """How this switcher's generations send their prompts (``config.prompt_path``
        resolved for its renderer)."""
        given = dict(endpoints or {})
        if any(key not in MODEL_ROLES or e.role != key for key, e in given.items()):
            mapped = {key: e.role for key, e in given.items()}
            raise ValueError(f"endpoints map 'large' and 'small' to their own role, not {mapped}")
        self.endpoints: dict[ModelRole, Endpoint] = {
            role: given.get(role) or Endpoint(config.endpoint(role), role) for role in MODEL_ROLES
        }

    async def aclose(self) -> None:
        await asyncio.gather(*(e.aclose() for e in self.endpoints.values()))

    async def generate(self, messages: Sequence[Message], **options: Any) -> RelayResult:
        """Run one generation to the end; options as for :meth:`stream`."""
        return (await final_event(self.stream(messages, **options), RelayDone)).result

    def stream(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        sampling: SamplingConfig | None = None,
        stop: Sequence[str] = (),
        answer_extra_body: Mapping[str, Any] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        generation_id: str | None = None,
    ) -> AsyncGenerator[RelayEvent, None]:
        """Stream one generation as events: text deltas, finished segments, then the result.

        ``stop`` sequences apply to the answer only. ``answer_extra_body`` adds vLLM fields to
        the answer's request (e.g. ``structured_outputs`` for a forced JSON answer).
        ``extra_body`` adds vLLM fields to every request of both models (the endpoints' own
        ``extra_body`` under them). ``generation_id`` (unique; default ``relay-<uuid>``) is
        sent upstream in the session header and, suffixed with a request number, as
        ``X-Request-Id``, so vLLM's logs name the generation. Raises :class:`EndpointError`,
        with the partial result, when an endpoint fails beyond what the policy absorbs.
        """
        request = RelayRequest(
            messages,
            tuple(tools or ()),
            dict(chat_template_kwargs or {}),
            sampling,
            tuple(stop),
            dict(answer_extra_body or {}),
            dict(extra_body or {}),
            generation_id,
        )
        return self.stream_request(request)

    async def stream_request(self, request: RelayRequest) -> AsyncGenerator[RelayEvent, None]:
        """:meth:`stream` for a generation asked as one value.

        The first token waits only for what it needs: the large model's first request goes
        out as soon as its own prompt is rendered, and the small model's prompt is rendered
        meanwhile; the generation is played (and a prompt that does not fit either window
        refused) once both are known."""
        tools = [dict(tool) for tool in request.tools] or None
        chat = ChatInput(list(request.messages), tools, dict(request.chat_template_kwargs))
        started = time.perf_counter()
        span = generation_span(self.config, request)
        failed: BaseException | None = None
        result: RelayResult | None = None
        closed = False
        with tracing.current(span):  # the renders' spans under the generation's
            small = asyncio.create_task(self._prepare("small", chat))
        try:
            with tracing.current(span):
                large = await self._prepare("large", chat)
        except BaseException as failure:
            await _settled(small)  # the large model's failure is the one to tell
            cancelled = isinstance(failure, (GeneratorExit, asyncio.CancelledError))
            tracing.finish(
                span,
                {"relay.closed_early": cancelled or None},
                failure=None if cancelled else failure,
            )
            if isinstance(failure, UpstreamFailure):
                raise EndpointError(
                    "large", failure.detail, kind=failure.kind, reason=failure.reason
                ) from failure
            raise
        run = Generation(
            request,
            config=self.config,
            turns=self.turns,
            endpoints=self.endpoints,
            prompts={"large": large[0]},
            mode=self._reasoning_of(large[0]),
            context_windows={"large": large[1]},
            request_hook=self.request_hook,
            started=started,
            span=span,
        )
        try:
            if _overflow({"large": large}) is None:
                run.open_first(self.turns.first(run))
            with tracing.current(span):
                await self._admit_small(run, large, small)
            async for event in self._relay(run):
                if isinstance(event, RelayDone):
                    result = event.result
                yield event
        except UpstreamFailure as failure:
            result = run.result("error")
            failed = EndpointError(
                failure.role, failure.detail, result, failure.kind, failure.reason
            )
            raise failed from failure
        except (GeneratorExit, asyncio.CancelledError):
            closed = True  # the caller stopped reading: no failure
            raise
        except BaseException as failure:
            failed = failure
            raise
        finally:
            await _settled(small)  # done by now, unless the caller left while it rendered
            await run.aclose()
            if span is not None:
                attributes = generation_attributes(request, result or run.result("error"))
                tracing.finish(span, {**attributes, "relay.closed_early": closed}, failed)

    async def _admit_small(
        self,
        run: Generation,
        large: tuple[RenderedPrompt | RenderedIds, int | None],
        rendering: asyncio.Task[tuple[RenderedPrompt | RenderedIds, int | None]],
    ) -> None:
        """Wait for the small model's prompt and give it to `run`, or degrade `run` when its
        server fails and the policy lets the large model write everything; refuse a prompt
        that leaves either model no room to write (both named)."""
        prepared: dict[ModelRole, tuple[RenderedPrompt | RenderedIds, int | None]]
        prepared = {"large": large}
        try:
            prepared["small"] = await rendering
        except UpstreamFailure as failure:
            if self.config.policy.on_small_failure != "use_large":
                raise EndpointError(
                    "small", failure.detail, kind=failure.kind, reason=failure.reason
                ) from failure
            # unreachable small model (at once while known down): the large one writes
            # everything
            run.degrade(f"the small model's server failed: {failure.reason}")
        overflow = _overflow(prepared)
        if overflow is not None:
            raise overflow
        if "small" in prepared:
            run.admit_small(*prepared["small"])

    async def _relay(self, run: Generation) -> AsyncIterator[RelayEvent]:
        """The method: walk the table of turns (:mod:`._turns`), one turn at a time."""
        turn: Turn | None = self.turns.first(run)
        warm = self.config.policy.warm_small_prompt and run.small_available
        if turn is self.turns.reason and warm:
            run.warm_up("small")  # its prompt is in its server's cache by its first turn
        finish: SegmentEnd = "stop"
        while turn is not None:
            async for event in run.play(turn):
                if isinstance(event, SegmentDone):
                    done = event
                else:
                    yield event
            turn, finish = self.turns.after(turn, done.segment, run), done.segment.ended_by
            if turn is self.turns.answer and run.phase == "reasoning":
                for delta in run.end_reasoning(marker_written=finish == "end_of_reasoning"):
                    yield delta
            yield done
        for delta in run.flush(run.segments[-1].model):
            yield delta
        yield RelayDone(run.result("length" if finish == "length" else "stop"))

    def reasoning_stops(self, role: ModelRole) -> tuple[str, ...]:
        """The stop strings of `role`'s turns in the reasoning (see
        :meth:`MethodTurns.reasoning_stops`)."""
        return self.turns.reasoning_stops(role)

    async def _prepare(
        self, role: ModelRole, chat: ChatInput
    ) -> tuple[RenderedPrompt | RenderedIds, int | None]:
        """The model's prompt (its ids on the token path) and context window; checks the cue
        set was made for this model."""
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
        if self.prompt_path == "tokens":
            assert isinstance(self.renderer, TokenRenderer)
            rendering = self.renderer.render_ids(endpoint, chat)
            if role == "large" and self._marker_key() not in _MARKER_IDS:  # beside the render
                ids, _MARKER_IDS[self._marker_key()] = await asyncio.gather(
                    rendering, self._tokenized_markers()
                )
                return ids, info.max_model_len
            return await rendering, info.max_model_len
        return await self.renderer.render(endpoint, chat), info.max_model_len

    def _reasoning_of(self, prompt: RenderedPrompt | RenderedIds) -> PromptReasoning:
        """How the large model's prompt leaves the reasoning."""
        if isinstance(prompt, RenderedPrompt):
            return PromptReasoning.of(prompt.text, self.config.markers)
        return PromptReasoning.of_ids(prompt.ids, *_MARKER_IDS[self._marker_key()])

    def _marker_key(self) -> tuple[str, str, str, str]:
        large, markers = self.config.large, self.config.markers
        return large.server_root, large.model, markers.start, markers.end

    async def _tokenized_markers(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        endpoint, markers = self.endpoints["large"], self.config.markers
        start, end = await asyncio.gather(
            endpoint.tokenize_text(markers.start), endpoint.tokenize_text(markers.end)
        )
        return tuple(start), tuple(end)


_MARKER_IDS: dict[tuple[str, str, str, str], tuple[tuple[int, ...], tuple[int, ...]]] = {}
"""The reasoning markers' ids in a served model's tokenizer (by server, model and markers),
learned with the first render of the process that needs them: relays made for each event
loop (a model called from ``asyncio.run`` after ``asyncio.run``) do not ask again."""


async def _settled(task: asyncio.Task[Any]) -> None:
    """`task` cancelled if it is still running, and its outcome, whatever it was, retrieved
    (a render nobody waits for any more)."""
    task.cancel()
    await asyncio.wait([task])
    if not task.cancelled():
        task.exception()


def _overflow(
    prepared: Mapping[ModelRole, tuple[RenderedPrompt | RenderedIds, int | None]],
) -> ContextOverflowError | None:
    """The error that refuses, before the first token, a prompt that leaves a model no room
    to write (the models `prepared` holds are named, so the error says how far each is
    over), or None."""
    counts = {r: p.token_count for r, (p, w) in prepared.items() if p.token_count and w}
    windows = {r: w for r, (p, w) in prepared.items() if p.token_count and w}
    if any(counts[r] + CONTEXT_MARGIN >= windows[r] for r in counts):
        return ContextOverflowError(counts, windows)
    return None
