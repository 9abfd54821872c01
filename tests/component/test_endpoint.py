"""The upstream client: no cookies (a cookie-affinity router in front of vLLM would otherwise
pin every later generation of a relay process to one replica), and server-sent error events."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from relay_integrations.upstream.config import EndpointConfig
from relay_integrations.upstream.endpoint import (
    CompletionRequest,
    Endpoint,
    StreamInterrupted,
    UpstreamFailure,
)


async def test_cookies_set_by_a_server_are_not_sent_back() -> None:
    cookies_sent: list[str | None] = []

    async def models(request: Request) -> Response:
        cookies_sent.append(request.headers.get("cookie"))
        response = JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})
        response.set_cookie("replica", "pod-1")
        return response

    server, task, base_url = await _serve(Route("/v1/models", models))
    try:
        endpoint = Endpoint(EndpointConfig(base_url=base_url, model="m"), "large")
        await endpoint.model_info()
        endpoint._model_info = None  # fetch again: this request would carry the cookie
        await endpoint.model_info()
        await endpoint.aclose()
    finally:
        server.should_exit = True
        await task
    assert cookies_sent == [None, None]


def _chunk(text: str, finish: str | None = None) -> str:
    return "data: " + json.dumps({"choices": [{"text": text, "finish_reason": finish}]}) + "\n\n"


async def _serve(route: Route) -> tuple[uvicorn.Server, asyncio.Task[None], str]:
    """A one-route HTTP server on a free port: (server, its task, base URL ending in /v1)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP_NODELAY
    sock.bind(("127.0.0.1", 0))
    app = Starlette(routes=[route])
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical", lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    return server, task, f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


async def _serve_events(*events: str) -> tuple[uvicorn.Server, asyncio.Task[None], str]:
    async def completions(request: Request) -> Response:
        async def body() -> AsyncIterator[str]:
            for event in events:
                yield event

        return StreamingResponse(body(), media_type="text/event-stream")

    return await _serve(Route("/v1/completions", completions, methods=["POST"]))


async def test_server_sent_error_events_fail_the_request_or_interrupt_the_stream() -> None:
    """vLLM reports some failures as an ``{"error": ...}`` event: before any text it fails the
    request (not retried: it is an answer, not a lost connection); after text it interrupts
    the stream, keeping what arrived, so the switcher can resume."""
    error = 'data: {"error": {"message": "engine died", "code": 500}}\n\n'
    request = CompletionRequest(prompt="Hi", max_tokens=8)
    server, task, url = await _serve_events(error)
    endpoint = Endpoint(EndpointConfig(base_url=url, model="m", max_retries=2), "large")
    try:
        with pytest.raises(UpstreamFailure, match="engine died"):
            [piece async for piece in endpoint.stream_completion(request)]
    finally:
        await endpoint.aclose()
        server.should_exit = True
        await task
    server, task, url = await _serve_events(_chunk("Hello"), _chunk(" there"), error)
    endpoint = Endpoint(EndpointConfig(base_url=url, model="m"), "large")
    received = []
    try:
        with pytest.raises(StreamInterrupted) as interrupted:
            async for piece in endpoint.stream_completion(request):
                received.append(piece.text)
    finally:
        await endpoint.aclose()
        server.should_exit = True
        await task
    assert received == ["Hello", " there"] and interrupted.value.text == "Hello there"


@pytest.mark.parametrize(
    ("event", "said"),
    [("data: [1, 2]\n\n", "not a JSON object"), ("data: {oops\n\n", "not JSON")],
)
async def test_an_event_that_is_not_a_json_object_fails_the_request_naming_it(
    event: str, said: str
) -> None:
    request = CompletionRequest(prompt="Hi", max_tokens=8)
    server, task, url = await _serve_events(event)
    endpoint = Endpoint(EndpointConfig(base_url=url, model="m", max_retries=0), "large")
    try:
        with pytest.raises(UpstreamFailure, match=said):
            [piece async for piece in endpoint.stream_completion(request)]
    finally:
        await endpoint.aclose()
        server.should_exit = True
        await task


async def test_many_concurrent_streams_keep_their_connections_for_the_next_round() -> None:
    """40 streams at once open 40 connections; a second round reuses them all."""
    release = asyncio.Event()
    peers: list[int] = []

    async def completions(request: Request) -> Response:
        assert request.client is not None
        peers.append(request.client.port)

        async def body() -> AsyncIterator[str]:
            yield _chunk("Hello")
            await release.wait()
            yield _chunk(" there", "stop")
            yield "data: [DONE]\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")

    server, task, url = await _serve(Route("/v1/completions", completions, methods=["POST"]))
    endpoint = Endpoint(EndpointConfig(base_url=url, model="m", max_concurrency=40), "large")
    request = CompletionRequest(prompt="Hi", max_tokens=8)

    async def text() -> str:
        return "".join([piece.text async for piece in endpoint.stream_completion(request)])

    try:
        for opened in (40, 80):
            release.clear()
            streams = [asyncio.create_task(text()) for _ in range(40)]
            while len(peers) < opened:  # all 40 streams open at once
                await asyncio.sleep(0.01)
            release.set()
            assert await asyncio.gather(*streams) == ["Hello there"] * 40
    finally:
        await endpoint.aclose()
        server.should_exit = True
        await task
    first_round, second_round = set(peers[:40]), set(peers[40:])
    assert len(first_round) == 40 and second_round == first_round


def _usage_chunk(text: str, finish: str | None, completion: int, *, choices: bool = True) -> str:
    usage: dict[str, object] = {"prompt_tokens": 5, "completion_tokens": completion}
    if not choices:  # vLLM's final usage chunk (with --enable-prompt-tokens-details)
        usage["prompt_tokens_details"] = {"cached_tokens": 0}
    chunk: dict[str, object] = {"usage": usage, "choices": []}
    if choices:
        chunk["choices"] = [{"text": text, "finish_reason": finish}]
    return "data: " + json.dumps(chunk) + "\n\n"


async def _pieces(*events: str) -> list[tuple[str, int | None, int | None, bool]]:
    """(text, tokens so far, usage counted, usage only) of each piece the endpoint yields."""
    server, task, url = await _serve_events(*events, "data: [DONE]\n\n")
    endpoint = Endpoint(EndpointConfig(base_url=url, model="m"), "large")
    try:
        request = CompletionRequest(prompt="Hi", max_tokens=8)
        return [
            (p.text, p.tokens, p.completion_tokens, p.usage_only)
            async for p in endpoint.stream_completion(request)
        ]
    finally:
        await endpoint.aclose()
        server.should_exit = True
        await task


async def test_pieces_carry_the_tokens_so_far_and_usage_is_counted_once() -> None:
    """vLLM's continuous usage stats give each piece the request's tokens so far, though a
    piece may carry several (vLLM merges what a slow client has not read yet); the usage is
    the final chunk's alone, so the caller counts it once."""
    pieces = await _pieces(
        _usage_chunk("Hel", None, 1),
        _usage_chunk("lo the", None, 3),  # two tokens in one chunk
        _usage_chunk("re.", "stop", 4),
        _usage_chunk("", None, 4, choices=False),
    )
    assert pieces == [
        ("Hel", 1, None, False),
        ("lo the", 3, None, False),
        ("re.", 4, None, False),
        ("", None, 4, True),
    ]


async def test_a_server_that_sends_usage_on_its_last_piece_has_it_counted() -> None:
    """A server that ignores ``continuous_usage_stats`` and puts the usage on the finishing
    chunk (no usage chunk of its own): that usage ends the stream as its usage piece."""
    pieces = await _pieces(_chunk("Hello"), _usage_chunk(" there.", "stop", 2))
    assert pieces == [
        ("Hello", None, None, False),
        (" there.", 2, None, False),
        ("", None, 2, True),
    ]
