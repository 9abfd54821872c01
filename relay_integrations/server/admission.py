"""Admission: how many generations the server runs at once, and what it records of each.

A generation takes a slot before it starts and gives it back when it ends (also when it
failed or its client left); a request beyond the limit is refused with 429 at once, with
``Retry-After`` (no queue: a load balancer or the client decides where to retry)::

    admission = Admission(limit=8, retry_after=1, metrics=RelayMetrics())
    if not admission.admit():
        return admission.busy_error().response()
    try:
        result = ...  # run the generation
    finally:
        admission.release(result)
"""

from __future__ import annotations

from typing import Any

from ..relay.result import RelayResult
from .errors import ApiError
from .logs import log
from .metrics import RelayMetrics


class Admission:
    """The in-flight count against its limit, with its metrics and the 429 beyond it."""

    def __init__(self, limit: int, retry_after: int, metrics: RelayMetrics) -> None:
        self.limit = limit
        self.retry_after = retry_after
        self.metrics = metrics
        self.inflight = 0

    def admit(self) -> bool:
        """Take a generation slot, if one is free (no queue: the caller answers 429)."""
        if self.inflight >= self.limit:
            self.metrics.rejected.inc()
            return False
        self.inflight += 1
        self.metrics.inflight.set(self.inflight)
        return True

    def release(self, result: RelayResult | None) -> None:
        """Give the slot back; record what the generation did (also a partial one)."""
        self.inflight -= 1
        self.metrics.inflight.set(self.inflight)
        if result is not None:
            self.metrics.observe(result)
            log.info("generation done", extra={"fields": _result_fields(result)})

    def busy_error(self) -> ApiError:
        return ApiError(
            429,
            f"the relay is running its limit of {self.limit} generations; retry in "
            f"{self.retry_after} s",
            code="too_many_generations",
            headers={"Retry-After": str(self.retry_after)},
        )


def _result_fields(result: RelayResult) -> dict[str, Any]:
    return {
        "generation_id": result.generation_id,
        "finish_reason": result.finish_reason,
        "large_share": round(result.stats.large_share, 4),
        "switches": result.stats.switches,
        "degraded": result.stats.degraded,  # in full here; clients get the relay's words
        "prompt_tokens": result.prompt_tokens,
        "cached_tokens": result.cached_tokens,
        "completion_tokens": result.completion_tokens,
        "seconds": round(result.stats.total_seconds, 4),
    }
