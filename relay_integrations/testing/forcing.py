"""Forcing real models to write a known text, for tests and benchmarks.

vLLM's structured outputs constrain each request to the rest of a planned trace, so even a
tiny random model writes it; the switcher's stop strings then cut it exactly where the method
says, and the segments are known in advance::

    trace = "<think>\nLet me see. Therefore, it is 4.\n</think>\n\nIt is 4."
    async with RelaySwitcher(config, request_hook=forcing(trace)) as relay:
        result = await relay.generate(messages)
    assert result.text == trace
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..relay.config import Phase, RequestHook
from ..relay.switcher import RelaySwitcher
from ..upstream.config import ModelRole

_META = set("\\.^$*+?{}[]|()")


def regex_literal(text: str) -> str:
    """A regex matching exactly `text`."""
    escapes = {"\n": "\\n", "\t": "\\t"}
    return "".join("\\" + c if c in _META else escapes.get(c, c) for c in text)


def forcing(trace: str, answer: bool = True) -> RequestHook:
    """A request hook that makes every request write the rest of `trace`.

    With ``answer=False`` only the reasoning is forced and the answer is left to the model
    (and to whatever constrains it, such as a forced tool choice).
    """

    def hook(role: ModelRole, phase: Phase, transcript: str) -> Mapping[str, Any]:
        if (phase == "answer" and not answer) or not trace.startswith(transcript):
            # A request opened ahead of a hand-off the trace does not make (" So," where it
            # goes on " So the"): it is closed unused, whatever it carries.
            return {}
        return {"structured_outputs": {"regex": regex_literal(trace[len(transcript) :])}}

    return hook


def forced(relay: RelaySwitcher, trace: str, answer: bool = True) -> RelaySwitcher:
    """A switcher over `relay`'s endpoints whose requests all write the rest of `trace` (see
    :func:`forcing`): one relay, a planned text per generation::

        async with RelaySwitcher(config) as relay:
            first = await forced(relay, trace).generate(messages)
            second = await forced(relay, other_trace).generate(messages)

    `relay` keeps owning the endpoints: close it, not the switcher returned.
    """
    return hooked(relay, forcing(trace, answer))


def hooked(relay: RelaySwitcher, request_hook: RequestHook) -> RelaySwitcher:
    """A switcher over `relay`'s endpoints (its connections, and its servers' prefix caches)
    and cue set, whose requests get `request_hook`'s fields; `relay` keeps owning the
    endpoints."""
    return RelaySwitcher(
        relay.config,
        cues=relay.cues,
        renderer=relay.renderer,
        endpoints=relay.endpoints,
        request_hook=request_hook,
    )
