"""One benchmark generation in one mode, graded: the record a results file keeps.

``large`` and ``small`` are each model alone, as a user would run it without the relay: one
``/v1/completions`` stream over the model's own chat-rendered prompt. ``relay`` is the relay.
All three are timed the same way, by the caller's clock, rendering included::

    record = await generate(switcher, "relay", problem, sample=0, sampling=sampling)
    record.correct, record.seconds, record.large_share
"""

from __future__ import annotations

import asyncio
import time
from typing import Literal

from pydantic import BaseModel, Field

from ..relay.config import CONTEXT_MARGIN
from ..relay.reasoning import PromptReasoning, split_reasoning
from ..relay.result import RelayResult
from ..relay.switcher import RelaySwitcher
from ..upstream.config import ModelRole, SamplingConfig
from ..upstream.endpoint import CompletionRequest
from ..upstream.errors import RelayError
from ..upstream.rendering import ChatInput
from .answers import grade
from .problems import Problem

Mode = Literal["large", "small", "relay"]
MODES: tuple[Mode, ...] = ("large", "small", "relay")


class BenchRecord(BaseModel):
    """One graded generation. ``error`` set: it failed, and a rerun tries it again."""

    mode: Mode
    problem_id: str
    sample: int
    correct: bool = False
    extracted: str | None = None
    answer: str = Field(default="", description="The text after the reasoning")
    finish_reason: str = "error"
    seconds: float = 0.0
    time_to_first_token: float | None = None
    large_share: float = 0.0
    switches: int = 0
    completion_tokens: dict[str, int] = Field(default_factory=dict, description="Per model")
    prompt_tokens: int = 0
    cached_tokens: int | None = Field(default=0, description="None: a server did not say")
    error: str | None = None

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.mode, self.problem_id, self.sample)


async def generate(
    switcher: RelaySwitcher,
    mode: Mode,
    problem: Problem,
    sample: int,
    sampling: SamplingConfig,
) -> BenchRecord:
    """Generate and grade one answer; a failure becomes a record with its error."""
    record = BenchRecord(mode=mode, problem_id=problem.id, sample=sample)
    started = time.perf_counter()
    try:
        if mode == "relay":
            result = await switcher.generate(problem.messages(), sampling=sampling)
            _fill_from_relay(record, result)
        else:
            await _solo(switcher, mode, problem, sampling, record, started)
    except RelayError as failed:
        record.error = f"{type(failed).__name__}: {failed}"
        return record
    record.seconds = time.perf_counter() - started
    # off the event loop: sympy may take a while, and other generations are being timed
    graded = await asyncio.to_thread(grade, record.answer, problem.answer, problem.letters)
    record.extracted, record.correct = graded.extracted, graded.correct
    return record


def _fill_from_relay(record: BenchRecord, result: RelayResult) -> None:
    record.answer = result.answer
    record.finish_reason = result.finish_reason
    record.time_to_first_token = result.stats.time_to_first_token
    record.large_share = result.stats.large_share
    record.switches = result.stats.switches
    record.completion_tokens = {r: u.completion_tokens for r, u in result.usage.items()}
    record.prompt_tokens = result.prompt_tokens
    record.cached_tokens = result.cached_tokens


async def _solo(
    switcher: RelaySwitcher,
    role: ModelRole,
    problem: Problem,
    sampling: SamplingConfig,
    record: BenchRecord,
    started: float,
) -> None:
    """The model alone: its rendered prompt, one completion to the end."""
    endpoint = switcher.endpoints[role]
    prompt = await switcher.renderer.render(endpoint, ChatInput(problem.messages()))
    window = (await endpoint.model_info()).max_model_len
    max_tokens = sampling.max_tokens
    if window is not None and prompt.token_count is not None:
        max_tokens = min(max_tokens, window - prompt.token_count - CONTEXT_MARGIN)
    hook = switcher.request_hook
    request = CompletionRequest(
        prompt=prompt.text,
        max_tokens=max_tokens,
        sampling=sampling.request_fields(switcher.config.endpoint(role).sampling),
        extra_body=dict(hook(role, "reasoning", "")) if hook else {},
    )
    text = ""
    async for piece in endpoint.stream_completion(request):
        if piece.text and record.time_to_first_token is None:
            record.time_to_first_token = time.perf_counter() - started
        text += piece.text
        if piece.finish_reason is not None:
            record.finish_reason = "length" if piece.finish_reason == "length" else "stop"
        if piece.completion_tokens is not None:
            record.completion_tokens = {role: piece.completion_tokens}
            record.prompt_tokens = piece.prompt_tokens or 0
            record.cached_tokens = piece.cached_tokens
    markers = switcher.config.markers
    record.answer = split_reasoning(text, markers, PromptReasoning.of(prompt.text, markers))[1]
    record.large_share = 1.0 if role == "large" else 0.0
