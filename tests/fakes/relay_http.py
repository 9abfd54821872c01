"""Run ``relaygen serve``'s app on a loopback port, in a thread with its own event loop::

with relay_http(RelayServer(config)) as served:
    client = openai.OpenAI(base_url=served.base_url, api_key="x")
    served.tasks()  # tasks alive on the server's loop (for leak checks)
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import uvicorn

from relay_integrations.server import RelayServer
from relay_integrations.server.draining import DrainingServer, uvicorn_config
from tests.fakes.canary import CanaryScreen


@dataclass
class ServedRelay:
    relay: RelayServer
    server: uvicorn.Server
    loop: asyncio.AbstractEventLoop
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def tasks(self) -> int:
        """Tasks on the server's loop, besides uvicorn's own serving task and this probe."""

        async def count() -> int:
            return len(asyncio.all_tasks()) - 1

        return asyncio.run_coroutine_threadsafe(count(), self.loop).result(10)


@contextmanager
def relay_http(relay: RelayServer) -> Iterator[ServedRelay]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP_NODELAY
    sock.bind(("127.0.0.1", 0))
    config = uvicorn_config(relay)
    config.app = CanaryScreen(config.app)  # no answer may show the canary secret
    server = DrainingServer(config, relay)  # sockets given: no host, port
    loop = asyncio.new_event_loop()
    thread = threading.Thread(
        target=lambda: loop.run_until_complete(server.serve(sockets=[sock])),
        name="relay-http",
        daemon=True,
    )
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the relay server did not start")
        threading.Event().wait(0.01)
    try:
        yield ServedRelay(relay, server, loop, sock.getsockname()[1])
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        loop.close()


def eventually(check: Callable[[], bool], seconds: float = 5.0) -> bool:
    """Whether `check` holds within `seconds` (polled)."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
