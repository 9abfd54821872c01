"""The relay on a large server with speculative decoding (vLLM's n-gram prompt lookup, up to
three drafted tokens a step): one engine step may emit several tokens, so a stop string can
fall inside a step's accepted tokens and a streamed chunk can carry several tokens. The relay
must give the same segments as on the plain server, end each turn where vLLM ends it, and
count the tokens vLLM counts.

vLLM's CPU build 0.32 kills its engine on the first sampled request when speculative
decoding is on (top-k/top-p of uninitialised memory, vllm-project/vllm#42638), so every
request here is greedy (temperature 0); GPU builds do not have this defect.
"""

from __future__ import annotations

import itertools

import pytest
from langchain_core.messages import AIMessageChunk

from relay_integrations.core import RelayResult, RelaySwitcher, SamplingConfig
from relay_integrations.core.completion import CompletionRequest, StreamPiece
from relay_integrations.core.config import ModelRole
from relay_integrations.core.endpoint import Endpoint
from relay_integrations.core.observer import ObservedEndpoint, RequestObserver
from relay_integrations.langchain import RelayChatModel
from relay_integrations.testing import forcing

from .conftest import Server, qwen_relay_fields, settled_metric
from .test_relay_real_vllm import qwen_config, run

pytestmark = [pytest.mark.vllm, pytest.mark.speculative]

# Repetitive, and in the prompt too: the n-gram drafter finds what comes next.
REASONING = (
    "We add one and one and one and one. Therefore, the sum is 12. Now we add one and one and "
    "one and one again. So the check holds."
)
TRACE = f"<think>\n{REASONING}\n</think>\n\nThe answer is 12."
MESSAGES = [{"role": "user", "content": f"Repeat after me: {REASONING} The answer is 12."}]
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
    config = qwen_config(large, small)
    large_endpoint = config.large.model_copy(update={"max_stop_strings": stop_limit})
    config = config.model_copy(update={"sampling": GREEDY, "large": large_endpoint})
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
    assert drafted.text == plain.text == TRACE
    assert segments(drafted) == segments(plain)
    assert [s.cue for s in drafted.segments if s.cue] == ["Therefore,", "Now", "So "]
    # steps of several tokens happened: drafted tokens the model accepted
    assert counted["vllm:spec_decode_num_accepted_tokens_total"] > 0, counted
    large = drafted.usage["large"]
    assert large.prompt_tokens == counted["vllm:prompt_tokens_total"]
    if stop_limit is None:  # every request ran to its stop: the relay counts what vLLM counts
        assert large.completion_tokens == counted["vllm:generation_tokens_total"]
    else:  # closed at stops found in the stream: vLLM may write a step more before it aborts
        assert large.cache_unreported == 3  # the three cues, each found in the stream
        assert 0 <= counted["vllm:generation_tokens_total"] - large.completion_tokens <= 4 * 3
    print(
        f"\naccepted drafted tokens: {counted['vllm:spec_decode_num_accepted_tokens_total']:g}; "
        f"chunks carrying several tokens: {chunks.multi_token_chunks()}, "
        f"{chunks.ended_in_multi_token_chunks()} of them with the stop; large-model tokens "
        f"{large.completion_tokens} (vLLM: {counted['vllm:generation_tokens_total']:g})"
    )


def test_langchain_streams_through_the_speculative_server(
    speculative: Server, qwen_small: Server
) -> None:
    fields = qwen_relay_fields(speculative, qwen_small, request_hook=forcing(TRACE))
    model = RelayChatModel(**{**fields, "cues": ["Therefore,", "Now", "So "], "temperature": 0})
    chunks = list(model.stream(MESSAGES))
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole += chunk
    assert isinstance(whole, AIMessageChunk)
    assert whole.content == "The answer is 12."
    assert whole.additional_kwargs["reasoning_content"] == REASONING
    assert whole.usage_metadata is not None and whole.usage_metadata["output_tokens"] > 0
    relay = whole.response_metadata["relay"]
    assert relay["switches"] == 3
