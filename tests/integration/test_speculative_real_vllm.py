"""The relay on a large server with speculative decoding (vLLM's n-gram prompt lookup, up to
three drafted tokens a step): one engine step may emit several tokens, so a stop string can
fall inside a step's accepted tokens and a streamed chunk can carry several tokens. The relay
must give the same segments as on the plain server, end each turn where vLLM ends it, and
count the tokens vLLM's usage reports. The chunk that carried each turn's stop shows where a
stop fell inside a step: its token count rose by more than one.

vLLM's CPU build 0.32 kills its engine on the first sampled request when speculative
decoding is on (top-k/top-p of uninitialised memory, vllm-project/vllm#42638), so every
request here is greedy (temperature 0); GPU builds do not have this defect.
"""

from __future__ import annotations

import itertools

import pytest
from langchain_core.messages import AIMessageChunk
from langchain_core.messages.ai import add_ai_message_chunks

from relay_integrations.langchain import RelayChatModel
from relay_integrations.relay import (
    EndpointConfig,
    RelayConfig,
    RelayResult,
    RelaySwitcher,
    SamplingConfig,
    SwitchPolicy,
)
from relay_integrations.testing import forcing
from relay_integrations.upstream.completion import CompletionRequest, StreamPiece
from relay_integrations.upstream.config import ModelRole
from relay_integrations.upstream.endpoint import Endpoint
from relay_integrations.upstream.observer import ObservedEndpoint, RequestObserver

from .conftest import Server, qwen_relay_fields, settled_metric
from .test_relay_real_vllm import run

pytestmark = [pytest.mark.vllm, pytest.mark.speculative]

# Digits, which the Qwen tokenizer always splits one by one, so the model's forced text has the
# tokens of the prompt that holds it too: the n-gram drafter finds what comes next, and the
# cue "5" (the stop " 5 ") falls inside steps of several tokens.
COUNT = "1 2 3 4 5 6 7."
REASONING = f"We count {COUNT} Then {COUNT} Then {COUNT}"
TRACE = f"<think>\n{REASONING}\n</think>\n\nThe answer is 7."
MESSAGES = [{"role": "user", "content": f"Count with me: {REASONING} The answer is 7."}]
GREEDY = SamplingConfig(max_tokens=512, temperature=0)
COUNTERS = (
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
)


class Chunks(RequestObserver):
    """The completion-token count the large server reported with each streamed piece."""

    def __init__(self) -> None:
        self.per_request: dict[int, list[tuple[str, int | None]]] = {}

    async def opened(self, endpoint: ObservedEndpoint, request: CompletionRequest) -> None:
        self.per_request[id(request)] = []

    def piece(
        self, endpoint: ObservedEndpoint, request: CompletionRequest, piece: StreamPiece
    ) -> None:
        if piece.text:
            self.per_request[id(request)].append((piece.text, piece.tokens))

    def multi_token_chunks(self) -> int:
        """Chunks that carried more than one token."""
        return sum(sum(b - a > 1 for a, b in itertools.pairwise(c)) for c in self._counts())

    def ended_in_multi_token_chunks(self) -> int:
        """Requests whose last chunk (the one with the stop) carried more than one token."""
        return sum(len(c) > 1 and c[-1] - c[-2] > 1 for c in self._counts())

    def _counts(self) -> list[list[int]]:
        return [
            [0, *(tokens for _, tokens in pieces if tokens is not None)]
            for pieces in self.per_request.values()
        ]


async def relayed(
    large: Server, small: Server, stop_limit: int | None
) -> tuple[RelayResult, dict[str, float], Chunks]:
    """A forced, greedy generation; its result, the large server's counters over it, and the
    token counts of the large model's chunks."""
    config = RelayConfig(
        large=EndpointConfig(
            base_url=large.url, model=large.large_model, max_stop_strings=stop_limit
        ),
        small=EndpointConfig(base_url=small.url, model=small.small_model),
        cues=["5"],
        sampling=GREEDY,
        policy=SwitchPolicy(cooldown_tokens=0),
    )
    before = {name: await settled_metric(large.root, name) for name in COUNTERS}
    chunks = Chunks()
    endpoints: dict[ModelRole, Endpoint] = {
        "large": Endpoint(config.large, "large", observer=chunks),
        "small": Endpoint(config.small, "small"),
    }
    async with RelaySwitcher(config, endpoints=endpoints) as relay:
        _, result = await run(relay, TRACE, messages=MESSAGES)
    after = {name: await settled_metric(large.root, name) for name in COUNTERS}
    return result, {name: after[name] - before[name] for name in COUNTERS}, chunks


def segments(result: RelayResult) -> list[tuple[str, str, str, str | None, str]]:
    return [(s.model, s.phase, s.ended_by, s.cue, s.text) for s in result.segments]


@pytest.mark.parametrize(
    "stop_limit",
    [None, 1],
    ids=["stop strings at the server", "stops found in the stream (a one-stop limit)"],
)
async def test_the_same_segments_as_without_speculation_and_vllms_token_counts(
    qwen_large: Server, qwen_small: Server, speculative: Server, stop_limit: int | None
) -> None:
    plain, _, _ = await relayed(qwen_large, qwen_small, stop_limit)
    drafted, counted, chunks = await relayed(speculative, qwen_small, stop_limit)
    assert drafted.text == plain.text == TRACE  # nothing lost or written twice
    assert segments(drafted) == segments(plain)
    assert [s.text for s in drafted.segments[:2]] == ["<think>\nWe count 1 2 3 4 5", " 6 7."]
    assert [s.cue for s in drafted.segments] == ["5", None] * 3 + [None, None]
    assert counted["vllm:spec_decode_num_accepted_tokens_total"] > 0, counted
    # the chunk that ended a turn at " 5 " carried several tokens: one engine step's
    assert chunks.ended_in_multi_token_chunks() >= 1, chunks.per_request
    large = drafted.usage["large"]
    assert large.prompt_tokens == counted["vllm:prompt_tokens_total"]
    if stop_limit is None:
        # vLLM's usage ends at the stop, as without speculation; its generated-token counter
        # also counts the step's tokens after the stop, which it dropped
        assert large.completion_tokens == plain.usage["large"].completion_tokens
        assert large.completion_tokens <= counted["vllm:generation_tokens_total"]
    else:  # closed at stops found in the stream: the usage of the chunk that held the stop
        assert large.cache_unreported == 3  # the three cues, each found in the stream
        # vLLM computes on past a stop until the close reaches it (a step or a few, by the
        # machine's load), but each request closed at its cue stopped short of writing the
        # rest of the reasoning, as it would have had the relay not closed it
        rest_of_reasoning = [
            sum(
                later.usage.completion_tokens
                for later in drafted.segments[i + 1 :]
                if later.phase == "reasoning"
            )
            for i, segment in enumerate(drafted.segments)
            if segment.model == "large" and segment.ended_by == "cue"
        ]
        past_stops = counted["vllm:generation_tokens_total"] - large.completion_tokens
        assert 0 <= past_stops < sum(rest_of_reasoning), (past_stops, rest_of_reasoning)
    print(
        f"\naccepted drafted tokens: {counted['vllm:spec_decode_num_accepted_tokens_total']:g}; "
        f"chunks of several tokens: {chunks.multi_token_chunks()}, "
        f"{chunks.ended_in_multi_token_chunks()} of them ending a turn; large-model tokens: "
        f"relay {large.completion_tokens}, vLLM's counter "
        f"{counted['vllm:generation_tokens_total']:g}"
    )


def test_langchain_streams_through_the_speculative_server(
    speculative: Server, qwen_small: Server
) -> None:
    fields = qwen_relay_fields(speculative, qwen_small, request_hook=forcing(TRACE))
    model = RelayChatModel(**{**fields, "cues": ["5"], "temperature": 0})
    chunks = list(model.stream(MESSAGES))
    assert all(isinstance(chunk, AIMessageChunk) for chunk in chunks)
    whole = add_ai_message_chunks(chunks[0], *chunks[1:])
    assert whole.content == "The answer is 7."
    assert whole.additional_kwargs["reasoning_content"] == REASONING
    assert whole.usage_metadata is not None and whole.usage_metadata["output_tokens"] > 0
    relay = whole.response_metadata["relay"]
    assert relay["switches"] == 3
