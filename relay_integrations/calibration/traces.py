"""Reasoning traces of the large model: written as they finish, so a stopped run resumes.

:class:`TraceFile` is a JSON Lines file of :class:`Trace` records. :func:`write_traces` has the
large endpoint write ``samples`` traces per problem, concurrently, appending each one the
moment it finishes; run it again on the same file and it writes only the missing ones::

    large = Endpoint(config.large, "large")
    traces = await write_traces(
        large, ServerChatTemplate(), ProblemSet.load("amc23.jsonl"),
        TraceFile("traces.jsonl"), samples=4, sampling=SamplingConfig(max_tokens=8192),
    )
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..jobs.concurrency import run_bounded
from ..jobs.datasets import DatasetError, ProblemSet, chat_messages, json_kind, text_sha256
from ..jobs.progress import Progress
from ..jobs.records import RecordFile
from ..relay.config import CONTEXT_MARGIN, ReasoningMarkers
from ..relay.reasoning import PromptReasoning, split_reasoning
from ..upstream.config import SamplingConfig, SamplingOverrides
from ..upstream.endpoint import CompletionRequest, Endpoint
from ..upstream.rendering import ChatInput, PromptRenderer

RequestFields = Callable[[int, int], Mapping[str, Any]]
"""Extra request fields for (problem index, sample); tests force planted traces with it."""


class Trace(BaseModel):
    """One reasoning trace: the chat it answers and the reasoning text (without markers)."""

    model_config = ConfigDict(extra="forbid")

    id: str
    messages: list[dict[str, Any]]
    reasoning: str
    problem_sha256: str | None = Field(default=None, description="Of the problem text")
    sample: int = 0
    finish_reason: str | None = None
    completion_tokens: int | None = None
    seconds: float | None = None


class TraceFile(RecordFile[Trace]):
    """A JSON Lines file of traces, appended to as traces finish."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(path, Trace, kind="trace")


def ready_traces(
    problems: ProblemSet, prompt_field: str = "prompt", reasoning_field: str = "reasoning"
) -> list[Trace]:
    """Traces someone already has: a prompt (text or chat messages) and its reasoning text on
    every line; a row that is not one fails with its file and line."""
    traces = []
    for index, row in enumerate(problems.rows):
        where = problems.where(index)
        messages = chat_messages(row[prompt_field], where)
        reasoning = row[reasoning_field]
        if not isinstance(reasoning, str):
            raise DatasetError(
                where, f"{reasoning_field!r} is {json_kind(reasoning)}: the reasoning must be text"
            )
        trace_id = row.get("id", index)
        if isinstance(trace_id, bool) or not isinstance(trace_id, str | int):
            raise DatasetError(where, f"'id' is {json_kind(trace_id)}: give text or a number")
        traces.append(Trace(id=str(trace_id), messages=messages, reasoning=reasoning))
    return traces


async def write_traces(
    endpoint: Endpoint,
    renderer: PromptRenderer,
    problems: ProblemSet,
    out: TraceFile,
    *,
    samples: int,
    sampling: SamplingConfig,
    markers: ReasoningMarkers | None = None,
    concurrency: int = 8,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    request_fields: RequestFields | None = None,
    progress: Progress | None = None,
) -> list[Trace]:
    """All ``samples`` traces of every problem: those in `out` already, plus the missing ones.

    A failing request stops the run with its error; every trace finished before it is in
    `out`, and the same call resumes from there.
    """
    markers = markers or ReasoningMarkers()
    # every problem checked before the first request, so a bad row costs no work
    chats = [
        chat_messages(row["problem"], problems.where(i)) for i, row in enumerate(problems.rows)
    ]
    done = {trace.id: trace for trace in out.read()}
    wanted = [(index, sample) for index in range(len(problems.rows)) for sample in range(samples)]
    for index, sample in wanted:
        old = done.get(_trace_id(index, sample))
        if old is not None and old.problem_sha256 != _problem_sha256(
            problems.rows[index]["problem"]
        ):
            raise DatasetError(
                str(out.path),
                f"trace {old.id} answers another problem than row {index + 1} of "
                f"{problems.path}; write the traces of this problem set to a new file",
            )
    missing = [(i, s) for i, s in wanted if _trace_id(i, s) not in done]
    if progress is not None and len(missing) < len(wanted):
        progress.advance(len(wanted) - len(missing), note=f"{len(wanted) - len(missing)} resumed")

    async def write(key: tuple[int, int]) -> None:
        index, sample = key
        extra = request_fields(index, sample) if request_fields else {}
        trace = await _trace(
            endpoint,
            renderer,
            problems.rows[index]["problem"],
            chats[index],
            index,
            sample,
            sampling,
            markers,
            chat_template_kwargs or {},
            extra,
        )
        out.append(trace)
        done[trace.id] = trace
        if progress is not None:
            progress.advance()

    await run_bounded(write, missing, concurrency)
    return [done[_trace_id(i, s)] for i, s in wanted]


async def _trace(
    endpoint: Endpoint,
    renderer: PromptRenderer,
    problem: Any,
    messages: list[dict[str, Any]],
    index: int,
    sample: int,
    sampling: SamplingConfig,
    markers: ReasoningMarkers,
    chat_template_kwargs: Mapping[str, Any],
    extra_body: Mapping[str, Any],
) -> Trace:
    started = time.monotonic()
    prompt = await renderer.render(endpoint, ChatInput(messages, None, dict(chat_template_kwargs)))
    mode = PromptReasoning.of(prompt.text, markers)
    if mode is PromptReasoning.CLOSED:
        raise DatasetError(
            f"problem {index + 1}",
            "the chat template closes the reasoning in the prompt; calibrate with thinking enabled",
        )
    max_tokens = sampling.max_tokens
    window = (await endpoint.model_info()).max_model_len
    if window is not None and prompt.token_count is not None:
        max_tokens = min(max_tokens, window - prompt.token_count - CONTEXT_MARGIN)
    request = CompletionRequest(
        prompt=prompt.text,
        max_tokens=max_tokens,
        stop=(markers.end,),
        sampling=_sample_fields(sampling, endpoint.config.sampling, sample),
        extra_body=extra_body,
    )
    text, finish, tokens = "", None, None
    async for piece in endpoint.stream_completion(request):
        text += piece.text
        finish = piece.finish_reason or finish
        tokens = piece.completion_tokens if piece.completion_tokens is not None else tokens
    reasoning, _ = split_reasoning(text, markers, mode)
    return Trace(
        id=_trace_id(index, sample),
        messages=messages,
        reasoning=reasoning,
        problem_sha256=_problem_sha256(problem),
        sample=sample,
        finish_reason=finish,
        completion_tokens=tokens,
        seconds=round(time.monotonic() - started, 3),
    )


def _problem_sha256(problem: Any) -> str:
    return text_sha256(problem if isinstance(problem, str) else json.dumps(problem, sort_keys=True))


def _trace_id(index: int, sample: int) -> str:
    return f"{index}/{sample}"


def _sample_fields(sampling: SamplingConfig, own: SamplingOverrides, sample: int) -> dict[str, Any]:
    """The request's sampling: the model's, with the seed shifted per sample (so that the
    samples of one problem differ and a rerun repeats them)."""
    fields = sampling.request_fields(own)
    if "seed" in fields:
        fields["seed"] += sample
    return fields
