"""Errors that name the fix: what a relay user reads when an upstream vLLM server cannot be
used (not up, a base URL without /v1, a wrong key, a refused field), against the scripted
fake server. The same messages are checked on real vLLM in tests/integration."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from relay_integrations.relay import (
    EndpointConfig,
    EndpointError,
    RelayConfig,
    RelayError,
    RelaySwitcher,
    SwitchPolicy,
)
from relay_integrations.server.generation import upstream_error
from relay_integrations.testing.scripted_vllm import Fault, ScriptedModel, ScriptedVLLM
from relay_integrations.upstream.endpoint import CompletionRequest, Endpoint, UpstreamFailure
from tests.fakes.ports import refusing_port
from tests.fakes.raw_http import Answer, RawHttp, Seen, json_answer

TRACE = "<think>\nLet me see. Therefore, it is 4.\n</think>\n\nThe answer is 4."
MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]


@pytest.fixture
def closed_port() -> Iterator[int]:
    with refusing_port() as port:
        yield port


def pair(large: EndpointConfig, small: EndpointConfig, **policy: object) -> RelayConfig:
    return RelayConfig(
        large=large, small=small, cues=["Therefore,"], policy=SwitchPolicy.model_validate(policy)
    )


async def failure(config: RelayConfig) -> EndpointError:
    async with RelaySwitcher(config) as relay:
        with pytest.raises(EndpointError) as caught:
            await relay.generate(MESSAGES)
    return caught.value


def models() -> tuple[ScriptedModel, ScriptedModel]:
    return ScriptedModel("large", TRACE), ScriptedModel("small", TRACE)


@pytest.mark.parametrize("role", ["large", "small"])
async def test_a_server_that_is_not_up_is_named_with_its_url_and_the_retries(
    closed_port: int, role: str
) -> None:
    down = f"http://127.0.0.1:{closed_port}/v1"
    async with ScriptedVLLM(*models()) as server:
        urls = {"large": server.base_url, "small": server.base_url, role: down}
        config = pair(
            EndpointConfig(base_url=urls["large"], model="large", max_retries=1),
            EndpointConfig(base_url=urls["small"], model="small", max_retries=1),
            on_small_failure="raise",  # else an unreachable small model is not an error
        )
        error = await failure(config)
    assert error.role == role and error.partial is None
    assert str(error).startswith(f"{role} endpoint: cannot reach {down} (connection refused; ")
    assert "2 attempts over " in str(error)  # max_retries=1: one retry after 0.5 s
    assert f"Check that the {role} vLLM server is up at that address." in str(error)
    # the type a caller branches on is the SDK's, as before: relaygen serve answers 502
    assert isinstance(error.__cause__, RelayError)
    assert isinstance(getattr(error.__cause__, "cause", None), openai.APIConnectionError)
    assert upstream_error(error).status == 502


async def test_a_host_name_that_does_not_resolve_is_named() -> None:
    async with ScriptedVLLM(*models()) as server:
        nowhere = "http://no-such-host.invalid:8000/v1"  # .invalid never resolves (RFC 2606)
        config = pair(
            EndpointConfig(base_url=nowhere, model="large", max_retries=0, connect_timeout=5),
            EndpointConfig(base_url=server.base_url, model="small"),
        )
        error = await failure(config)
    assert f"cannot reach {nowhere} (host name 'no-such-host.invalid' not found; 1 attempt)" in (
        str(error)
    )
    assert "Check that the large vLLM server is up at that address." in str(error)


async def test_a_base_url_without_v1_says_which_url_to_use() -> None:
    large, small = models()
    async with ScriptedVLLM(large, small) as server:
        root = server.base_url.removesuffix("/v1")
        for wrong in (root, root + "/", server.base_url + "/completions"):
            config = pair(
                EndpointConfig(base_url=wrong, model="large"),
                EndpointConfig(base_url=server.base_url, model="small"),
            )
            error = await failure(config)
            assert error.role == "large"
            assert f"/models answered 404 Not Found. The base URL {wrong} does not end in /v1" in (
                str(error)
            )
            assert f"use base_url='{server.base_url}'" in str(error)
            assert "attempt" not in str(error)  # a 404 is an answer: not retried
    assert large.requests == []


async def test_a_404_from_a_base_url_with_v1_gives_no_v1_hint() -> None:
    """vLLM answers a completion for a model it does not serve with a 404 too (the relay
    checks /v1/models first, so this is a model renamed since): the URL is not the problem."""
    async with ScriptedVLLM(*models()) as server:
        endpoint = Endpoint(EndpointConfig(base_url=server.base_url, model="renamed"), "large")
        request = CompletionRequest(prompt="Hi", max_tokens=8)
        with pytest.raises(UpstreamFailure) as caught:
            [piece async for piece in endpoint.stream_completion(request)]
        await endpoint.aclose()
    assert caught.value.detail == (
        f"POST {server.base_url}/completions answered 404 Not Found: model not found"
    )
    assert isinstance(caught.value.cause, openai.NotFoundError)


async def test_a_wrong_model_name_lists_the_served_models() -> None:
    async with ScriptedVLLM(*models()) as server:
        config = pair(
            EndpointConfig(base_url=server.base_url, model="nope"),
            EndpointConfig(base_url=server.base_url, model="small"),
        )
        async with RelaySwitcher(config) as relay:
            with pytest.raises(RelayError) as caught:
                await relay.generate(MESSAGES)
    assert str(caught.value) == (
        f"large endpoint {server.base_url} does not serve model 'nope'; "
        "it serves ['large', 'small']"
    )


async def test_a_missing_or_wrong_api_key_names_the_url_and_the_setting() -> None:
    async with ScriptedVLLM(*models(), api_key="secret") as server:
        small = EndpointConfig(base_url=server.base_url, model="small", api_key="secret")
        missing = await failure(
            pair(EndpointConfig(base_url=server.base_url, model="large"), small)
        )
        wrong = EndpointConfig(base_url=server.base_url, model="large", api_key="guess")
        wrong_key = await failure(pair(wrong, small))
        right = EndpointConfig(base_url=server.base_url, model="large", api_key="secret")
        async with RelaySwitcher(pair(right, small)) as relay:
            assert (await relay.generate(MESSAGES)).text == TRACE
    # vLLM's 401 says only "Unauthorized": not repeated after the status
    refused = f"large endpoint: GET {server.base_url}/models answered 401 Unauthorized"
    assert str(missing) == (
        f"{refused}. The large vLLM server wants an API key (--api-key): set api_key."
    )
    assert str(wrong_key) == (
        f"{refused}. Check api_key: it must be the --api-key the large vLLM server was started "
        "with."
    )
    assert "guess" not in str(wrong_key) and "secret" not in str(wrong_key)
    assert upstream_error(wrong_key).status == 502


async def test_a_refused_request_keeps_vllm_message_and_the_partial_result() -> None:
    large, small = models()
    large.faults.append(Fault(400))  # the scripted server's 400 says "injected"
    async with ScriptedVLLM(large, small) as server:
        config = pair(
            EndpointConfig(base_url=server.base_url, model="large"),
            EndpointConfig(base_url=server.base_url, model="small"),
        )
        error = await failure(config)
    assert str(error) == (
        f"large endpoint: POST {server.base_url}/completions answered 400 Bad Request: injected"
    )
    assert error.partial is not None and error.partial.finish_reason == "error"
    assert upstream_error(error).status == 400  # relaygen serve: the client's request


async def test_server_errors_after_retries_say_how_often_they_were_tried() -> None:
    large, small = models()
    large.faults.extend([Fault(503)] * 2)
    async with ScriptedVLLM(large, small) as server:
        config = pair(
            EndpointConfig(base_url=server.base_url, model="large", max_retries=1),
            EndpointConfig(base_url=server.base_url, model="small"),
        )
        error = await failure(config)
    assert f"POST {server.base_url}/completions answered 503 Service Unavailable: injected" in (
        str(error)
    )
    assert "(2 attempts over " in str(error)


async def test_a_stalled_server_is_told_from_one_that_is_not_up() -> None:
    large, small = models()
    large.faults.append(Fault(stall=2.0))
    async with ScriptedVLLM(large, small) as server:
        config = pair(
            EndpointConfig(
                base_url=server.base_url, model="large", max_retries=0, read_timeout=0.3
            ),
            EndpointConfig(base_url=server.base_url, model="small"),
        )
        error = await failure(config)
    assert str(error) == (
        f"large endpoint: {server.base_url} accepted the request but sent nothing for 0.3 s "
        "(1 attempt): the large vLLM server there is overloaded or stuck, or read_timeout is "
        "too short."
    )
    assert upstream_error(error).status == 504


@pytest.mark.parametrize(
    ("tokenize", "detokenize", "named"),
    [
        pytest.param({"count": 3}, {"prompt": "p"}, "tokens", id="tokenize without tokens"),
        pytest.param({"tokens": ["a"]}, {"prompt": "p"}, "tokens.0", id="tokens not ids"),
        pytest.param([1, 2], {"prompt": "p"}, "the body", id="tokenize answers a list"),
        # the text path's (and calibration's) render asks /detokenize for the prompt's text
        pytest.param({"tokens": [1]}, {"text": "p"}, "prompt", id="detokenize without prompt"),
    ],
)
async def test_a_json_answer_without_what_the_relay_reads_is_named(
    tokenize: object, detokenize: object, named: str
) -> None:
    """A server that answers 200 on /tokenize or /detokenize without the field the relay
    reads (not vLLM, or a gateway in between) is a RelayError naming the URL and the field,
    never a KeyError from inside the relay (which relaygen serve answered as an internal
    error)."""

    def script(request: Seen) -> Answer:
        if request.path == "/v1/models":
            return json_answer({"data": [{"id": "large"}, {"id": "small"}]})
        return json_answer(tokenize if request.path == "/tokenize" else detokenize)

    async with RawHttp(script) as server:
        config = pair(
            EndpointConfig(base_url=server.base_url, model="large", max_retries=0),
            EndpointConfig(base_url=server.base_url, model="small", max_retries=0),
        )
        path = "text" if named == "prompt" else "auto"
        async with RelaySwitcher(config.model_copy(update={"prompt_path": path})) as relay:
            with pytest.raises(RelayError) as caught:
                await relay.generate(MESSAGES)
    said = str(caught.value)
    assert f"127.0.0.1:{server.port}/" in said and named in said, said
    assert "not vLLM's answer" in said
