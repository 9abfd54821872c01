"""A caller's stop strings cut the answer where vLLM cuts it, however many there are and
whatever the server's cap on them: through RelayChatModel, RelayLLM and ``relaygen serve``,
streamed and not, on a scripted vLLM that takes 4 stop strings a request (a stock vLLM's
``VLLM_MAX_STOP_STRINGS``; the relay finds the others in the stream) and on one without a cap.

The answer is the text before the first stop string (the one that ends first; a tie goes to
the first in the list), a space before it kept, with ``finish_reason`` "stop". Nothing the
relay's process logs on the way is a warning of asyncio's (``socket.send() raised
exception.``: a transport written after its connection was lost).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from langchain_core.messages import AIMessageChunk
from llama_index.core.llms import ChatMessage

from relay_integrations.langchain import RelayChatModel
from relay_integrations.llama_index import RelayLLM
from relay_integrations.relay import EndpointConfig, RelayConfig
from relay_integrations.server import RelayServer, ServerSettings
from relay_integrations.testing.qwen3_template import ASSISTANT
from relay_integrations.testing.scripted_vllm import ScriptedModel, ScriptedVLLM, serving
from relay_integrations.upstream.endpoint import CompletionRequest, Endpoint, StreamPiece
from tests.fakes.relay_http import relay_http

ANSWER = "Paris is the capital of France. It has the Louvre, and the Seine runs through it."
TRACE = (
    "<think>\nThe capital of France is Paris. Therefore, it has the Louvre.\n</think>\n\n" + ANSWER
)
QUESTION = "Tell me about Paris."
STOPS = ["@@", " Seine", "~~", "Louvre", "It has", "##", "capital", "apit"]
"""The first n of these are a request's stops (n = 0..8): none, stops that never occur, stops
the server is given (past 4 it is not), one that ends first though it begins later ("apit"
completes inside the token " capital" before "capital" does), and stops that occur in the
reasoning too (they cut the answer only)."""
CASES = [
    (0, ANSWER),
    (1, ANSWER),
    (2, "Paris is the capital of France. It has the Louvre, and the"),
    (3, "Paris is the capital of France. It has the Louvre, and the"),
    (4, "Paris is the capital of France. It has the "),
    (5, "Paris is the capital of France. "),
    (6, "Paris is the capital of France. "),
    (7, "Paris is the "),
    (8, "Paris is the c"),
]
CAPS = [4, None]


@pytest.fixture(scope="module", params=CAPS, ids=["cap 4", "no cap"])
def upstream(request: pytest.FixtureRequest) -> Iterator[ScriptedVLLM]:
    cap = request.param
    models = (ScriptedModel(name, TRACE, max_stop_strings=cap) for name in ("large", "small"))
    with serving(ScriptedVLLM(*models)) as running:
        yield running


@pytest.fixture(autouse=True)
def no_asyncio_warnings(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """asyncio's warnings in this process (the relay, ``relaygen serve`` and the scripted
    server all run here): none, ``socket.send() raised exception.`` above all."""
    with caplog.at_level(logging.WARNING, logger="asyncio"):
        yield
    warnings = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert warnings == []


def relay_config(upstream: ScriptedVLLM) -> RelayConfig:
    return RelayConfig(
        large=EndpointConfig(base_url=upstream.base_url, model="large"),
        small=EndpointConfig(base_url=upstream.base_url, model="small"),
        cues=["Therefore,"],
    )


def adapter_fields(upstream: ScriptedVLLM) -> dict[str, Any]:
    base = upstream.base_url
    return {
        "large_url": base,
        "large_model": "large",
        "small_url": base,
        "small_model": "small",
        "cues": ["Therefore,"],
    }


def expected(stops: list[str], include: bool = False) -> str:
    """vLLM's rule over the answer's text: the stop string that ends first, the text before
    it (or up to its end, `include`)."""
    ends = [(ANSWER.find(s) + len(s), i) for i, s in enumerate(stops) if s in ANSWER]
    if not ends:
        return ANSWER
    end, index = min(ends)
    return ANSWER[: end if include else end - len(stops[index])]


@pytest.mark.parametrize(("count", "answer"), CASES)
def test_the_cases_are_vllms_rule(count: int, answer: str) -> None:
    assert expected(STOPS[:count]) == answer


@pytest.fixture(scope="module")
def served(upstream: ScriptedVLLM) -> Iterator[openai.OpenAI]:
    settings = ServerSettings(max_stop_strings=len(STOPS))
    with (
        relay_http(RelayServer(relay_config(upstream), settings)) as running,
        openai.OpenAI(base_url=running.base_url, api_key="x") as client,
    ):
        yield client


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(("count", "answer"), CASES)
def test_langchain_cuts_the_answer_where_vllm_cuts(
    upstream: ScriptedVLLM, count: int, answer: str, stream: bool
) -> None:
    model = RelayChatModel(**adapter_fields(upstream))
    stops = STOPS[:count]
    if stream:
        chunks = list(model.stream(QUESTION, stop=stops))
        message: Any = chunks[0]
        for chunk in chunks[1:]:
            message = message + chunk
        assert isinstance(message, AIMessageChunk)
    else:
        message = model.invoke(QUESTION, stop=stops)
    assert (message.content, message.response_metadata["finish_reason"]) == (answer, "stop")
    assert "Louvre" in message.additional_kwargs["reasoning_content"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(("count", "answer"), CASES)
def test_llama_index_cuts_the_answer_where_vllm_cuts(
    upstream: ScriptedVLLM, count: int, answer: str, stream: bool
) -> None:
    llm = RelayLLM(**adapter_fields(upstream))
    messages = [ChatMessage(role="user", content=QUESTION)]
    stops = STOPS[:count]
    if stream:
        responses = list(llm.stream_chat(messages, stop=stops))
        text = "".join(r.delta or "" for r in responses)
        assert responses[-1].message.content == text
        response = responses[-1]
    else:
        response = llm.chat(messages, stop=stops)
        text = response.message.content or ""
    assert (text, response.additional_kwargs["finish_reason"]) == (answer, "stop")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(("count", "answer"), CASES)
def test_relaygen_serve_cuts_the_answer_where_vllm_cuts(
    served: openai.OpenAI, count: int, answer: str, stream: bool
) -> None:
    messages: Any = [{"role": "user", "content": QUESTION}]
    stops = STOPS[:count] or None
    if stream:
        chunks = list(
            served.chat.completions.create(
                model="large", messages=messages, stop=stops, stream=True
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    else:
        completion = served.chat.completions.create(model="large", messages=messages, stop=stops)
        text, finish = (
            completion.choices[0].message.content or "",
            completion.choices[0].finish_reason,
        )
    assert (text, finish) == (answer, "stop")


@pytest.mark.parametrize("include", [False, True], ids=["stops left out", "stops kept"])
@pytest.mark.parametrize("count", range(len(STOPS) + 1))
async def test_the_stream_over_a_capped_server_is_the_stream_of_one_without_a_cap(
    count: int, include: bool
) -> None:
    """The pieces an endpoint passes on from a server that takes 4 stop strings are, one for
    one, what a server that takes them all streams for the same tokens (a possible start of
    a stop held back alike), and they end the same way."""
    capped = ScriptedModel("capped", ANSWER, max_stop_strings=4)
    uncapped = ScriptedModel("uncapped", ANSWER)
    request = CompletionRequest(
        ASSISTANT, 64, tuple(STOPS[:count]), extra_body={"include_stop_str_in_output": include}
    )

    async def stream(name: str) -> tuple[list[str], tuple[object, object]]:
        endpoint = Endpoint(EndpointConfig(base_url=upstream.base_url, model=name), "large")
        try:
            pieces: list[StreamPiece] = [p async for p in endpoint.stream_completion(request)]
        finally:
            await endpoint.aclose()
        last = [p for p in pieces if p.finish_reason is not None][-1]
        return [p.text for p in pieces if p.text], (last.finish_reason, last.stop_reason)

    async with ScriptedVLLM(capped, uncapped) as upstream:
        texts, end = await stream("uncapped")
        assert await stream("capped") == (texts, end)
    assert "".join(texts) == expected(STOPS[:count], include)
    if not include:  # the possible start of a stop left out was held back, not sent
        assert all(expected(STOPS[:count]).startswith(t) for t in itertools.accumulate(texts))
