"""Upstream outages remembered (the endpoint's breaker), degradation to the large model alone,
and the resume budget, against scripted servers on their own ports (one stopped and started
again where it was)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from relay_integrations.relay import (
    EndpointConfig,
    EndpointError,
    RelayConfig,
    RelaySwitcher,
    SwitchPolicy,
)
from relay_integrations.testing.scripted_vllm import Fault, ScriptedModel, ScriptedVLLM
from relay_integrations.upstream.availability import ServerDown
from relay_integrations.upstream.endpoint import Endpoint, UpstreamFailure
from tests.component.test_switcher_scripted import CUES, MESSAGES, TRACE

RETRYING = "retrying in"  # the endpoint's log line before each retry


def pair_config(large: ScriptedVLLM, small_url: str, **policy: object) -> RelayConfig:
    # the small server's breaker opens at its first failed request here, so that the next
    # generation finds it known down (by default five in a row open it: test_breaker_rules)
    small = EndpointConfig(
        base_url=small_url, model="small", max_retries=1, probe_interval=0.05, failures_to_open=1
    )
    return RelayConfig(
        large=EndpointConfig(base_url=large.base_url, model="large", max_retries=0),
        small=small,
        cues=list(CUES.cues),
        policy=SwitchPolicy.model_validate(policy),
    )


def retries(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if RETRYING in r.getMessage()]


async def test_a_small_server_known_down_is_gone_around_at_once_and_probed_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    large = ScriptedVLLM(ScriptedModel("large", TRACE))
    small_model = ScriptedModel("small", TRACE)
    small = ScriptedVLLM(small_model)
    async with large, RelaySwitcher(pair_config(large, small.base_url)) as relay:
        async with small:
            planned = await relay.generate(MESSAGES)
        assert planned.stats.degraded is None and planned.usage["small"].completion_tokens > 0
        seen = len(small_model.requests)

        # the first generation after the outage finds it (its retry), and opens the breaker
        found = await relay.generate(MESSAGES)
        assert found.text == TRACE and {s.model for s in found.segments} == {"large"}
        assert found.stats.degraded is not None and "refused" in found.stats.degraded
        assert len(retries(caplog)) == 1
        assert relay.endpoints["small"].availability.down

        # while it is known down: no connection attempt, no retry wait, degraded at once
        caplog.clear()
        relay.endpoints["small"].availability.probe_interval = 60.0  # no probe in between
        gone_around = await relay.generate(MESSAGES)
        assert gone_around.text == TRACE and gone_around.stats.degraded is not None
        assert "known down" in gone_around.stats.degraded
        assert retries(caplog) == []
        assert gone_around.summary()["degraded"] == gone_around.stats.degraded

        # started again on its port: a probe brings it back, and the relay uses it again
        relay.endpoints["small"].availability.probe_interval = 0.05
        async with ScriptedVLLM(small_model, port=small.port):
            assert await relay.endpoints["small"].availability.wait_until_up(5.0)
            back = await relay.generate(MESSAGES)
    assert back.stats.degraded is None and back.usage["small"].completion_tokens > 0
    assert len(small_model.requests) > seen


async def test_with_the_raise_policy_a_small_server_known_down_fails_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    dead = ScriptedVLLM(ScriptedModel("small", TRACE))  # bound, never started: refuses
    async with ScriptedVLLM(ScriptedModel("large", TRACE)) as large:
        config = pair_config(large, dead.base_url, on_small_failure="raise")
        async with RelaySwitcher(config) as relay:
            with pytest.raises(EndpointError) as found:
                await relay.generate(MESSAGES)
            relay.endpoints["small"].availability.probe_interval = 60.0
            caplog.clear()
            with pytest.raises(EndpointError) as known:
                await relay.generate(MESSAGES)
    assert found.value.kind == "failed" and "refused" in found.value.reason
    assert known.value.kind == "unavailable"  # relaygen serve: 503 with Retry-After
    assert known.value.reason.startswith("known down for ")
    assert "refused the connection" in known.value.reason and "http" not in known.value.reason
    assert dead.base_url in str(known.value)  # the Python API names the URL
    assert retries(caplog) == []


def outage_config(large: ScriptedVLLM, **policy: object) -> RelayConfig:
    config = pair_config(large, large.base_url, cooldown_tokens=0, **policy)
    quick = config.large.model_copy(update={"probe_interval": 0.05})
    return config.model_copy(update={"large": quick})


async def test_a_large_server_out_mid_generation_is_waited_for_and_no_text_is_lost() -> None:
    """The large model's stream breaks, and its server answers 503 to the resume (a restart
    behind a router): the generation waits for a probe to find it up and goes on."""
    large = ScriptedModel("large", TRACE, faults=[Fault(cut_after=3), Fault(503)])
    async with (
        ScriptedVLLM(large, ScriptedModel("small", TRACE)) as server,
        RelaySwitcher(outage_config(server)) as relay,
    ):
        result = await relay.generate(MESSAGES)
        assert not relay.endpoints["large"].availability.down
    assert result.text == TRACE
    assert result.stats.resumes == 1 and result.stats.degraded is None


async def test_past_the_resume_budget_the_error_says_so_and_keeps_the_text() -> None:
    large = ScriptedModel("large", TRACE, faults=[Fault(cut_after=3), Fault(503)])
    async with (
        ScriptedVLLM(large, ScriptedModel("small", TRACE)) as server,
        RelaySwitcher(outage_config(server, resume_wait_seconds=0)) as relay,
    ):
        with pytest.raises(EndpointError) as caught:
            await relay.generate(MESSAGES)
    assert caught.value.role == "large"
    assert "did not come back within the 0 s of SwitchPolicy.resume_wait_seconds" in (
        caught.value.reason
    )
    assert caught.value.partial is not None
    assert caught.value.partial.text and TRACE.startswith(caught.value.partial.text)


async def test_a_generation_that_has_written_nothing_fails_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    large = ScriptedModel("large", TRACE, faults=[Fault(503)])
    async with (
        ScriptedVLLM(large, ScriptedModel("small", TRACE)) as server,
        RelaySwitcher(outage_config(server)) as relay,
    ):
        with pytest.raises(EndpointError) as caught:
            await relay.generate(MESSAGES)
    assert caught.value.kind == "failed" and caught.value.reason == "it answered 503: injected"
    assert not [r for r in caplog.records if "waiting up to" in r.getMessage()]


async def test_a_refused_probe_counts_like_a_request_and_an_answered_one_closes_it() -> None:
    """A probe counts towards the breaker like a request (here one failure opens it); while
    it is open, a probe is sent as its trial, once ``probe_interval`` has passed."""
    server = ScriptedVLLM(ScriptedModel("large", TRACE))  # bound, not started: refuses
    config = EndpointConfig(
        base_url=server.base_url, model="large", probe_interval=0.5, failures_to_open=1
    )
    endpoint = Endpoint(config, "large")
    try:
        assert (await endpoint.probe()).startswith("unreachable: it refused the connection")
        assert endpoint.availability.down
        with pytest.raises(UpstreamFailure) as caught:
            await endpoint.model_info()
        assert isinstance(caught.value.cause, ServerDown) and caught.value.kind == "unavailable"
        assert (await endpoint.probe()).startswith("unreachable: known down for ")
        async with ScriptedVLLM(ScriptedModel("large", TRACE), port=server.port):
            await asyncio.sleep(0.5)
            assert await endpoint.probe() == "ok"
            assert not endpoint.availability.down
            assert (await endpoint.model_info()).id == "large"
    finally:
        await endpoint.aclose()
