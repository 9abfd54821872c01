"""The request observer and the switcher's own endpoints, against the scripted fake server:
every request the switcher sends is seen opened, piece by piece and closed, including those
closed before their end; a failure's kind travels on EndpointError."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from relay_integrations.relay import (
    EndpointConfig,
    EndpointError,
    RelayConfig,
    RelaySwitcher,
    SwitchPolicy,
)
from relay_integrations.testing.scripted_vllm import Fault, ScriptedModel, ScriptedVLLM
from relay_integrations.upstream.config import MODEL_ROLES, ModelRole
from relay_integrations.upstream.endpoint import (
    CompletionRequest,
    Endpoint,
    StreamPiece,
    TokenPrompt,
)
from relay_integrations.upstream.observer import ObservedEndpoint, RequestObserver

TRACE = (
    "<think>\nLet me see. Therefore, the sum is 4. Then we go on. Now we check the sum. "
    "It is right.\n</think>\n\nThe answer is 4."
)
MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]


@dataclass
class Seen:
    role: str
    request: CompletionRequest
    text: str = ""
    events: list[str] = field(default_factory=list)


class Watching(RequestObserver):
    def __init__(self) -> None:
        self.seen: dict[str, Seen] = {}  # by X-Request-Id: unique per request sent

    async def opened(self, endpoint: ObservedEndpoint, request: CompletionRequest) -> None:
        self.seen[request.headers["X-Request-Id"]] = Seen(endpoint.role, request, events=["opened"])

    def piece(
        self, endpoint: ObservedEndpoint, request: CompletionRequest, piece: StreamPiece
    ) -> None:
        self.seen[request.headers["X-Request-Id"]].text += piece.text
        if self.seen[request.headers["X-Request-Id"]].events[-1] != "piece":
            self.seen[request.headers["X-Request-Id"]].events.append("piece")

    async def closed(
        self, endpoint: ObservedEndpoint, request: CompletionRequest, completed: bool
    ) -> None:
        self.seen[request.headers["X-Request-Id"]].events.append(
            "completed" if completed else "closed early"
        )


def config(server: ScriptedVLLM, **policy: object) -> RelayConfig:
    return RelayConfig(
        large=EndpointConfig(base_url=server.base_url, model="large", max_retries=0),
        small=EndpointConfig(base_url=server.base_url, model="small", max_retries=0),
        cues=["Therefore,", "Now"],
        policy=SwitchPolicy.model_validate(policy),
    )


def watched(relay_config: RelayConfig, observer: RequestObserver) -> dict[ModelRole, Endpoint]:
    return {
        role: Endpoint(relay_config.endpoint(role), role, observer=observer) for role in MODEL_ROLES
    }


async def test_the_observer_sees_every_request_and_what_it_returned() -> None:
    large, small = ScriptedModel("large", TRACE), ScriptedModel("small", TRACE)
    observer = Watching()
    async with ScriptedVLLM(large, small) as server:
        relay_config = config(server, speculative_handoff=False)
        endpoints = watched(relay_config, observer)
        async with RelaySwitcher(relay_config, endpoints=endpoints) as relay:
            assert relay.endpoints == endpoints  # the switcher uses the endpoints it was given
            result = await relay.generate(MESSAGES)
    seen = list(observer.seen.values())
    # one observed request per request the servers got, in the order sent
    assert [s.role for s in seen] == [s.model for s in result.segments]
    assert len(seen) == len(large.requests) + len(small.requests)
    # the requests as the relay made them: prompts of the model's own ids, then text no id
    # stood for yet, which the endpoint tokenized and sent as ids too
    prompts = [s.request.prompt for s in seen if s.role == "large"]
    for prompt, body in zip(prompts, large.requests, strict=True):
        assert isinstance(prompt, TokenPrompt)
        assert body["prompt_ids"][: len(prompt.ids)] == list(prompt.ids)
    assert all(s.events == ["opened", "piece", "completed"] for s in seen)
    # the pieces are those the switcher got: the transcript is their text, cut at hand-offs
    assert "".join(s.text for s in seen).startswith("<think>\nLet me see. Therefore,")
    assert result.text == TRACE


async def test_a_request_closed_before_its_end_is_seen_closed_early() -> None:
    # With the speculative hand-off, the large model's request after the small one's "4." is
    # opened ahead and used; after "e." of "e.g." it is opened ahead and closed unused. The
    # small model's tokens take long enough for a request opened ahead to go out; one closed
    # before it went out is counted as a miss but never seen (nothing was sent).
    trace = TRACE.replace("we check the sum.", "we check e.g. the sum.")
    large = ScriptedModel("large", trace)
    small = ScriptedModel("small", trace, token_delay=0.02)
    observer = Watching()
    async with ScriptedVLLM(large, small) as server:
        relay_config = config(server)
        async with RelaySwitcher(relay_config, endpoints=watched(relay_config, observer)) as relay:
            result = await relay.generate(MESSAGES)
    assert result.text == trace
    assert result.stats.speculative_handoffs >= 1 and result.stats.speculative_misses >= 1
    events = [s.events[-1] for s in observer.seen.values()]
    assert 1 <= events.count("closed early") <= result.stats.speculative_misses
    for role in ("large", "small"):
        completed = [
            s for s in observer.seen.values() if s.role == role and s.events[-1] == "completed"
        ]
        assert len(completed) == result.usage[role].requests
    assert all(s.events[0] == "opened" for s in observer.seen.values())


async def test_endpoints_must_be_mapped_to_their_own_role() -> None:
    async with ScriptedVLLM(ScriptedModel("large", TRACE), ScriptedModel("small", TRACE)) as server:
        relay_config = config(server)
        swapped: dict[ModelRole, Endpoint] = {"large": Endpoint(relay_config.small, "small")}
        with pytest.raises(ValueError, match="their own role"):
            RelaySwitcher(relay_config, endpoints=swapped)
        await swapped["large"].aclose()


@pytest.mark.parametrize(("status", "kind"), [(400, "rejected"), (500, "failed")])
async def test_an_upstream_failure_says_its_kind(status: int, kind: str) -> None:
    large = ScriptedModel("large", TRACE, faults=[Fault(status=status)])
    small = ScriptedModel("small", TRACE)
    async with ScriptedVLLM(large, small) as server, RelaySwitcher(config(server)) as relay:
        with pytest.raises(EndpointError) as failed:
            await relay.generate(MESSAGES)
    assert (failed.value.role, failed.value.kind) == ("large", kind)
    assert failed.value.partial is not None  # what was written before it is kept
