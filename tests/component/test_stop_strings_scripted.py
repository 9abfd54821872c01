"""A caller's stop strings cut the answer where vLLM cuts it, however many there are and
whatever the server's cap on them: through RelayChatModel, RelayLLM and ``relaygen serve``,
streamed and not, on a scripted vLLM that takes 4 stop strings a request (a stock vLLM's
``VLLM_MAX_STOP_STRINGS``; the relay finds the others in the stream) and on one without a cap.

The answer is the text before the first stop string (the one that ends first; a tie goes to
the first in the list), a space before it kept, with ``finish_reason`` "stop". Nothing in the
process logs a warning of asyncio's on the way (``socket.send() raised exception.``: a
transport written after its connection was lost, as when a server writes on to a stream the
relay closed at a stop it found in it).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
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
REASONING = "<think>\nThe capital of France is Paris. Therefore, it has the Louvre.\n</think>\n\n"
QUESTION = "Tell me about Paris."
DECOYS = ["@@", "~~", "##", "%%"]
"""Stops the text never holds."""
HITS = [" Seine", "Louvre", "It has", "capital", "apit"]
"""Stops it holds, each ending before the one before it; "apit" ends inside the token
" capital", before "capital" does, though it begins later. "capital" and "Louvre" are in the
reasoning too: they cut the answer only."""
ORDERS = {
    "decoys first": DECOYS + HITS,  # past 4, the stops that cut are the ones the server lacks
    "hits first": HITS + DECOYS,  # a stop the server has, and one past the cap that ends first
    "one hit first": [HITS[2], *DECOYS, *HITS[:2], *HITS[3:]],  # past 4, the server's still cuts
}
CASES = [
    pytest.param(stops[:count], id=f"{order}-{count}")
    for order, stops in ORDERS.items()
    for count in range(len(DECOYS) + len(HITS))
]
"""A request's stops: the first 0-8 of each order."""
SURFACES = ["RelayChatModel", "RelayLLM", "relaygen serve"]
LONG = " Its streets are old, and its bridges are many." * 150
"""What a long answer writes after its stops (~1,500 tokens, more than a socket's buffers
hold: a server that writes on after the relay closed the stream has that much to write)."""


def expected(stops: list[str], include: bool = False, answer: str = ANSWER) -> str:
    """vLLM's rule over the answer's text: the stop string that ends first (a tie: the first
    in the list), the text before it (or up to its end, `include`)."""
    ends = [(answer.find(s) + len(s), i) for i, s in enumerate(stops) if s in answer]
    if not ends:
        return answer
    end, index = min(ends)
    return answer[: end if include else end - len(stops[index])]


@pytest.mark.parametrize(
    ("stops", "answer"),
    [
        ([], ANSWER),
        (DECOYS, ANSWER),
        ([*DECOYS, " Seine"], "Paris is the capital of France. It has the Louvre, and the"),
        ([" Seine", "Louvre"], "Paris is the capital of France. It has the "),
        ([*HITS[:4], *DECOYS], "Paris is the "),
        ([*HITS, *DECOYS[:3]], "Paris is the c"),
    ],
)
def test_the_expected_answers_are_vllms_rule(stops: list[str], answer: str) -> None:
    assert expected(stops) == answer


# --- the servers ------------------------------------------------------------------------------


class Relay:
    """One scripted upstream pair, and the three surfaces over it."""

    def __init__(self, upstream: ScriptedVLLM) -> None:
        self.upstream = upstream
        base = upstream.base_url
        self.config = RelayConfig(
            large=EndpointConfig(base_url=base, model="large"),
            small=EndpointConfig(base_url=base, model="small"),
            cues=["Therefore,"],
        )
        self.fields: dict[str, Any] = {
            "large_url": base,
            "large_model": "large",
            "small_url": base,
            "small_model": "small",
            "cues": ["Therefore,"],
        }
        self.client: openai.OpenAI | None = None  # relaygen serve's, while it is served

    def answer(self, surface: str, stops: list[str], stream: bool) -> tuple[str, str | None]:
        """The answer's text and finish reason through `surface`."""
        if surface == "RelayChatModel":
            return self._langchain(stops, stream)
        if surface == "RelayLLM":
            return self._llama_index(stops, stream)
        return self._served(stops, stream)

    def _langchain(self, stops: list[str], stream: bool) -> tuple[str, str | None]:
        model = RelayChatModel(**self.fields)
        if stream:
            chunks = list(model.stream(QUESTION, stop=stops))
            message: Any = chunks[0]
            for chunk in chunks[1:]:
                message = message + chunk
            assert isinstance(message, AIMessageChunk)
        else:
            message = model.invoke(QUESTION, stop=stops)
        assert "Louvre" in message.additional_kwargs["reasoning_content"]
        return message.content, message.response_metadata["finish_reason"]

    def _llama_index(self, stops: list[str], stream: bool) -> tuple[str, str | None]:
        llm = RelayLLM(**self.fields)
        messages = [ChatMessage(role="user", content=QUESTION)]
        if stream:
            responses = list(llm.stream_chat(messages, stop=stops))
            text = "".join(r.delta or "" for r in responses)
            assert responses[-1].message.content == text
            return text, responses[-1].additional_kwargs["finish_reason"]
        response = llm.chat(messages, stop=stops)
        return response.message.content or "", response.additional_kwargs["finish_reason"]

    def _served(self, stops: list[str], stream: bool) -> tuple[str, str | None]:
        assert self.client is not None
        messages: Any = [{"role": "user", "content": QUESTION}]
        create = self.client.chat.completions.create
        if stream:
            streamed = create(model="large", messages=messages, stop=stops or None, stream=True)
            chunks = [c for c in streamed if c.choices]
            text = "".join(c.choices[0].delta.content or "" for c in chunks)
            return text, chunks[-1].choices[0].finish_reason
        choice = create(model="large", messages=messages, stop=stops or None).choices[0]
        return choice.message.content or "", choice.finish_reason


@contextmanager
def relay_over(answer: str, cap: int | None) -> Iterator[Relay]:
    """A relay over scripted models that reason, then write `answer`, and take `cap` stop
    strings a request; ``relaygen serve`` takes 8."""
    models = (
        ScriptedModel(n, REASONING + answer, max_stop_strings=cap) for n in ("large", "small")
    )
    with serving(ScriptedVLLM(*models)) as upstream:
        relay = Relay(upstream)
        settings = ServerSettings(max_stop_strings=len(DECOYS) + len(HITS))
        with (
            relay_http(RelayServer(relay.config, settings)) as served,
            openai.OpenAI(base_url=served.base_url, api_key="x") as relay.client,
        ):
            yield relay


@pytest.fixture(scope="module", params=[4, None], ids=["cap 4", "no cap"])
def relay(request: pytest.FixtureRequest) -> Iterator[Relay]:
    with relay_over(ANSWER, request.param) as running:
        yield running


@pytest.fixture(scope="module")
def long_relay() -> Iterator[Relay]:
    with relay_over(ANSWER + LONG, 4) as running:
        yield running


@pytest.fixture(autouse=True)
def no_asyncio_warnings(
    caplog: pytest.LogCaptureFixture, request: pytest.FixtureRequest
) -> Iterator[None]:
    """asyncio's warnings in this process (the relay, ``relaygen serve`` and the scripted
    server all run here), once the upstream's streams have ended: none, and above all not
    ``socket.send() raised exception.`` (a transport written after its connection was lost)."""
    with caplog.at_level(logging.WARNING, logger="asyncio"):
        yield
        for name in {"relay", "long_relay"} & set(request.fixturenames):
            models = request.getfixturevalue(name).upstream.models.values()
            deadline = time.monotonic() + 10
            while any(m.active for m in models) and time.monotonic() < deadline:
                time.sleep(0.01)
    warnings = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert warnings == []


# --- the answers ------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("surface", SURFACES)
@pytest.mark.parametrize("stops", CASES)
def test_the_answer_is_cut_where_vllm_cuts(
    relay: Relay, stops: list[str], surface: str, stream: bool
) -> None:
    assert relay.answer(surface, stops, stream) == (expected(stops), "stop")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("surface", SURFACES)
def test_a_stream_closed_at_a_stop_is_not_written_to_after(
    long_relay: Relay, surface: str, stream: bool
) -> None:
    """The relay closes the upstream's stream at " Seine", past the server's 4 stops, with
    some 1,500 tokens still to come: the server ends the request (vLLM aborts it) instead of
    writing them to the closed connection, and asyncio has nothing to warn of."""
    stops = [*DECOYS, " Seine"]
    small = long_relay.upstream.models["small"]
    closed = small.cut_short
    answer = ANSWER + LONG
    assert long_relay.answer(surface, stops, stream) == (expected(stops, answer=answer), "stop")
    deadline = time.monotonic() + 10
    while small.active and time.monotonic() < deadline:
        time.sleep(0.01)
    assert small.cut_short == closed + 1  # ended before its end, not written out


@pytest.mark.parametrize("include", [False, True], ids=["stops left out", "stops kept"])
@pytest.mark.parametrize("stops", CASES)
async def test_the_stream_over_a_capped_server_is_the_stream_of_one_without_a_cap(
    stops: list[str], include: bool
) -> None:
    """The pieces an endpoint passes on from a server that takes 4 stop strings are, one for
    one, what a server that takes them all streams for the same tokens (a possible start of
    a stop held back alike), and they end the same way."""
    capped = ScriptedModel("capped", ANSWER, max_stop_strings=4)
    uncapped = ScriptedModel("uncapped", ANSWER)
    request = CompletionRequest(
        ASSISTANT, 256, tuple(stops), extra_body={"include_stop_str_in_output": include}
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
    assert "".join(texts) == expected(stops, include)
    if not include:  # the possible start of a stop left out was held back, not sent
        assert all(expected(stops).startswith(t) for t in itertools.accumulate(texts))
