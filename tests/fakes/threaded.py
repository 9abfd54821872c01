"""Run a scripted server on its own event loop in a thread, for sync test suites."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from relay_integrations.testing.scripted_vllm import ScriptedVLLM


@contextmanager
def serving(server: ScriptedVLLM) -> Iterator[ScriptedVLLM]:
    """Serve `server` until the block ends; usable from sync and async tests alike."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="scripted-vllm", daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(server.__aenter__(), loop).result(timeout=30)
    try:
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(server.__aexit__(None, None, None), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()
