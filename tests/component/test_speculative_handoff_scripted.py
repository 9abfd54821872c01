"""The speculative hand-off (``SwitchPolicy.speculative_handoff``) against the scripted fake.

The next model's request goes out where the text reaches a hand-off that waits for its
confirming token, and is used only if it is the request the next turn would send; nothing
else about a generation changes. Proven on real vLLM in tests/integration/test_relay_real_vllm.
"""

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from relay_integrations.relay import (
    RelayResult,
    RelaySwitcher,
    SamplingConfig,
    TextDelta,
)
from relay_integrations.testing.qwen3_template import ASSISTANT
from relay_integrations.testing.scripted_vllm import ScriptedModel, ScriptedVLLM
from tests.fakes.relay_config import make_config

# " Therefore" waits for its comma, " Now" for " we", "e." for "g" (refuted: "e.g." goes on),
# "sum." for " It"
TRACE = (
    "<think>\nLet me see. Therefore, the sum is 4. Then we go on. Now we check e.g. the sum. "
    "It is right.\n</think>\n\nThe answer is 4."
)
MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]


def following(trace: str) -> Callable[[str, dict[str, Any]], str]:
    """The trace's rest, or its answer once the relay has closed the reasoning itself."""

    def respond(prompt: str, body: dict[str, Any]) -> str:
        generated = prompt.split(ASSISTANT, 1)[1]
        if trace.startswith(generated):
            return trace[len(generated) :]
        return trace[trace.index("</think>") + len("</think>") :]

    return respond


async def relay_once(
    trace: str, speculative: bool, max_tokens: int = 4096, chunk: int = 1, **policy: Any
) -> RelayResult:
    """One generation; `chunk`: tokens a streamed chunk carries."""
    large = ScriptedModel("large", trace, respond=following(trace), tokens_per_chunk=chunk)
    small = ScriptedModel("small", trace, respond=following(trace), tokens_per_chunk=chunk)
    async with (
        ScriptedVLLM(large, small) as server,
        RelaySwitcher(make_config(server, speculative_handoff=speculative, **policy)) as relay,
    ):
        return await relay.generate(MESSAGES, sampling=SamplingConfig(max_tokens=max_tokens))


def outcome(result: RelayResult) -> object:
    """Everything a caller sees of a generation but its timing and prefix-cache hits."""
    return (
        result.text,
        result.finish_reason,
        [
            (s.model, s.phase, s.ended_by, s.cue, s.text, s.usage.completion_tokens)
            for s in result.segments
        ],
        {r: (u.prompt_tokens, u.completion_tokens, u.requests) for r, u in result.usage.items()},
    )


async def test_the_generation_is_the_same_with_and_without_it() -> None:
    off, on = await relay_once(TRACE, False), await relay_once(TRACE, True)
    assert off.text == TRACE
    assert outcome(on) == outcome(off)
    # " Therefore" (its comma to come) -> small, " Now" -> small and "sum." -> large went out
    # ahead; "e." was refuted by "g"
    assert (on.stats.speculative_handoffs, on.stats.speculative_misses) == (3, 1)
    assert (off.stats.speculative_handoffs, off.stats.speculative_misses) == (0, 0)


async def test_a_chunk_of_several_tokens_does_not_make_the_request_opened_ahead_miss() -> None:
    """vLLM merges the tokens a client has not read yet into one chunk. The request opened
    ahead has the allowance the turn's would have only if the tokens written so far are
    counted, not the chunks (counted as one token a chunk, a request opened ahead asks for
    more tokens than the turn's, and is closed unused). With three tokens a chunk,
    "e." never ends a chunk, and the three hand-offs foreseen (" Therefore", " Now", "sum.")
    are all used."""
    off = await relay_once(TRACE, False, chunk=3)
    on = await relay_once(TRACE, True, chunk=3)
    assert off.text == TRACE and outcome(on) == outcome(off)
    assert (on.stats.speculative_handoffs, on.stats.speculative_misses) == (3, 0)


@pytest.mark.parametrize("max_tokens", range(24, 72, 3))
async def test_budgets_come_out_the_same(max_tokens: int) -> None:
    """The request opened ahead carries the allowance the turn would give it, or is not used."""
    off = await relay_once(TRACE, False, max_tokens, answer_reserve_tokens=4)
    on = await relay_once(TRACE, True, max_tokens, answer_reserve_tokens=4)
    assert outcome(on) == outcome(off)
    assert on.completion_tokens <= max_tokens


async def test_the_small_request_goes_out_while_the_large_model_writes_the_next_token() -> None:
    large = ScriptedModel("large", TRACE, token_delay=0.05)
    helper = ScriptedModel("helper", TRACE)
    large_busy: list[int] = []

    def respond(prompt: str, body: dict[str, object]) -> str:
        large_busy.append(large.active)
        return helper.continuation(prompt, body)

    small = ScriptedModel("small", TRACE, respond=respond)
    async with (
        ScriptedVLLM(large, small) as server,
        RelaySwitcher(make_config(server, speculative_handoff=True)) as relay,
    ):
        result = await relay.generate(MESSAGES)
    assert result.text == TRACE
    # the small model's requests after " Therefore" and " Now" go out while the large model
    # writes "," and " we"
    assert large_busy[:2] == [1, 1]


async def test_a_refuted_hand_off_closes_the_request_opened_for_it() -> None:
    trace = (
        "<think>\nLet us add the two. Now-a-days we add. Therefore, it is 4.\n</think>\n\nIt is 4."
    )
    large = ScriptedModel("large", trace, token_delay=0.05)
    small = ScriptedModel("small", trace, token_delay=0.05)  # still writing when closed
    async with (
        ScriptedVLLM(large, small) as server,
        RelaySwitcher(make_config(server, speculative_handoff=True)) as relay,
    ):
        result = await relay.generate(MESSAGES)
    assert result.text == trace
    assert [s.cue for s in result.segments if s.ended_by == "cue"] == ["Therefore,"]
    assert result.stats.speculative_misses == 1  # " Now" went on with "-"
    assert small.cut_short == 1 and small.active == 0
    assert result.usage["small"].requests == 2  # the sentence after "Therefore,", the answer


async def test_cancelling_closes_a_request_opened_ahead() -> None:
    large = ScriptedModel("large", TRACE, token_delay=0.2)  # " we" comes 0.2 s after " Now"
    small = ScriptedModel("small", TRACE, token_delay=0.05)
    async with (
        ScriptedVLLM(large, small) as server,
        RelaySwitcher(make_config(server, speculative_handoff=True)) as relay,
    ):
        said: list[str] = []

        async def consume() -> None:
            async for event in relay.stream(MESSAGES):
                if isinstance(event, TextDelta):
                    said.append(event.text)

        task = asyncio.create_task(consume())
        for _ in range(1000):
            if "".join(said).endswith(" Now") and small.active == 1:
                break
            await asyncio.sleep(0.01)
        assert "".join(said).endswith(" Now") and small.active == 1  # opened ahead
        assert large.active == 1  # the large model is writing " we"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(100):
            if large.active == small.active == 0:
                break
            await asyncio.sleep(0.01)
    assert large.active == small.active == 0
    assert small.cut_short >= 1 and large.cut_short == 1


async def test_past_the_context_bound_no_request_is_opened_ahead() -> None:
    """``speculative_handoff_max_tokens`` bounds the context a request opened ahead may carry:
    the hand-offs early in the generation go out ahead, those past the bound wait for their
    confirming token, and the generation is the same at every bound."""
    unbounded = await relay_once(TRACE, True, speculative_handoff_max_tokens=None)
    prompt = unbounded.segments[0].usage.prompt_tokens  # the large model's first request
    opened = []
    for bound in (1, prompt + 16, prompt + 24, prompt + 200):
        bounded = await relay_once(TRACE, True, speculative_handoff_max_tokens=bound)
        assert outcome(bounded) == outcome(unbounded)
        opened.append(bounded.stats.speculative_handoffs + bounded.stats.speculative_misses)
    # the prompt alone is past the first bound; " Therefore" within the second, " Now" too
    # within the third; every hand-off within the last ("e." refuted among them)
    assert opened == [0, 1, 2, 4]
    assert (unbounded.stats.speculative_handoffs, unbounded.stats.speculative_misses) == (3, 1)
