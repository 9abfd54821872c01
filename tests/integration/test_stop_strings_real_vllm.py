"""A caller's 5-8 stop strings on a stock vLLM, which takes 4 a request: the relay sends 4 and
finds the others in the stream, and its answer is what vLLM's own ``/v1/chat/completions``
answers with all of them (the same model on a server that takes 1,024), at temperature 0:
the text before the stop that ends first, the space before it kept, finish reason "stop".
Through RelayChatModel, RelayLLM and ``relaygen serve`` (the ``openai`` SDK), streamed and
whole; nothing in the relay's process logs a warning of asyncio's on the way.

The reasoning is closed (``enable_thinking=false``), so the relay's answer is one request of
the model, and both sides constrain the answer to words with spaces (a random model's own
text has few), so that a stop after a space shows whether the space is kept.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

import openai
import pytest
from langchain_core.messages import AIMessageChunk
from llama_index.core.llms import ChatMessage

from relay_integrations.langchain import RelayChatModel
from relay_integrations.llama_index import RelayLLM
from relay_integrations.relay import EndpointConfig, RelayConfig
from relay_integrations.relay.config import Phase
from relay_integrations.server import RelayServer, ServerSettings
from relay_integrations.upstream.config import ModelRole
from tests.fakes.relay_http import relay_http

from .conftest import Server

pytestmark = pytest.mark.vllm

QUESTION = "Name a large museum in Paris."
WORDS = r"[a-z]{2,7}( [a-z]{2,7}){12,40}\."
NO_THINKING = {"enable_thinking": False}
MAX_TOKENS = 64
COUNTS = [5, 6, 7, 8]
SURFACES = ["RelayChatModel", "RelayLLM", "relaygen serve"]


def words(role: ModelRole, phase: Phase, transcript: str) -> Mapping[str, Any]:
    """The relay's request hook: the answer in words, as the reference's body asks."""
    return {"structured_outputs": {"regex": WORDS}}


@pytest.fixture(autouse=True)
def no_asyncio_warnings(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """``socket.send() raised exception.`` above all: a transport written after its
    connection was lost."""
    with caplog.at_level(logging.WARNING, logger="asyncio"):
        yield
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


def reference(uncapped: Server, stops: list[str]) -> tuple[str, str | None]:
    """vLLM's own chat endpoint on a server that takes every stop."""
    with openai.OpenAI(base_url=uncapped.url, api_key="x") as client:
        choice = client.chat.completions.create(
            model=uncapped.small_model,
            messages=[{"role": "user", "content": QUESTION}],
            max_tokens=MAX_TOKENS,
            temperature=0,
            stop=stops or None,
            extra_body={
                "chat_template_kwargs": NO_THINKING,
                "structured_outputs": {"regex": WORDS},
            },
        ).choices[0]
    return choice.message.content or "", choice.finish_reason


def stop_list(count: int, text: str) -> list[str]:
    """`count` stops: decoys the model never writes; the end of the last word (written last);
    the second word, which follows a space; and a piece inside it, which ends inside its
    token, with the word or before it (a tie goes to the first in the list: the word at odd
    counts, the piece at even ones). At 5, the word is the fourth stop, one the stock server
    is given; past that, every stop that cuts is found in the stream."""
    word = text[text.index(" ") + 1 :].split(" ")[0]
    piece, last = word[1:3], text.rstrip(".")[-4:]
    pair = [word, piece] if count % 2 else [piece, word]
    return [*(f"zq{n}x" for n in range(count - 3)), last, *pair]


def relay_fields(stock: Server) -> dict[str, Any]:
    return {
        "large_url": stock.url,
        "large_model": stock.large_model,
        "small_url": stock.url,
        "small_model": stock.small_model,
        "cues": ["Therefore,"],
        "request_hook": words,
        "temperature": 0.0,
        "max_tokens": MAX_TOKENS,
        "chat_template_kwargs": NO_THINKING,
    }


def relay_answer(
    stock: Server, surface: str, stops: list[str], stream: bool
) -> tuple[str, str | None]:
    if surface == "RelayChatModel":
        model = RelayChatModel(**relay_fields(stock))
        if not stream:
            message = model.invoke(QUESTION, stop=stops)
            return str(message.content), message.response_metadata["finish_reason"]
        chunks = list(model.stream(QUESTION, stop=stops))
        whole: Any = chunks[0]
        for chunk in chunks[1:]:
            whole = whole + chunk
        assert isinstance(whole, AIMessageChunk)
        return str(whole.content), whole.response_metadata["finish_reason"]
    if surface == "RelayLLM":
        llm = RelayLLM(**relay_fields(stock))
        messages = [ChatMessage(role="user", content=QUESTION)]
        if not stream:
            response = llm.chat(messages, stop=stops)
            return response.message.content or "", response.additional_kwargs["finish_reason"]
        responses = list(llm.stream_chat(messages, stop=stops))
        text = "".join(r.delta or "" for r in responses)
        return text, responses[-1].additional_kwargs["finish_reason"]
    config = RelayConfig(
        large=EndpointConfig(base_url=stock.url, model=stock.large_model),
        small=EndpointConfig(base_url=stock.url, model=stock.small_model),
        cues=["Therefore,"],
    )
    server = RelayServer(config, ServerSettings(max_stop_strings=8), request_hook=words)
    with (
        relay_http(server) as served,
        openai.OpenAI(base_url=served.base_url, api_key="x") as client,
    ):
        fields: Any = {
            "model": stock.large_model,
            "messages": [{"role": "user", "content": QUESTION}],
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "stop": stops,
            "extra_body": {"chat_template_kwargs": NO_THINKING},
        }
        if not stream:
            choice = client.chat.completions.create(**fields).choices[0]
            return choice.message.content or "", choice.finish_reason
        events = [c for c in client.chat.completions.create(**fields, stream=True) if c.choices]
        text = "".join(c.choices[0].delta.content or "" for c in events)
        return text, events[-1].choices[0].finish_reason


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("surface", SURFACES)
@pytest.mark.parametrize("count", COUNTS)
def test_stops_past_a_stock_servers_cap_cut_the_answer_as_vllm_does(
    stock: Server, qwen_small: Server, count: int, surface: str, stream: bool
) -> None:
    unstopped, _ = reference(qwen_small, [])
    stops = stop_list(count, unstopped)
    expected = reference(qwen_small, stops)
    assert expected[1] == "stop" and expected[0] != unstopped  # a stop cut it
    assert relay_answer(stock, surface, stops, stream) == expected
