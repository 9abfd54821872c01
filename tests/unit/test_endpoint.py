"""The upstream client keeps no cookies: a cookie-affinity router in front of vLLM would
otherwise pin every later generation of a relay process to one replica."""

from __future__ import annotations

import asyncio
import socket

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from relay_integrations.core.config import EndpointConfig
from relay_integrations.core.endpoint import Endpoint


async def test_cookies_set_by_a_server_are_not_sent_back() -> None:
    cookies_sent: list[str | None] = []

    async def models(request: Request) -> Response:
        cookies_sent.append(request.headers.get("cookie"))
        response = JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})
        response.set_cookie("replica", "pod-1")
        return response

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP_NODELAY
    sock.bind(("127.0.0.1", 0))
    app = Starlette(routes=[Route("/v1/models", models)])
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical", lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        base_url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        endpoint = Endpoint(EndpointConfig(base_url=base_url, model="m"), "large")
        await endpoint.model_info()
        endpoint._model_info = None  # fetch again: this request would carry the cookie
        await endpoint.model_info()
        await endpoint.aclose()
    finally:
        server.should_exit = True
        await task
    assert cookies_sent == [None, None]
