"""Forcing a real (random) model to write a known text, so that cue positions are known.

vLLM's structured outputs constrain each request to the rest of a planned trace; the
switcher's stop strings then cut it exactly where the method says.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from relay_integrations.core.config import ModelRole
from relay_integrations.core.generation import RequestHook
from relay_integrations.core.result import Phase

_META = set("\\.^$*+?{}[]|()")


def regex_literal(text: str) -> str:
    """A regex matching exactly `text`."""
    escapes = {"\n": "\\n", "\t": "\\t"}
    return "".join("\\" + c if c in _META else escapes.get(c, c) for c in text)


def forcing(trace: str) -> RequestHook:
    """A request hook that makes every request write the rest of `trace`."""

    def hook(role: ModelRole, phase: Phase, transcript: str) -> Mapping[str, Any]:
        assert trace.startswith(transcript), f"the relay left the trace at {transcript!r}"
        return {"structured_outputs": {"regex": regex_literal(trace[len(transcript) :])}}

    return hook
