"""The small model's prompt warmed at the start (``SwitchPolicy.warm_small_prompt``), against
two scripted servers, one a model (one server for both is refused: nothing to warm).

Proven on real vLLM in tests/integration/test_relay_real_vllm.py.
"""

import pytest
from pydantic import ValidationError

from relay_integrations.relay import (
    EndpointConfig,
    RelayConfig,
    RelayResult,
    RelaySwitcher,
    SwitchPolicy,
)
from relay_integrations.testing.qwen3_template import render_chat, tokenize
from relay_integrations.testing.scripted_vllm import Fault, ScriptedModel, ScriptedVLLM

TRACE = (
    "<think>\nLet me see. Therefore, the sum is 4. Then we go on. Now we check the sum. "
    "It is right.\n</think>\n\nThe answer is 4."
)
MESSAGES = [{"role": "system", "content": "Be careful. " * 40}, {"role": "user", "content": "2+2?"}]
PROMPT = render_chat(MESSAGES, True)


async def relay_once(warm: bool, small: ScriptedModel) -> RelayResult:
    """One generation; the large model writes a token every 5 ms, so the small model's first
    turn comes well after the warm-up has been sent."""
    large = ScriptedModel("large", TRACE, token_delay=0.005)
    async with ScriptedVLLM(large) as a, ScriptedVLLM(small) as b:
        config = RelayConfig(
            large=EndpointConfig(base_url=a.base_url, model="large"),
            small=EndpointConfig(base_url=b.base_url, model="small"),
            cues=["Therefore,", "Now"],
            policy=SwitchPolicy(warm_small_prompt=warm),
        )
        async with RelaySwitcher(config) as relay:
            return await relay.generate(MESSAGES)


def outcome(result: RelayResult) -> object:
    """What a caller sees of a generation but its prefix-cache hits and timing."""
    return (
        result.text,
        [(s.model, s.ended_by, s.text, s.usage.completion_tokens) for s in result.segments],
        {r: (u.requests, u.prompt_tokens, u.completion_tokens) for r, u in result.usage.items()},
    )


async def test_the_small_model_gets_its_prompt_first_and_its_first_turn_finds_it_cached() -> None:
    cold_small, warm_small = ScriptedModel("small", TRACE), ScriptedModel("small", TRACE)
    cold, warm = await relay_once(False, cold_small), await relay_once(True, warm_small)
    assert warm.text == TRACE and outcome(warm) == outcome(cold)
    # the warm-up: the bare prompt, one token, before any turn of the small model
    first = warm_small.requests[0]
    assert (first["prompt"], first["max_tokens"]) == (PROMPT, 1)
    assert len(warm_small.requests) == len(cold_small.requests) + 1
    prompt_tokens = len(tokenize(PROMPT))
    assert warm.stats.warm_up is not None
    assert (warm.stats.warm_up.prompt_tokens, warm.stats.warm_up.completion_tokens) == (
        prompt_tokens,
        1,
    )
    assert cold.stats.warm_up is None
    # the small model's first turn prefills only what the large one wrote (16-token blocks)
    first_small = next(s for s in warm.segments if s.model == "small")
    cold_first_small = next(s for s in cold.segments if s.model == "small")
    assert cold_first_small.usage.cached_tokens == 0
    assert first_small.usage.cached_tokens == prompt_tokens // 16 * 16


async def test_a_warm_up_that_fails_changes_nothing_else() -> None:
    """A refused warm-up (not retried) is dropped; the turns' requests go on as without it."""
    cold = await relay_once(False, ScriptedModel("small", TRACE))
    refused = ScriptedModel("small", TRACE, faults=[Fault(status=400)])
    warm = await relay_once(True, refused)
    assert outcome(warm) == outcome(cold) and warm.stats.warm_up is None


def test_it_is_off_by_default_and_refused_for_one_server_serving_both_models() -> None:
    """Off by default (it measured slower where the two servers share CPU cores); asked for
    where one server serves both models (one prefix cache, which the large model's first
    request fills with the prompt anyway), it could do nothing, so the config refuses it."""
    assert not SwitchPolicy().warm_small_prompt
    url = "http://127.0.0.1:8000/v1"
    with pytest.raises(ValidationError, match="warm_small_prompt needs the small model on a"):
        RelayConfig(
            large=EndpointConfig(base_url=url, model="large"),
            small=EndpointConfig(base_url=url + "/", model="small"),
            policy=SwitchPolicy(warm_small_prompt=True),
        )
