"""The switcher's state machine and its fault handling, against the scripted fake server.

Fast and deterministic; the same behaviours are proven on real vLLM in tests/integration.
"""

import asyncio
import time

import pytest

from relay_integrations.relay import (
    ContextOverflowError,
    CueSet,
    EndpointConfig,
    EndpointError,
    RelayDone,
    RelaySwitcher,
    SamplingConfig,
    SegmentDone,
    TextDelta,
)
from relay_integrations.relay.config import CONTEXT_MARGIN
from relay_integrations.testing.qwen3_template import render_chat, tokenize
from relay_integrations.testing.scripted_vllm import Fault, ScriptedModel, ScriptedVLLM
from tests.fakes.relay_config import make_config

TRACE = (
    "<think>\nLet me see. Therefore, the sum is 4. Then we go on. Now we check e.g. the sum. "
    "It is right.\n</think>\n\nThe answer is 4."
)
CUES = CueSet.from_list(["Therefore,", "Now"])
MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]


async def collect(switcher: RelaySwitcher, **options: object):
    events = [e async for e in switcher.stream(MESSAGES, **options)]  # type: ignore[arg-type]
    done = events[-1]
    assert isinstance(done, RelayDone)
    return events, done.result


async def test_segments_follow_the_method_and_text_is_the_trace(traced: bool) -> None:
    large, small = ScriptedModel("large", TRACE), ScriptedModel("small", TRACE)
    async with ScriptedVLLM(large, small) as server, RelaySwitcher(make_config(server)) as relay:
        events, result = await collect(relay)
    assert result.text == TRACE
    assert [(s.model, s.ended_by, s.cue) for s in result.segments] == [
        ("large", "cue", "Therefore,"),
        ("small", "sentence_end", None),
        ("large", "cue", "Now"),
        ("small", "sentence_end", None),  # not fooled by "e.g. ": two requests, one segment
        ("large", "end_of_reasoning", None),
        ("small", "stop", None),
    ]
    assert [s.text for s in result.segments[:4]] == [
        "<think>\nLet me see. Therefore,",
        " the sum is 4.",
        " Then we go on. Now",
        " we check e.g. the sum.",
    ]
    assert result.segments[3].usage.requests == 2
    assert result.reasoning == TRACE[len("<think>\n") : TRACE.index("\n</think>")]
    assert result.answer == "The answer is 4."
    assert result.finish_reason == "stop"
    assert result.stats.switches == 2
    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert "".join(d.text for d in deltas if d.phase == "reasoning") == result.reasoning
    assert "".join(d.text for d in deltas if d.phase == "answer") == result.answer
    assert {d.model for d in deltas if d.phase == "answer"} == {"small"}
    assert [e.segment for e in events if isinstance(e, SegmentDone)] == result.segments
    # the small model's requests continue after the cue, never after a dangling space
    assert all(not r["prompt"].endswith(" ") for r in small.requests)
    total = result.usage["large"].completion_tokens + result.usage["small"].completion_tokens
    assert result.stats.large_share == pytest.approx(
        result.usage["large"].completion_tokens / total
    )
    # rendered once per generation and model, not once per segment
    assert (large.renders, small.renders) == (1, 1)
    assert len(large.requests) == 3 and len(small.requests) == 4  # one false sentence end


async def test_every_request_of_a_generation_carries_its_session_header() -> None:
    large, small = ScriptedModel("large", TRACE), ScriptedModel("small", TRACE)
    async with ScriptedVLLM(large, small) as server, RelaySwitcher(make_config(server)) as relay:
        first = await relay.generate(MESSAGES)
        second = await relay.generate(MESSAGES)
    sessions = [h["x-session-id"] for h in large.headers + small.headers]
    assert set(sessions) == {first.generation_id, second.generation_id}
    assert sessions.count(first.generation_id) == len(sessions) // 2
    # vLLM's request id: the generation's id and the request's number, unique per request
    request_ids = [h["x-request-id"] for h in large.headers + small.headers]
    assert len(set(request_ids)) == len(request_ids)
    assert all(r.rsplit("-", 1)[0] in sessions for r in request_ids)


async def test_a_caller_chosen_generation_id_goes_upstream() -> None:
    large, small = ScriptedModel("large", TRACE), ScriptedModel("small", TRACE)
    async with ScriptedVLLM(large, small) as server, RelaySwitcher(make_config(server)) as relay:
        result = await relay.generate(MESSAGES, generation_id="chatcmpl-abc")
    assert result.generation_id == "chatcmpl-abc"
    assert {h["x-session-id"] for h in large.headers + small.headers} == {"chatcmpl-abc"}
    sent = [h["x-request-id"] for h in large.headers + small.headers]
    assert len(sent) == len(set(sent))  # one id a request
    assert all(i.startswith("chatcmpl-abc-") for i in sent)
    # 3 large + 4 small, and the one opened ahead at "e." (refuted by the "g" of "e.g.") if it
    # got out before it was closed
    misses = result.stats.speculative_misses
    assert misses == 1
    numbers = sorted(int(i.removeprefix("chatcmpl-abc-")) for i in sent)
    assert 7 <= len(numbers) <= 7 + misses and numbers[-1] <= 7 + misses


async def test_retries_honour_retry_after_then_succeed() -> None:
    large = ScriptedModel("large", TRACE, faults=[Fault(429, {"retry-after": "0.3"}), Fault(503)])
    small = ScriptedModel("small", TRACE)
    async with ScriptedVLLM(large, small) as server, RelaySwitcher(make_config(server)) as relay:
        started = time.perf_counter()
        result = await relay.generate(MESSAGES)
    assert time.perf_counter() - started >= 0.3 + 0.5  # Retry-After, then the backoff
    assert result.text == TRACE


async def test_stream_cut_mid_segment_resumes_from_the_accumulated_text() -> None:
    large = ScriptedModel("large", TRACE, faults=[Fault(cut_after=4)])
    small = ScriptedModel("small", TRACE, faults=[Fault(cut_after=2)])
    async with ScriptedVLLM(large, small) as server, RelaySwitcher(make_config(server)) as relay:
        result = await relay.generate(MESSAGES)
    assert result.text == TRACE
    assert result.segments[0].usage.requests == 2 and result.segments[1].usage.requests == 2
    # resumed after 4 tokens, less the newline that may begin a stop string ("\nTherefore,"),
    # which the resumed request writes again so that the server sees its stops whole
    assert large.requests[1]["prompt"].endswith("assistant\n<think>")


async def test_small_endpoint_failing_hands_the_rest_to_the_large_model() -> None:
    large = ScriptedModel("large", TRACE)
    small = ScriptedModel("small", TRACE, faults=[Fault(500)] * 3)
    async with ScriptedVLLM(large, small) as server, RelaySwitcher(make_config(server)) as relay:
        result = await relay.generate(MESSAGES)
    assert result.text == TRACE
    assert [(s.model, s.ended_by) for s in result.segments] == [
        ("large", "cue"),
        ("small", "failed"),
        ("large", "end_of_reasoning"),
        ("large", "stop"),
    ]
    assert result.usage["small"].completion_tokens == 0


async def test_small_endpoint_failing_with_raise_policy_keeps_the_partial_text() -> None:
    large = ScriptedModel("large", TRACE)
    small = ScriptedModel("small", TRACE, faults=[Fault(500)] * 3)
    async with ScriptedVLLM(large, small) as server:
        relay = RelaySwitcher(make_config(server, on_small_failure="raise"))
        with pytest.raises(EndpointError) as caught:
            await relay.generate(MESSAGES)
        await relay.aclose()
    assert caught.value.role == "small"
    assert caught.value.partial is not None
    assert caught.value.partial.text == "<think>\nLet me see. Therefore,"
    assert caught.value.partial.finish_reason == "error"


async def test_large_endpoint_failing_raises_with_partial_text() -> None:
    """With no time to wait for the large model's server (the resume budget: see
    test_outages_scripted.py), its 502s end the generation with the text so far."""
    large = ScriptedModel("large", TRACE, faults=[Fault()] + [Fault(502)] * 3)
    small = ScriptedModel("small", TRACE)
    config = make_config(server := ScriptedVLLM(large, small), resume_wait_seconds=0)
    async with server, RelaySwitcher(config) as relay:
        with pytest.raises(EndpointError, match="large endpoint") as caught:
            await relay.generate(MESSAGES)
    assert caught.value.partial is not None
    assert caught.value.partial.text == "<think>\nLet me see. Therefore, the sum is 4."


async def test_a_stream_broken_beyond_its_resumes_names_the_url_and_keeps_the_text() -> None:
    """The large model's stream cut after a few tokens, again and again: after the resumes the
    policy allows, the error names the server, the attempts and what to check, and the text
    written so far (including what the stream had not released yet) is in ``partial``."""
    # a token a request: no cut lands inside a cue (a resumed request would end at the cue)
    large = ScriptedModel("large", TRACE, faults=[Fault()] + [Fault(cut_after=1)] * 3)
    small = ScriptedModel("small", TRACE)
    async with ScriptedVLLM(large, small) as server:
        relay = RelaySwitcher(make_config(server, max_resumes=2, cooldown_tokens=0))
        streamed: list[str] = []
        with pytest.raises(EndpointError) as caught:
            async for event in relay.stream(MESSAGES):
                if isinstance(event, TextDelta):
                    streamed.append(event.text)
        await relay.aclose()
    message = str(caught.value)
    assert message.startswith(f"large endpoint: the stream from {server.base_url} broke")
    assert "3 times in one turn (the request and 2 resumes from the text so far" in message
    assert "Check the large vLLM server's log" in message and "max_resumes" in message
    partial = caught.value.partial
    assert partial is not None and partial.finish_reason == "error"
    # the first turn, the small model's sentence, then 3 tokens of the large model's second
    assert partial.text.startswith("<think>\nLet me see. Therefore, the sum is 4.")
    assert TRACE.startswith(partial.text) and len(partial.text) > len("".join(streamed)) > 0
    assert partial.reasoning.startswith("".join(streamed).strip())
    assert caught.value.kind == "failed"  # relaygen serve answers 502


async def test_budget_is_shared_by_all_segments() -> None:
    large, small = ScriptedModel("large", TRACE), ScriptedModel("small", TRACE)
    async with ScriptedVLLM(large, small) as server:
        no_reserve = make_config(server, answer_reserve_tokens=0)  # the reasoning may use it all
        async with RelaySwitcher(no_reserve) as relay:
            result = await relay.generate(MESSAGES, sampling=SamplingConfig(max_tokens=15))
    assert result.finish_reason == "length"
    assert result.completion_tokens == 15
    assert TRACE.startswith(result.text)


async def test_small_segment_cap_hands_back_mid_sentence() -> None:
    large, small = ScriptedModel("large", TRACE), ScriptedModel("small", TRACE)
    async with (
        ScriptedVLLM(large, small) as server,
        RelaySwitcher(make_config(server, max_small_tokens=2)) as relay,
    ):
        result = await relay.generate(MESSAGES)
    assert result.text == TRACE
    assert result.segments[1].ended_by == "segment_cap"
    assert result.segments[1].text == " the sum"


async def test_small_model_may_not_end_the_reasoning() -> None:
    trace = "<think>\nSo. Therefore, done. Ok.\n</think>\n\nAnswer."
    small_text = "<think>\nSo. Therefore, done</think>"

    def small_reply(prompt: str, body: object) -> str:
        generated = prompt.split("<|im_start|>assistant\n", 1)[1]
        if generated.endswith("Therefore,"):
            return small_text[len(generated) :]
        return trace[len(generated) :]

    large = ScriptedModel("large", trace)
    small = ScriptedModel("small", trace, respond=small_reply)
    async with ScriptedVLLM(large, small) as server, RelaySwitcher(make_config(server)) as relay:
        result = await relay.generate(MESSAGES)
    assert result.segments[1].ended_by == "small_ended_reasoning"
    assert "</think>" not in result.reasoning
    assert result.segments[2].model == "large"


async def test_thinking_disabled_lets_the_large_model_answer_alone() -> None:
    answer = "Now the answer is 4. Therefore, done."
    large, small = ScriptedModel("large", answer), ScriptedModel("small", answer)
    async with ScriptedVLLM(large, small) as server, RelaySwitcher(make_config(server)) as relay:
        events, result = await collect(relay, chat_template_kwargs={"enable_thinking": False})
    assert [(s.model, s.phase) for s in result.segments] == [("large", "answer")]
    assert result.answer == answer and result.reasoning == ""
    assert {e.phase for e in events if isinstance(e, TextDelta)} == {"answer"}
    assert small.requests == []


async def test_a_model_that_skips_reasoning_answers_without_switching() -> None:
    answer = "The sum is 4. Therefore, it is 4."
    large, small = ScriptedModel("large", answer), ScriptedModel("small", answer)
    async with ScriptedVLLM(large, small) as server, RelaySwitcher(make_config(server)) as relay:
        events, result = await collect(relay)
    assert result.answer == answer and result.reasoning == ""
    assert {e.phase for e in events if isinstance(e, TextDelta)} == {"answer"}
    assert small.requests == []


async def test_cancelling_a_generation_cancels_its_upstream_request() -> None:
    large = ScriptedModel("large", TRACE + " x" * 500, token_delay=0.02)
    small = ScriptedModel("small", TRACE)
    async with ScriptedVLLM(large, small) as server, RelaySwitcher(make_config(server)) as relay:
        task = asyncio.create_task(relay.generate(MESSAGES))
        while large.active == 0:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(100):
            if large.active == 0:
                break
            await asyncio.sleep(0.02)
        assert large.active == 0


async def test_concurrency_per_endpoint_is_bounded() -> None:
    large = ScriptedModel("large", TRACE, token_delay=0.002)
    small = ScriptedModel("small", TRACE, token_delay=0.002)
    peak = 0

    async def watch() -> None:
        nonlocal peak
        while True:
            peak = max(peak, large.active)
            await asyncio.sleep(0.001)

    async with ScriptedVLLM(large, small) as server:
        config = make_config(server).model_copy(
            update={
                "large": EndpointConfig(base_url=server.base_url, model="large", max_concurrency=3)
            }
        )
        async with RelaySwitcher(config) as relay:
            watcher = asyncio.create_task(watch())
            results = await asyncio.gather(*(relay.generate(MESSAGES) for _ in range(12)))
            watcher.cancel()
    assert all(r.text == TRACE for r in results)
    assert 1 <= peak <= 3


async def test_context_window_ends_the_generation_with_length() -> None:
    large = ScriptedModel("large", TRACE, max_model_len=60)
    small = ScriptedModel("small", TRACE, max_model_len=60)
    async with ScriptedVLLM(large, small) as server, RelaySwitcher(make_config(server)) as relay:
        result = await relay.generate(MESSAGES)
    prefix_tokens = len(tokenize(render_chat(MESSAGES)))  # 32
    assert result.finish_reason == "length"
    assert result.completion_tokens == 60 - prefix_tokens - CONTEXT_MARGIN
    assert [r["max_tokens"] for r in large.requests + small.requests] == [12, 2]


async def test_reasoning_limit_closes_the_reasoning_and_leaves_room_to_answer() -> None:
    def small_reply(prompt: str, body: object) -> str:
        if prompt.endswith("</think>"):
            return "\n\nThe answer is 4."
        return TRACE[len(prompt.split("<|im_start|>assistant\n", 1)[1]) :]

    large = ScriptedModel("large", TRACE)
    small = ScriptedModel("small", TRACE, respond=small_reply)
    async with (
        ScriptedVLLM(large, small) as server,
        RelaySwitcher(make_config(server, max_reasoning_tokens=14)) as relay,
    ):
        events, result = await collect(relay, sampling=SamplingConfig(max_tokens=40))
    assert (
        result.usage["large"].completion_tokens + result.segments[1].usage.completion_tokens == 14
    )
    assert result.segments[1].ended_by == "reasoning_budget"
    assert result.text.endswith(" the sum is 4\n</think>\n\nThe answer is 4.")
    assert result.reasoning == "Let me see. Therefore, the sum is 4"
    assert result.answer == "The answer is 4." and result.finish_reason == "stop"
    assert "".join(e.text for e in events if isinstance(e, TextDelta) and e.phase == "answer") == (
        "The answer is 4."
    )


async def test_reasoning_left_open_at_end_of_sequence_is_closed_and_answered() -> None:
    def small_reply(prompt: str, body: object) -> str:
        return "\n\nIt is 4." if prompt.endswith("</think>") else ""

    large = ScriptedModel("large", "<think>\nLet me add two and two.")
    small = ScriptedModel("small", "", respond=small_reply)
    async with ScriptedVLLM(large, small) as server, RelaySwitcher(make_config(server)) as relay:
        result = await relay.generate(MESSAGES)
    assert [(s.model, s.ended_by) for s in result.segments] == [
        ("large", "stop"),
        ("small", "stop"),
    ]
    assert result.text == "<think>\nLet me add two and two.\n</think>\n\nIt is 4."
    assert (result.reasoning, result.answer) == ("Let me add two and two.", "It is 4.")


@pytest.mark.parametrize("cap", [1, 4])
async def test_servers_that_take_few_stop_strings_give_the_same_relay(cap: int) -> None:
    """vLLM's default cap (4), and 1: the endpoints learn it from the first refusal, send the
    stops that fit and find the others (cues, sentence ends) in the stream, cutting the text
    where vLLM would have."""
    plain = [ScriptedModel("large", TRACE), ScriptedModel("small", TRACE)]
    capped = [ScriptedModel(m.name, TRACE, max_stop_strings=cap) for m in plain]
    results = []
    for large, small in (plain, capped):
        async with (
            ScriptedVLLM(large, small) as server,
            RelaySwitcher(make_config(server)) as relay,
        ):
            results.append(await relay.generate(MESSAGES))
            assert relay.endpoints["large"].stop_limit == large.max_stop_strings
            assert relay.endpoints["small"].stop_limit == small.max_stop_strings
    stock, limited = results
    assert [(s.model, s.ended_by, s.cue, s.text) for s in limited.segments] == [
        (s.model, s.ended_by, s.cue, s.text) for s in stock.segments
    ]
    assert limited.text == stock.text and limited.stats.switches == stock.stats.switches >= 2
    for full, model in zip(plain, capped, strict=True):
        refused, *sent = model.requests  # one refusal each: the limit is learned once
        assert len(refused["stop"]) > cap
        assert len(sent) == len(full.requests)
        for asked, got in zip(full.requests, sent, strict=True):
            assert got.get("stop") == ((asked.get("stop") or [])[:cap] or None)
            assert got["prompt"] == asked["prompt"]
    # the end of reasoning goes first; the rest was found in the stream
    assert all(b["stop"][0] == "</think>" for b in capped[0].requests[1:] if b.get("stop"))
    # usage of requests closed in the stream: tokens from the chunks, cached tokens unknown
    for role in ("large", "small"):
        assert limited.usage[role].completion_tokens == stock.usage[role].completion_tokens
    if cap == 1:  # every cue and sentence end was found in the stream
        assert limited.usage["large"].cache_unreported == 2  # the two cues
        assert limited.cached_tokens is None
    else:  # this trace's cues and sentence ends are among the first four: all server-side
        assert limited.cached_tokens == stock.cached_tokens


@pytest.mark.parametrize("policy", ["use_large", "raise"])
async def test_small_endpoint_down_from_the_start(policy: str) -> None:
    large, small = ScriptedModel("large", TRACE), ScriptedModel("small", TRACE)
    async with ScriptedVLLM(large, small) as server:
        config = make_config(server, on_small_failure=policy).model_copy(
            update={
                "small": EndpointConfig(
                    base_url="http://127.0.0.1:9/v1", model="small", max_retries=0
                )
            }
        )
        async with RelaySwitcher(config) as relay:
            if policy == "raise":
                with pytest.raises(EndpointError, match="small endpoint"):
                    await relay.generate(MESSAGES)
                return
            result = await relay.generate(MESSAGES)
    assert result.text == TRACE
    assert [(s.model, s.ended_by) for s in result.segments] == [
        ("large", "end_of_reasoning"),
        ("large", "stop"),
    ]


async def test_the_cooldown_holds_back_cues_but_never_the_end_of_reasoning() -> None:
    # After the first hand-back, " So" (a cue) comes at once: written on, no switch. After the
    # second, the reasoning ends at once: the end is seen (vLLM min_tokens would have hidden
    # it, and the large model would have answered inside the reasoning).
    trace = "<think>\nWe add. Therefore, it is 3. So we stop. Now it is 3.\n</think>\n\nIt is 3."
    cues = CueSet.from_list(["Therefore,", "So ", "Now"])
    large, small = ScriptedModel("large", trace), ScriptedModel("small", trace)
    async with ScriptedVLLM(large, small) as server:
        config = make_config(server, cooldown_tokens=5).model_copy(update={"cues": list(cues.cues)})
        async with RelaySwitcher(config, cues=cues) as relay:
            _, result = await collect(relay)
    assert result.text == trace
    assert [(s.model, s.ended_by, s.cue) for s in result.segments] == [
        ("large", "cue", "Therefore,"),
        ("small", "sentence_end", None),  # " it is 3."
        ("large", "cue", "Now"),  # " So" was within the cooldown: written on
        ("small", "sentence_end", None),  # " it is 3."
        ("large", "end_of_reasoning", None),  # "\n</think>" at once, inside the cooldown
        ("small", "stop", None),
    ]
    assert all("min_tokens" not in r for r in large.requests)


async def test_the_answer_reserve_closes_a_long_reasoning_and_leaves_room_to_answer() -> None:
    reasoning = " ".join(["We keep thinking about it."] * 30)
    trace = f"<think>\n{reasoning}\n</think>\n\nThe answer is 4."
    large, small = (
        ScriptedModel("large", trace),
        ScriptedModel("small", trace, respond=lambda p, b: "The answer is 4."),
    )
    async with ScriptedVLLM(large, small) as server:
        config = make_config(server, answer_reserve_tokens=12)
        config = config.model_copy(update={"sampling": SamplingConfig(max_tokens=60)})
        async with RelaySwitcher(config) as relay:
            _, result = await collect(relay)
    assert result.segments[0].ended_by == "reasoning_budget"
    assert result.reasoning_tokens == 60 - 12  # min(12, 60 // 4) kept for the answer
    assert result.answer == "The answer is 4."
    assert result.finish_reason == "stop"


async def test_a_model_answering_without_reasoning_may_use_the_answer_reserve() -> None:
    """The reserve holds back the reasoning only: an answer written straight away (no think
    block) gets the whole budget, though its first request was sized while reasoning."""
    answer = " ".join(["The answer keeps going."] * 40)
    large, small = ScriptedModel("large", answer), ScriptedModel("small", answer)
    async with ScriptedVLLM(large, small) as server:
        config = make_config(server, answer_reserve_tokens=12)
        config = config.model_copy(update={"sampling": SamplingConfig(max_tokens=60)})
        async with RelaySwitcher(config) as relay:
            _, result = await collect(relay)
    assert result.reasoning == "" and result.finish_reason == "length"
    assert result.usage["large"].completion_tokens == 60  # not 60 - 12
    assert [r["max_tokens"] for r in large.requests] == [48, 12]


async def test_a_prompt_over_a_window_is_refused_before_any_text() -> None:
    large = ScriptedModel("large", TRACE, max_model_len=4096)
    small = ScriptedModel("small", TRACE, max_model_len=24)  # the small window is the short one
    async with ScriptedVLLM(large, small) as server, RelaySwitcher(make_config(server)) as relay:
        with pytest.raises(ContextOverflowError, match="small model 32 tokens, window 24"):
            async for event in relay.stream(MESSAGES):
                raise AssertionError(f"nothing is shown of a refused prompt: {event}")
    # rendered (POST /tokenize), never sent to the small model; the large model's first
    # request went out while the small prompt rendered, and was closed
    assert not small.requests and len(large.requests) <= 1


async def test_a_prompt_over_the_large_window_is_never_sent() -> None:
    large = ScriptedModel("large", TRACE, max_model_len=24)
    small = ScriptedModel("small", TRACE, max_model_len=24)
    async with ScriptedVLLM(large, small) as server, RelaySwitcher(make_config(server)) as relay:
        with pytest.raises(ContextOverflowError, match="large model 32 tokens, window 24"):
            await relay.generate(MESSAGES)
    assert not large.requests and not small.requests
