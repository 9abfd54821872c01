"""The relay's requests sent again without the switcher: what its own code costs.

Each request of a relay generation is sent again, in order, through a plain ``Endpoint`` (the
same HTTP client code), with the same prompt, forcing and sampling but a new session id in the
prompt, so the prefix cache behaves as it did for the relay (the first request cold, each later
one finding what the earlier ones left). Back to back, the requests meet the same hand-offs as
in the relay: relay / back-to-back is the switcher's own cost (deciding, rendering, building
requests, its streaming). With a pause before each request, the two servers no longer run into
each other: back-to-back / paused is the hand-off interference, and paused / ideal what the
requests themselves cost the engine beyond the ideal.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace

from relay_integrations.core.config import ModelRole
from relay_integrations.core.endpoint import Endpoint

from .recording import Generation


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
