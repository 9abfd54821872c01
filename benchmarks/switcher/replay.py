"""The relay's requests sent again without the switcher: what its own code costs.

Each request of a relay generation is sent again, in order, through a plain ``Endpoint`` (the
same HTTP client code), with the same prompt, forcing and sampling but a new session id in the
prompt, so the prefix cache behaves as it did for the relay (the first request cold, each later
one finding what the earlier ones left). Back to back, the requests meet the same hand-offs as
in the relay: relay / back-to-back is the switcher's own cost (deciding, rendering, building
requests, its streaming). With a pause before each request, the two servers no longer run into
each other: back-to-back / paused is the hand-off interference, and paused / ideal what the
requests themselves cost the engine beyond the ideal.

``replay_raw`` sends them back to back through plain httpx with the endpoint's fields
(``include_stop_str_in_output``, ``add_special_tokens`` false, the stop strings, sampling and
forcing), as whole (non-streamed) responses, streamed, and streamed with
``continuous_usage_stats``: the endpoint's replay / the raw stream is this client's streaming
cost, raw stream / whole what streaming costs vLLM's API server, and the continuous one what
usage in every chunk costs.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace

import httpx

from relay_integrations.upstream.config import ModelRole
from relay_integrations.upstream.endpoint import CompletionRequest, Endpoint

from .recording import Generation
from .servers import Server


@dataclass(frozen=True)
class Replay:
    pause: float  # seconds before each request (not counted)
    seconds: float  # the requests' times, summed
    same_tokens: bool  # every request wrote as many tokens as in the relay


async def replay(endpoints: Mapping[ModelRole, Endpoint], gen: Generation, pause: float) -> Replay:
    session = uuid.uuid4().hex
    seconds, same = 0.0, True
    for record in gen.requests:
        assert record.request is not None and gen.session, "a relay generation, recorded"
        prompt = record.request.prompt.replace(gen.session, session)
        request = replace(record.request, prompt=prompt, headers={})
        await asyncio.sleep(pause)
        sent, written = time.perf_counter(), None
        async for piece in endpoints[record.role].stream_completion(request):
            written = piece.completion_tokens if piece.completion_tokens is not None else written
        seconds += time.perf_counter() - sent
        same = same and written == record.completion_tokens
    return Replay(pause, seconds, same)


@dataclass(frozen=True)
class RawShape:
    """How a raw replay sends each request: streamed or whole, with which usage reporting."""

    name: str
    stream: bool
    continuous_usage: bool = False


RAW_SHAPES = (
    RawShape("whole", stream=False),
    RawShape("raw_stream", stream=True),
    RawShape("raw_stream_continuous", stream=True, continuous_usage=True),
)


def raw_body(server: Server, request: CompletionRequest, shape: RawShape) -> dict[str, object]:
    """The endpoint's request as one ``/v1/completions`` body of the given shape."""
    body: dict[str, object] = {
        "model": server.model,
        "prompt": request.prompt,
        "max_tokens": request.max_tokens,
        "stop": list(request.stop) or None,
        "include_stop_str_in_output": True,
        "add_special_tokens": False,
        **request.sampling,
        **request.extra_body,
    }
    if shape.stream:
        body["stream"] = True
        body["stream_options"] = {
            "include_usage": True,
            "continuous_usage_stats": shape.continuous_usage,
        }
    return body


async def raw_request(http: httpx.AsyncClient, url: str, body: dict[str, object]) -> int:
    """Send one request with plain httpx; its completion tokens (streamed: the last usage)."""
    if not body.get("stream"):
        response = await http.post(url, json=body)
        response.raise_for_status()
        return int(response.json()["usage"]["completion_tokens"])
    written = 0
    async with http.stream("POST", url, json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data:") and "usage" in line:
                usage = json.loads(line[5:]).get("usage")
                written = int(usage["completion_tokens"]) if usage else written
    return written


async def replay_raw(
    http: httpx.AsyncClient,
    servers: Mapping[ModelRole, Server],
    gen: Generation,
    shape: RawShape,
) -> Replay:
    """The relay generation's requests back to back through plain httpx, in `shape`."""
    session = uuid.uuid4().hex
    seconds, same = 0.0, True
    for record in gen.requests:
        assert record.request is not None and gen.session, "a relay generation, recorded"
        prompt = record.request.prompt.replace(gen.session, session)
        server = servers[record.role]
        body = raw_body(server, replace(record.request, prompt=prompt), shape)
        sent = time.perf_counter()
        written = await raw_request(http, server.url + "/completions", body)
        seconds += time.perf_counter() - sent
        same = same and written == record.completion_tokens
    return Replay(0.0, seconds, same)
