"""What one request of each kind costs the large API server at a context length::

    costs = await request_costs(http, server, messages, context)  # [RequestCost, ...]

Where the relay's API CPU grows with the context: each kind is sent `REPEATS` times in a row
(after one untimed, which fills the prefix cache) and the API server's CPU time is divided by
them. The kinds are the requests the relay makes, on the prompt of this length: rendering the
chat (``/tokenize`` with messages, as both paths do once a generation), turning its ids back
into text (``/detokenize``, the text path's render), and a one-token completion with the
prompt as text and as ids (what every hand-off of either path sends).
"""

from __future__ import annotations

from typing import Any

import httpx

from benchmarks.proc import cpu_seconds

from .figures import RequestCost
from .servers import Server

REPEATS = 10  # /proc counts CPU in 10 ms ticks: 1 ms a request


async def _cost(
    http: httpx.AsyncClient, server: Server, route: str, body: dict[str, Any]
) -> tuple[float, Any]:
    """The API CPU seconds of one `route` request (the mean of REPEATS), and its answer."""
    (await http.post(server.root + route, json=body)).raise_for_status()
    before = cpu_seconds(server.api_pid)
    for _ in range(REPEATS):
        response = await http.post(server.root + route, json=body)
        response.raise_for_status()
    return (cpu_seconds(server.api_pid) - before) / REPEATS, response.json()


async def request_costs(
    http: httpx.AsyncClient, server: Server, messages: list[dict[str, Any]], context: int
) -> list[RequestCost]:
    model = server.model
    render = {"model": model, "messages": messages, "add_generation_prompt": True}
    rendered, answer = await _cost(http, server, "/tokenize", render)
    ids = answer["tokens"]
    detokenized, answer = await _cost(http, server, "/detokenize", {"model": model, "tokens": ids})
    one_token = {"model": model, "max_tokens": 1}
    as_text, _ = await _cost(
        http,
        server,
        "/v1/completions",
        {**one_token, "prompt": answer["prompt"], "add_special_tokens": False},
    )
    as_ids, _ = await _cost(http, server, "/v1/completions", {**one_token, "prompt": ids})
    return [
        RequestCost(context, "render (/tokenize, messages)", rendered),
        RequestCost(context, "/detokenize", detokenized),
        RequestCost(context, "completion, prompt as text", as_text),
        RequestCost(context, "completion, prompt as ids", as_ids),
    ]
