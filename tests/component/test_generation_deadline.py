"""One recovery deadline per generation (``SwitchPolicy.deadline_seconds``), and streams that
break where a request had already ended, against scripted servers.

The invariant over every fault: the fault-free text, or a named error within the deadline,
with no more requests than the deadline allows.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from pydantic import ValidationError

from relay_integrations.relay import (
    DeadlineExceeded,
    EndpointError,
    RelayConfig,
    RelaySwitcher,
    SwitchPolicy,
)
from relay_integrations.testing.scripted_vllm import Fault, ScriptedModel, ScriptedVLLM
from relay_integrations.upstream.completion import CompletionRequest
from relay_integrations.upstream.deadline import Deadline, deadline_scope
from relay_integrations.upstream.endpoint import Endpoint, UpstreamFailure
from tests.component.test_switcher_scripted import MESSAGES, TRACE
from tests.fakes.relay_config import make_config

DEADLINE = 3.0
SLACK = 1.5  # a shared 2-core machine; the last attempt and the error after the deadline


def refusing(after: int = 1) -> list[Fault]:
    """A server whose completions answer 503 (Retry-After: 1) from its `after`+1-th on, while
    its /v1/models answers 200: a router in front of a replica that is restarting."""
    return [Fault()] * after + [Fault(503, {"retry-after": "1"})] * 1000


async def test_503s_with_retry_after_end_the_generation_at_its_deadline() -> None:
    """Every request after the first answers 503 with Retry-After: 1 while its probe answers
    200: the generation ends at its deadline with an error that says so, after a bounded
    number of requests (it went on for 400 s, 400 requests and more, counting only its
    breaker waits against resume_wait_seconds)."""
    large = ScriptedModel("large", TRACE, faults=refusing())
    small = ScriptedModel("small", TRACE)
    config = make_config(
        server := ScriptedVLLM(large, small),
        cooldown_tokens=0,
        deadline_seconds=DEADLINE,
        speculative_handoff=False,
    )
    quick = config.large.model_copy(update={"probe_interval": 0.05})
    config = config.model_copy(update={"large": quick})
    async with server, RelaySwitcher(config) as relay:
        started = time.monotonic()
        with pytest.raises(EndpointError) as caught:
            async with asyncio.timeout(DEADLINE * 4):  # today: on and on
                await relay.generate(MESSAGES)
        took = time.monotonic() - started
    assert took <= DEADLINE + SLACK
    message = str(caught.value)
    assert "ran out of its recovery deadline (SwitchPolicy.deadline_seconds=3 s" in message
    assert "retries after" in message and "s waiting for a server" in message
    assert "RELAY_POLICY__DEADLINE_SECONDS" in message and "answered 503" in message
    assert caught.value.role == "large" and "recovery deadline" in caught.value.reason
    assert isinstance(caught.value.__cause__, DeadlineExceeded)  # public: catch it by type
    partial = caught.value.partial
    assert partial is not None and partial.text and TRACE.startswith(partial.text)
    # a retry a second (Retry-After), and the last at the deadline: no more
    assert len(large.requests) <= 1 + DEADLINE + 2


@pytest.mark.parametrize("breaks", [True, False], ids=["streams-break", "servers-refuse"])
async def test_everything_counts_against_one_deadline(breaks: bool) -> None:
    """Resumes of broken streams and 503s alike spend the one deadline: a server that cuts
    every stream after a token and refuses in between cannot hold a generation past it."""
    cut = [Fault(cut_after=1), Fault(503, {"retry-after": "0.5"})] if breaks else []
    faults = [Fault()] + (cut * 500 if breaks else refusing(0))
    large = ScriptedModel("large", TRACE, faults=faults)
    small = ScriptedModel("small", TRACE)
    config = make_config(
        server := ScriptedVLLM(large, small),
        cooldown_tokens=0,
        max_resumes=1000,
        deadline_seconds=DEADLINE,
        speculative_handoff=False,
    )
    async with server, RelaySwitcher(config) as relay:
        started = time.monotonic()
        with pytest.raises(EndpointError, match="recovery deadline"):
            async with asyncio.timeout(DEADLINE * 4):
                await relay.generate(MESSAGES)
    assert time.monotonic() - started <= DEADLINE + SLACK


async def test_streams_that_stall_spend_the_deadline_while_they_stall() -> None:
    """A server whose every stream sends a token and then nothing, twice in each turn (each
    turn then ends: its resumes are within max_resumes): each stall's read timeout counts,
    so the generation ends at its deadline, not after a read timeout per stall of every
    turn."""
    read_timeout = 0.4
    stalling = [Fault(stall_after=1), Fault(stall_after=1), Fault()]
    large = ScriptedModel("large", TRACE, faults=[Fault()] + stalling * 50)
    small = ScriptedModel("small", TRACE)
    config = make_config(
        server := ScriptedVLLM(large, small),
        cooldown_tokens=0,
        deadline_seconds=1.0,
        speculative_handoff=False,
    )
    slow_to_tell = config.large.model_copy(update={"read_timeout": read_timeout})
    config = config.model_copy(update={"large": slow_to_tell})
    async with server, RelaySwitcher(config) as relay:
        started = time.monotonic()
        with pytest.raises(EndpointError, match="recovery deadline") as caught:
            async with asyncio.timeout(30):
                await relay.generate(MESSAGES)
    assert time.monotonic() - started <= 1.0 + read_timeout + SLACK
    assert "s of streams that stalled before they broke" in str(caught.value)
    assert len(large.requests) <= 1 + 1.0 / read_timeout + 2


async def test_the_deadline_stops_an_endpoints_retries_and_cuts_their_wait() -> None:
    """Under a deadline the endpoint waits no longer than is left (a Retry-After of 60 s is
    cut to it), and makes its last attempt at the deadline."""
    model = ScriptedModel("large", TRACE, faults=[Fault(503, {"retry-after": "60"})] * 10)
    async with ScriptedVLLM(model) as server:
        endpoint = Endpoint(make_config(server, max_retries=5).large, "large")
        deadline = Deadline(1.0)
        started = time.monotonic()
        pieces = endpoint.stream_completion(CompletionRequest(prompt="Hi", max_tokens=2))
        try:
            with pytest.raises(UpstreamFailure), deadline_scope(deadline):
                await anext(pieces)
        finally:
            await endpoint.aclose()
    assert time.monotonic() - started <= 1.0 + SLACK
    assert len(model.requests) == 2  # the first, and the one at the deadline
    assert deadline.retries == 1 and deadline.retry_wait == pytest.approx(1.0, abs=0.1)
    assert deadline.remaining() <= 0


def test_a_deadline_shorter_than_the_wait_it_bounds_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"deadline_seconds \(10\) is shorter than"):
        SwitchPolicy(deadline_seconds=10, resume_wait_seconds=30)
    assert SwitchPolicy().deadline == 120 + 60  # the wait for a restart, and a minute
    assert SwitchPolicy(resume_wait_seconds=300).deadline == 360
    assert SwitchPolicy(deadline_seconds=30).deadline == 30  # the waits within it
    environ = {"RELAY_LARGE__BASE_URL": "http://a/v1", "RELAY_LARGE__MODEL": "a"}
    environ |= {"RELAY_SMALL__BASE_URL": "http://b/v1", "RELAY_SMALL__MODEL": "b"}
    environ["RELAY_POLICY__DEADLINE_SECONDS"] = "45"
    assert RelayConfig.from_env(environ=environ).policy.deadline == 45


# --- streams that break where the request had ended -----------------------------------------


Cut = Callable[[str, dict[str, Any], dict[str, Any], str], bool]
"""Whether to drop the connection after this event: (model, request body, event, the text
of the request's events so far)."""


class CuttingVLLM(ScriptedVLLM):
    """The scripted pair, dropping the connection once, right after the first event `cut`
    picks (its events as vLLM's: a text chunk, the finish, the usage, ``[DONE]``)."""

    def __init__(self, *models: ScriptedModel, cut: Cut | None) -> None:
        super().__init__(*models)
        self.cut = cut

    async def _stream(
        self, model: ScriptedModel, body: dict[str, Any], fault: Fault
    ) -> AsyncIterator[str]:
        text = ""
        async for event in super()._stream(model, body, fault):
            yield event
            data = event.removeprefix("data: ").strip()
            if self.cut is None or data == "[DONE]":
                continue
            chunk = json.loads(data)
            text += _choice(chunk).get("text") or ""
            if self.cut(model.name, body, chunk, text):
                self.cut = None
                raise ConnectionResetError("injected cut")


def _choice(event: dict[str, Any]) -> dict[str, Any]:
    choices: list[dict[str, Any]] = event.get("choices") or [{}]
    return choices[0]


def _reasons_to_its_end(name: str, body: dict[str, Any]) -> bool:
    """The large model's request that writes the end of reasoning."""
    return name == "large" and "</think>" in (body.get("stop") or [])


END = "</think>"
CUTS: dict[str, tuple[str, Cut]] = {
    "after-the-end-of-reasoning-text": (
        "small",
        lambda name, body, event, text: _reasons_to_its_end(name, body) and text.endswith(END),
    ),
    "after-its-finish": (
        "small",
        lambda name, body, event, text: (
            _reasons_to_its_end(name, body) and _choice(event).get("stop_reason") == END
        ),
    ),
    "after-its-usage": (
        "small",
        lambda name, body, event, text: _reasons_to_its_end(name, body) and not event["choices"],
    ),
    "in-the-answers-first-piece": (
        "large",
        lambda name, body, event, text: body["prompt"].endswith(END) and bool(text),
    ),
}


@pytest.mark.parametrize("where", list(CUTS))
async def test_a_stream_cut_at_the_end_of_reasoning_gives_the_fault_free_text(where: str) -> None:
    """The large server's stream cut at the end of the reasoning (after the end marker, its
    finish or its usage: the request had ended) or in the answer's first piece: the text is
    the fault-free run's. A request that had ended used to be resumed: the model wrote the
    answer after the end marker in the reasoning's turn, and the relay then closed the
    reasoning after that answer ("...The answer is 4.\\n</think>"), a prompt the answer's
    server refused."""
    answer_model, cut = CUTS[where]
    texts = []
    for fault in (None, cut):
        large, small = ScriptedModel("large", TRACE), ScriptedModel("small", TRACE)
        server = CuttingVLLM(large, small, cut=fault)
        config = make_config(server, answer_model=answer_model, deadline_seconds=DEADLINE)
        async with server, RelaySwitcher(config) as relay, asyncio.timeout(DEADLINE * 4):
            result = await relay.generate(MESSAGES)
        texts.append(result.text)
        assert server.cut is None  # the cut happened
        prompts = [r["prompt"] for r in large.requests + small.requests]
        assert all(p.count(END) <= 1 for p in prompts)  # never closed twice
    assert texts[1] == texts[0] == TRACE
