"""What a remote client is told about the relay's upstream servers: the relay's own words.

An upstream's error body can name internal addresses (a proxy's 502 page naming the host
behind it, vLLM echoing its base URL) or carry anything at all, so nothing the upstream wrote
goes to a client: not in an error, not in the reason a generation ran degraded. The client
gets which model's server, what kind of failure, and what it can do; the server's log keeps
the upstream's full text under the same request id::

    summary = client_summary(result)   # RelayResult.summary(), its "degraded" in our words
    partial = client_partial(result)   # the partial result of an error body, likewise
"""

from __future__ import annotations

from typing import Any

from ..relay.result import RelayResult

DEGRADED = (
    "the small model's server failed or was known down, so the large model wrote its turns "
    "too (the relay's log says why)"
)
"""``relay.degraded`` as a client sees it, whatever the upstream answered."""


def client_summary(result: RelayResult) -> dict[str, Any]:
    """:meth:`RelayResult.summary` as a remote client may see it."""
    summary = result.summary()
    if summary["degraded"] is not None:
        summary["degraded"] = DEGRADED
    return summary


def client_partial(result: RelayResult) -> dict[str, Any]:
    """A failed generation's partial result (``relay.partial``) as a remote client may see it."""
    partial = result.model_dump(mode="json")
    if partial["stats"]["degraded"] is not None:
        partial["stats"]["degraded"] = DEGRADED
    return partial
