"""A streamed completion ends whole or named: the server's text and finish reason, or an error
that names the URL and what was missing, never a truncated answer taken for a finished one.

The rule: a stream is whole with a piece carrying a finish reason, then ``[DONE]`` or a clean
end of its body. A stream that ends otherwise after sending text raises
:class:`StreamInterrupted` (the relay resumes from the text, and names the break once its
resumes are spent); before its first piece, a retryable connection error. A JSON error object
sent as the whole body (vLLM sends some of its errors so) is the server's error, of the SDK
class its code names. Against a raw server (:mod:`tests.fakes.raw_http`) that sends exactly
the bytes each case needs, and counts the POSTs it read: a request is written at most
``1 + max_retries`` times. Also: a stream of comments only is a stall (comments are not
events), and a ``Retry-After`` the client cannot read is ignored, not fatal.
"""

from __future__ import annotations

import asyncio
import email.utils
import itertools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import openai
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tenacity import RetryCallState

from relay_integrations.relay import (
    EndpointConfig,
    EndpointError,
    RelayConfig,
    RelaySwitcher,
    SwitchPolicy,
)
from relay_integrations.upstream import _http, sse
from relay_integrations.upstream import endpoint as endpoint_module
from relay_integrations.upstream._http import sdk_request
from relay_integrations.upstream.endpoint import (
    MAX_RETRY_AFTER,
    CompletionRequest,
    Endpoint,
    StreamInterrupted,
    UpstreamFailure,
)
from relay_integrations.upstream.rendering import ChatInput, RenderedPrompt
from tests.fakes.raw_http import (
    DONE,
    LAST_CHUNK,
    Answer,
    Framing,
    RawHttp,
    Seen,
    chunk,
    chunked,
    event,
    framed,
    json_answer,
    stream_head,
    text_chunk,
    usage_chunk,
)

REQUEST = CompletionRequest(prompt="Hi", max_tokens=16)


@dataclass
class Outcome:
    """How a stream ended for its reader: the text and finish reason it read, and the error
    that ended it (None: it ended whole)."""

    text: str = ""
    finish: str | None = None
    error: BaseException | None = None
    pieces: list[Any] = field(default_factory=list)


async def stream(server: RawHttp, **fields: Any) -> Outcome:
    """Read one streamed completion from `server` (no retries unless `fields` say)."""
    settings: dict[str, Any] = {"max_retries": 0, "read_timeout": 5.0} | fields
    endpoint = Endpoint(EndpointConfig(base_url=server.base_url, model="m", **settings), "large")
    outcome = Outcome()
    try:
        async with asyncio.timeout(20):
            async for piece in endpoint.stream_completion(REQUEST):
                outcome.pieces.append(piece)
                outcome.text += piece.text
                outcome.finish = piece.finish_reason or outcome.finish
    except (StreamInterrupted, UpstreamFailure) as error:
        outcome.error = error
    finally:
        await endpoint.aclose()
    return outcome


def always(*steps: bytes | float) -> Callable[[Seen], Answer]:
    """A script that answers every request with `steps`, then closes the connection."""
    return lambda request: Answer(*steps)


TWO_EVENTS = text_chunk("Hello") + text_chunk(" there")
ERROR_400 = {"error": {"message": "prompt is too long", "type": "BadRequestError", "code": 400}}
VLLM_ERROR = {"object": "error", "message": "bad stop", "type": "BadRequestError", "code": 400}


# --- streams that end before they are whole ------------------------------------------------------

BROKEN_AFTER_TEXT = [
    pytest.param(
        (stream_head("chunked"), chunked(TWO_EVENTS)),
        "ended without a finish reason",
        id="chunked body ends after two events with no finish reason",
    ),
    pytest.param(
        (stream_head("chunked"), chunked(TWO_EVENTS, DONE)),
        "ended without a finish reason",
        id="[DONE] after two events with no finish reason",
    ),
    pytest.param(
        (stream_head("close"), TWO_EVENTS + b'data: {"choices": [{"te'),
        "ended without a finish reason, in the middle of an event",
        id="close-delimited body cut in the middle of an event",
    ),
    pytest.param(
        (stream_head("close"), TWO_EVENTS + text_chunk("", "stop") + b'data: {"choi'),
        "ended without [DONE], in the middle of an event",
        id="cut in the middle of an event after the finish reason",
    ),
    pytest.param(
        (stream_head("chunked"), chunked(TWO_EVENTS)[:-5] + b'10\r\ndata: {"cho'),
        "was cut",
        id="chunked body cut in the middle of a chunk",
    ),
    pytest.param(
        (stream_head("chunked"), chunked(TWO_EVENTS + event(ERROR_400)[6:])),
        "sent an error object: prompt is too long",
        id="an error object after text, not in an event",
    ),
    pytest.param(
        (stream_head("chunked"), chunked(TWO_EVENTS + event(ERROR_400))),
        "sent an error event: prompt is too long",
        id="an error event after text",
    ),
]


@pytest.mark.parametrize(("steps", "said"), BROKEN_AFTER_TEXT)
async def test_a_stream_that_ends_before_it_is_whole_after_text_is_interrupted(
    steps: tuple[bytes, ...], said: str
) -> None:
    async with RawHttp(always(*steps)) as server:
        outcome = await stream(server)
    assert isinstance(outcome.error, StreamInterrupted), outcome
    assert outcome.error.text == "Hello there" == outcome.text
    assert said in str(outcome.error)
    assert f"127.0.0.1:{server.port}" in str(outcome.error)  # the URL is named
    assert server.posts == 1


BROKEN_BEFORE_TEXT = [
    pytest.param((stream_head("chunked"), chunked()), id="a body with no event"),
    pytest.param((stream_head("chunked"), chunked(DONE)), id="a body that is only [DONE]"),
    pytest.param(
        (stream_head("close"), b': ok\n\ndata: {"choi'), id="cut in the middle of the first event"
    ),
    pytest.param((stream_head("chunked"), b"10\r\ndata: {"), id="chunked body cut at once"),
]


@pytest.mark.parametrize("steps", BROKEN_BEFORE_TEXT)
async def test_a_stream_that_ends_before_its_first_piece_is_a_retried_connection_error(
    steps: tuple[bytes, ...],
) -> None:
    async with RawHttp(always(*steps)) as server:
        outcome = await stream(server, max_retries=1)
    assert isinstance(outcome.error, UpstreamFailure), outcome
    assert isinstance(outcome.error.cause, openai.APIConnectionError)
    assert "ended without a finish reason" in str(outcome.error) or "was cut" in str(outcome.error)
    assert f"127.0.0.1:{server.port}" in str(outcome.error)
    assert "2 attempts" in str(outcome.error) and server.posts == 2  # retried, once
    assert "cannot reach" not in str(outcome.error)  # it answered: not an outage


@pytest.mark.parametrize(
    ("steps", "lost"),
    [
        pytest.param(*BROKEN_BEFORE_TEXT[0].values, False, id="a body with no event"),
        pytest.param(*BROKEN_BEFORE_TEXT[1].values, False, id="a body that is only [DONE]"),
        pytest.param(*BROKEN_BEFORE_TEXT[2].values, True, id="cut in the first event"),
        pytest.param(*BROKEN_BEFORE_TEXT[3].values, True, id="chunked body cut at once"),
    ],
)
async def test_a_stream_that_falls_short_before_its_first_piece_is_an_outage_if_lost(
    steps: tuple[bytes, ...], lost: bool
) -> None:
    """A body that ended cleanly short of whole: the server answered, which a restart does not
    mend; the breaker that opens at the first outage stays closed, and the next request is
    sent. A connection lost mid-body (a server that died while answering) is an outage, and
    opens it. (One retry: the raw server closes each connection after its answer, which the
    next request meets as a kept-alive connection closed before answering.)"""
    async with RawHttp(always(*steps)) as server:
        config = EndpointConfig(
            base_url=server.base_url, model="m", max_retries=1, failures_to_open=1
        )
        endpoint = Endpoint(config, "large")
        try:
            with pytest.raises(UpstreamFailure) as failed:
                async for _piece in endpoint.stream_completion(REQUEST):
                    pass
            assert failed.value.outage == lost, failed.value
            assert "ended without a finish reason" in str(failed.value) or "was cut" in str(
                failed.value
            )
            assert endpoint.availability.down == lost
        finally:
            await endpoint.aclose()


@pytest.mark.parametrize(
    ("body", "said"),
    [
        pytest.param(ERROR_400, "prompt is too long", id="error object"),
        pytest.param(VLLM_ERROR, "bad stop", id="vLLM's object-error shape"),
    ],
)
@pytest.mark.parametrize("framing", ["chunked", "close"])
async def test_a_json_error_object_as_the_body_is_the_servers_error(
    body: dict[str, Any], said: str, framing: Framing
) -> None:
    """vLLM sends some of its errors as a JSON object under ``text/event-stream``: the
    server's error, with its message and the SDK class of its code (400: not retried)."""
    raw = event(body)[len(b"data: ") : -2]  # the JSON alone, no event around it
    async with RawHttp(always(*framed([raw], framing))) as server:
        outcome = await stream(server, max_retries=2)
    assert isinstance(outcome.error, UpstreamFailure), outcome
    assert isinstance(outcome.error.cause, openai.BadRequestError)
    assert "sent an error object: " + said in str(outcome.error.cause)
    assert said in outcome.error.detail
    assert "answered 400" not in outcome.error.detail  # it answered 200: the code is the body's
    assert "sent an error object" in outcome.error.detail and "(code 400)" in outcome.error.detail
    assert outcome.error.kind == "rejected" and server.posts == 1


async def test_an_error_object_of_a_server_error_is_retried() -> None:
    body = {"error": {"message": "engine overloaded", "code": 503}}
    async with RawHttp(always(*framed([event(body)[6:-2]], "chunked"))) as server:
        outcome = await stream(server, max_retries=1)
    assert isinstance(outcome.error, UpstreamFailure)
    assert isinstance(outcome.error.cause, openai.InternalServerError)
    assert server.posts == 2


WHOLE = [
    pytest.param(
        TWO_EVENTS + text_chunk("", "stop") + usage_chunk(2) + DONE, id="finish, usage, [DONE]"
    ),
    pytest.param(TWO_EVENTS + text_chunk("", "stop"), id="finish, then a clean end"),
    pytest.param(TWO_EVENTS + text_chunk("", "stop") + usage_chunk(2), id="no [DONE]"),
]


@pytest.mark.parametrize("payload", WHOLE)
@pytest.mark.parametrize("framing", ["chunked", "length", "close"])
async def test_a_whole_stream_is_read_whole(payload: bytes, framing: Framing) -> None:
    async with RawHttp(always(*framed([payload], framing))) as server:
        outcome = await stream(server)
    assert outcome.error is None
    assert (outcome.text, outcome.finish) == ("Hello there", "stop")


async def test_a_cut_after_done_loses_nothing() -> None:
    """``[DONE]`` ends the answer; the rest of the body is read only to keep the connection."""
    body = TWO_EVENTS + text_chunk("", "stop") + DONE
    async with RawHttp(always(stream_head("chunked"), chunk(body))) as server:
        outcome = await stream(server)
    assert outcome.error is None and outcome.text == "Hello there"


# --- every framing and cut of a valid stream (hypothesis) ----------------------------------------


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[bytes], str, str, int]:
    """A valid stream's events (text chunks, the finish, maybe usage, maybe [DONE]), its
    line ends, text, finish reason, and the offset where the finish event is dispatched."""
    texts = draw(st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=4))
    finish = draw(st.sampled_from(["stop", "length"]))
    end = draw(st.sampled_from([b"\n", b"\r\n", b"\r"]))
    events = [text_chunk(text, tokens=i + 1) for i, text in enumerate(texts)]
    events.append(text_chunk("", finish, tokens=len(texts)))
    if draw(st.booleans()):
        events.append(usage_chunk(len(texts)))
    if draw(st.booleans()):
        events.append(DONE)
    ended = [e.replace(b"\n", end) for e in events]
    dispatched = sum(map(len, ended[: len(texts) + 1])) - (1 if end == b"\r\n" else 0)
    return ended, "".join(texts), finish, dispatched


def _split(payload: bytes, points: list[int]) -> list[bytes]:
    cuts = sorted({0, len(payload), *(p % (len(payload) + 1) for p in points)})
    return [payload[a:b] for a, b in itertools.pairwise(cuts)]


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    valid=streams(),
    framing=st.sampled_from(["chunked", "length", "close"]),
    points=st.lists(st.integers(min_value=0, max_value=10_000), max_size=6),
    cut=st.none() | st.integers(min_value=0, max_value=10_000),
)
@example(  # a chunked body cut after two events: not finished, and the URL is named
    valid=(
        [text_chunk("Hello"), text_chunk(" there"), text_chunk("", "stop")],
        "Hello there",
        "stop",
        len(text_chunk("Hello") + text_chunk(" there") + text_chunk("", "stop")),
    ),
    framing="chunked",
    points=[],
    cut=len(text_chunk("Hello") + text_chunk(" there")),
)
async def test_any_framing_and_cut_of_a_valid_stream_ends_whole_or_named(
    valid: tuple[list[bytes], str, str, int], framing: Framing, points: list[int], cut: int | None
) -> None:
    """Whole: the server's text and finish reason. Cut before the finish event: never taken
    for a finished answer, but an error naming the URL. Cut after it: either."""
    events, text, finish, dispatched = valid
    payload = b"".join(events)
    delivered = payload if cut is None else payload[: cut % (len(payload) + 1)]
    steps = framed(_split(delivered, points), framing, whole=cut is None)
    async with RawHttp(always(*steps)) as server:
        outcome = await stream(server)
    if outcome.error is None:
        assert (outcome.text, outcome.finish) == (text, finish)
    else:
        assert text.startswith(outcome.text)
        assert f"127.0.0.1:{server.port}" in str(outcome.error)
    if cut is None:
        assert outcome.error is None, outcome.error
    elif len(delivered) < dispatched:
        assert outcome.error is not None, (delivered, outcome)
    assert server.posts == 1


# --- through the relay ----------------------------------------------------------------------------


class PlainPrompt:
    """The chat as its last message's text (no server template)."""

    async def render(self, endpoint: Endpoint, chat: ChatInput) -> RenderedPrompt:
        return RenderedPrompt(str(chat.messages[-1]["content"]))


def relay_script(completion: Callable[[Seen], Answer]) -> Callable[[Seen], Answer]:
    """A server of models "large" and "small" whose completions `completion` answers."""

    def script(request: Seen) -> Answer:
        if request.path.endswith("/models"):
            models = [{"id": m, "max_model_len": 4096} for m in ("large", "small")]
            return json_answer({"object": "list", "data": models})
        return completion(request)

    return script


async def test_a_relay_generation_over_a_stream_without_a_finish_reason_fails_naming_it() -> None:
    """Not a generation that "stopped" with the text so far: the break is resumed, and
    named once the resumes are spent."""
    body = text_chunk("<think>\nHello") + text_chunk(" there")
    script = relay_script(lambda request: Answer(stream_head("chunked"), chunked(body)))
    async with RawHttp(script) as server:
        endpoint = EndpointConfig(base_url=server.base_url, model="large", max_retries=0)
        config = RelayConfig(
            large=endpoint,
            small=endpoint.model_copy(update={"model": "small"}),
            cues=["Therefore,"],
            policy=SwitchPolicy(max_resumes=1),
        )
        async with RelaySwitcher(config, renderer=PlainPrompt()) as relay:
            with pytest.raises(EndpointError) as raised:
                async with asyncio.timeout(20):
                    await relay.generate([{"role": "user", "content": "Hi"}])
    assert "ended without a finish reason" in str(raised.value)
    assert server.base_url in str(raised.value)
    assert server.posts == 2  # the request and one resume


# --- stalls are counted in events -----------------------------------------------------------------


async def test_a_stream_of_comments_only_times_out_at_the_read_timeout() -> None:
    keepalives: list[bytes | float] = [0.1, b"3\r\n: \n\r\n"] * 100  # 10 s of comments
    steps = (stream_head("chunked"), chunked(TWO_EVENTS)[:-5], *keepalives)
    async with RawHttp(always(*steps)) as server:
        started = time.monotonic()
        outcome = await stream(server, read_timeout=1.0)
    assert time.monotonic() - started < 3  # 1 s, and at most a quarter more to notice
    assert isinstance(outcome.error, StreamInterrupted), outcome
    assert "no event from POST" in str(outcome.error) and "read_timeout=1 s" in str(outcome.error)


async def test_a_reader_slower_than_the_read_timeout_is_not_a_stall() -> None:
    """The events arrived; the reader was busy: what the server sent is not late."""
    steps: list[bytes | float] = [stream_head("chunked")]
    for n in range(4):
        steps += [chunk(text_chunk(f"{n} ")), 0.1]
    steps.append(chunk(text_chunk("", "stop") + DONE) + LAST_CHUNK)
    async with RawHttp(always(*steps)) as server:
        endpoint = Endpoint(
            EndpointConfig(base_url=server.base_url, model="m", read_timeout=0.4), "large"
        )
        text = ""
        async for piece in endpoint.stream_completion(REQUEST):
            text += piece.text
            await asyncio.sleep(0.3)  # the reader is slow; the events are there
        await endpoint.aclose()
    assert text == "0 1 2 3 "


# --- a POST is written at most 1 + max_retries times ----------------------------------------------


@pytest.mark.parametrize(("retries", "said"), [(0, "1 attempt"), (2, "3 attempts")])
async def test_a_connection_closed_before_an_answer_is_written_again_only_as_a_retry(
    retries: int, said: str
) -> None:
    async with RawHttp(always()) as server:  # reads the POST, closes the connection
        outcome = await stream(server, max_retries=retries)
    assert isinstance(outcome.error, UpstreamFailure), outcome
    assert isinstance(outcome.error.cause, openai.APIConnectionError)
    assert server.posts == 1 + retries
    assert said in str(outcome.error) and "closed the connection before answering" in str(
        outcome.error.cause
    )


async def test_a_kept_alive_connection_the_server_closed_is_retried_at_once() -> None:
    """The server answers the first request and keeps the connection; the second request,
    sent on it, meets a close (what a server closing an idle connection looks like): it is
    retried at once on a new connection, as one of its retries."""
    whole = TWO_EVENTS + text_chunk("", "stop") + DONE

    def script(request: Seen) -> Answer:
        if server.posts == 2:
            return Answer()  # closed before an answer
        return Answer(stream_head("chunked"), chunked(whole), keep_alive=True)

    async with RawHttp(script) as server:
        endpoint = Endpoint(
            EndpointConfig(base_url=server.base_url, model="m", max_retries=1), "large"
        )
        texts, took = [], []
        for _ in range(2):
            started = time.monotonic()
            texts.append("".join([p.text async for p in endpoint.stream_completion(REQUEST)]))
            took.append(time.monotonic() - started)
        await endpoint.aclose()
    assert texts == ["Hello there"] * 2
    assert server.posts == 3 and server.connections == 2
    assert took[1] < 0.4  # no backoff before the new connection


async def test_a_server_that_closes_every_connection_after_answering_costs_no_backoff() -> None:
    """It closes without saying so (no ``connection: close``): a request may be written on a
    connection whose close has not been seen yet, and is written again at once."""
    whole = TWO_EVENTS + text_chunk("", "stop") + DONE
    async with RawHttp(always(stream_head("chunked"), chunked(whole))) as server:
        endpoint = Endpoint(EndpointConfig(base_url=server.base_url, model="m"), "large")
        for _ in range(3):
            started = time.monotonic()
            assert "".join([p.text async for p in endpoint.stream_completion(REQUEST)]) == (
                "Hello there"
            )
            assert time.monotonic() - started < 0.4  # no retry's backoff
        await endpoint.aclose()
    assert 3 <= server.posts <= 6


# --- Retry-After ----------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["soon", "nan", "inf", "-1", "1e999", "", "Tue, 99 Foo"])
async def test_an_unreadable_retry_after_is_ignored_for_the_default_backoff(
    value: str, caplog: pytest.LogCaptureFixture
) -> None:
    whole = TWO_EVENTS + text_chunk("", "stop") + DONE
    busy = Answer(
        b"HTTP/1.1 429 Too Many Requests\r\nretry-after: %s\r\ncontent-length: 0\r\n\r\n"
        % value.encode(),
        keep_alive=True,
    )

    def script(request: Seen) -> Answer:
        if server.posts % 2:
            return busy
        return Answer(stream_head("chunked"), chunked(whole), keep_alive=True)

    with caplog.at_level(logging.WARNING, logger=endpoint_module.__name__):
        async with RawHttp(script) as server:
            started = time.monotonic()
            first = await stream(server, max_retries=1)
            second = await stream(server, max_retries=1)
    assert first.error is None and first.text == second.text == "Hello there"
    assert time.monotonic() - started < 3  # two default backoffs of 0.5 s
    unreadable = [r for r in caplog.records if "neither seconds nor an HTTP date" in r.message]
    if value.strip():
        assert len(unreadable) == 1  # once a server


def _state(failed: BaseException, attempt: int = 1) -> RetryCallState:
    state = RetryCallState(None, None, (), {})  # type: ignore[arg-type]
    state.attempt_number = attempt
    state.set_exception((type(failed), failed, None))
    return state


def _busy(retry_after: str) -> openai.RateLimitError:
    request = sdk_request("POST", "http://127.0.0.1:1/v1/completions")
    response = _http._RESPONSE(429, headers={"retry-after": retry_after}, request=request)
    return openai.RateLimitError("busy", response=response, body=None)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(value=st.text(max_size=40) | st.sampled_from(["nan", "inf", "-0", "1e309", "9" * 400]))
@example(value="soon")
@example(value="nan")
def test_any_retry_after_gives_a_finite_wait_within_the_cap(value: str) -> None:
    if value != value.strip() or any(c in value for c in "\r\n\x00"):
        value = value.strip().replace("\r", "").replace("\n", "").replace("\x00", "")
    try:
        failed = _busy(value)
    except Exception:  # a header value httpx refuses cannot arrive
        return
    wait = endpoint_module._wait_retry_after(_state(failed))
    assert math.isfinite(wait) and 0 <= wait <= MAX_RETRY_AFTER


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("3", 3.0), (" 2 ", 2.0), ("1.5", 1.5), ("0", 0.0), ("9" * 400, math.inf)],
)
def test_delta_seconds_are_read(value: str, seconds: float) -> None:
    assert endpoint_module._parse_retry_after(value) == seconds


def test_an_http_date_is_read_as_the_seconds_until_it() -> None:
    soon = email.utils.formatdate(time.time() + 30, usegmt=True)
    seconds = endpoint_module._parse_retry_after(soon)
    assert seconds is not None and 27 < seconds <= 30
    assert endpoint_module._parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT") == 0.0
    assert endpoint_module._wait_retry_after(_state(_busy("9" * 400))) == MAX_RETRY_AFTER


@pytest.mark.parametrize("before", [b"", TWO_EVENTS], ids=["at once", "after text"])
async def test_an_event_that_never_ends_is_named_not_kept(
    before: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that never ends its line fills no memory: past the decoder's limit the stream
    ends with an error naming the URL and the limit."""
    monkeypatch.setattr(sse, "MAX_EVENT_BYTES", 2**20)
    endless = before + b"data: " + b"x" * (2 * 2**20)
    async with RawHttp(always(stream_head("close"), endless)) as server:
        outcome = await stream(server)
    assert isinstance(outcome.error, StreamInterrupted if before else UpstreamFailure), outcome
    assert "more than 1 MiB" in str(outcome.error)
    assert f"127.0.0.1:{server.port}" in str(outcome.error)


@pytest.mark.parametrize("writes", [1, 40], ids=["one write", "many writes"])
async def test_a_backlog_of_events_gives_the_loop_turns(writes: int) -> None:
    """Bytes already received are read without suspending: a backlog of 2,000 events (sent at
    once, or read by a consumer that fell behind) is handed on in slices, the loop getting a
    turn between them, never in one callback that holds every other task of the loop."""
    body = b"".join(text_chunk("x") for _ in range(2000)) + text_chunk("", "stop") + DONE
    size = -(-len(body) // writes)
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    async with RawHttp(always(*framed(parts, "close"))) as server:
        turns = 0

        async def ticker() -> None:
            nonlocal turns
            while True:
                await asyncio.sleep(0)
                turns += 1

        await asyncio.sleep(0.3)  # nothing is read until the whole body waits in the buffer
        endpoint = Endpoint(EndpointConfig(base_url=server.base_url, model="m"), "large")
        try:
            pieces = 0
            async for _piece in endpoint.stream_completion(REQUEST):
                if pieces == 0:
                    await asyncio.sleep(0.3)  # the rest of the body arrives meanwhile
                    counting = asyncio.create_task(ticker())
                    turns = 0
                pieces += 1
            counting.cancel()
        finally:
            await endpoint.aclose()
    assert pieces >= 2001
    assert turns >= 2000 // 64 - 2  # a turn every slice of the backlog (64 events)
