"""A streamed chat completion read in a thread of its own, for tests that signal the server
while the stream is open::

    outcome = {}
    thread = stream_in_thread(httpx.Client(base_url=url, timeout=60), outcome)
    assert outcome["started"].wait(10)   # the first chunk arrived
    ...
    thread.join(30)                      # outcome["lines"]: the data lines; "error" if it broke
"""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx

QUESTION = {"role": "user", "content": "What is 7 * 6?"}


def stream_in_thread(client: httpx.Client, outcome: dict[str, Any]) -> threading.Thread:
    """Stream one completion on `client` in a thread; `outcome` gets its lines and any error."""
    body = {"model": "large", "messages": [QUESTION], "stream": True}
    outcome["lines"] = []
    outcome["started"] = threading.Event()

    def run() -> None:
        try:
            with client.stream("POST", "/v1/chat/completions", json=body) as response:
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        outcome["lines"].append(line.removeprefix("data: "))
                        outcome["started"].set()
        except httpx.HTTPError as error:
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def streamed_content(lines: list[str]) -> str:
    """The answer text of a stream's data lines."""
    chunks = [json.loads(line) for line in lines if line != "[DONE]"]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
