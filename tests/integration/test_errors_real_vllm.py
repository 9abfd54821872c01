"""Errors that name the fix, on the real vLLM test servers: a base URL without /v1, a server
that is not up, a refused field, a model the server does not serve. The messages are what vLLM
and the network really answer, not what the scripted fake imitates (tests/unit)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from relay_integrations.relay import (
    EndpointConfig,
    EndpointError,
    RelayConfig,
    RelaySwitcher,
    SamplingConfig,
)
from relay_integrations.relay.config import RequestHook
from relay_integrations.server.generation import upstream_error
from relay_integrations.upstream.endpoint import CompletionRequest, Endpoint, UpstreamFailure
from tests.fakes.ports import refusing_port

from .conftest import Server

pytestmark = pytest.mark.vllm

QUESTION = [{"role": "user", "content": "What is 5 + 7?"}]


@pytest.fixture
def closed_port() -> Iterator[int]:
    with refusing_port() as port:
        yield port


def relay_config(large: EndpointConfig, small: Server) -> RelayConfig:
    return RelayConfig(
        large=large,
        small=EndpointConfig(base_url=small.url, model=small.small_model),
        cues=["Therefore,"],
        sampling=SamplingConfig(max_tokens=16, seed=0),
    )


async def failure(config: RelayConfig, request_hook: RequestHook | None = None) -> EndpointError:
    async with RelaySwitcher(config, request_hook=request_hook) as relay:
        with pytest.raises(EndpointError) as caught:
            await relay.generate(QUESTION)
    return caught.value


async def test_a_base_url_without_v1_says_to_add_it(qwen_large: Server, qwen_small: Server) -> None:
    large = EndpointConfig(base_url=qwen_large.root, model=qwen_large.large_model)
    error = await failure(relay_config(large, qwen_small))
    assert error.role == "large"
    assert str(error) == (
        f"large endpoint: GET {qwen_large.root}/models answered 404 Not Found. The base URL "
        f"{qwen_large.root} does not end in /v1, where vLLM serves its OpenAI API: "
        f"use base_url='{qwen_large.url}'."
    )


async def test_a_server_that_is_not_up_is_named(qwen_small: Server, closed_port: int) -> None:
    down = f"http://127.0.0.1:{closed_port}/v1"
    large = EndpointConfig(base_url=down, model="qwen3-large", max_retries=1)
    error = await failure(relay_config(large, qwen_small))
    assert error.role == "large" and error.partial is None
    assert str(error).startswith(f"large endpoint: cannot reach {down} (connection refused; ")
    assert "2 attempts over " in str(error)
    assert str(error).endswith("Check that the large vLLM server is up at that address.")
    assert upstream_error(error).status == 502  # relaygen serve: a bad gateway, as before


async def test_a_refused_field_keeps_vllm_message_and_url(
    qwen_large: Server, qwen_small: Server
) -> None:
    large = EndpointConfig(base_url=qwen_large.url, model=qwen_large.large_model)
    error = await failure(
        relay_config(large, qwen_small), request_hook=lambda *_: {"min_tokens": -1}
    )
    assert str(error) == (
        f"large endpoint: POST {qwen_large.url}/completions answered 400 Bad Request: "
        "min_tokens must be greater than or equal to 0, got -1."
    )
    assert error.partial is not None and error.partial.finish_reason == "error"
    assert upstream_error(error).status == 400


async def test_a_model_renamed_on_a_v1_url_is_not_blamed_on_the_url(qwen_large: Server) -> None:
    """The relay checks /v1/models before it generates; a completion for a model the server
    does not serve (renamed since) is a 404 as well, with vLLM's own words and no /v1 hint."""
    endpoint = Endpoint(EndpointConfig(base_url=qwen_large.url, model="renamed"), "large")
    try:
        with pytest.raises(UpstreamFailure) as caught:
            request = CompletionRequest(prompt="Hi", max_tokens=4)
            [piece async for piece in endpoint.stream_completion(request)]
    finally:
        await endpoint.aclose()
    assert caught.value.detail.startswith(
        f"POST {qwen_large.url}/completions answered 404 Not Found: The model `renamed` does "
        "not exist."
    )
    assert "base_url" not in caught.value.detail
