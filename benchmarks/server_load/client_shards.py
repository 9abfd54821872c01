"""Upstream HTTP clients in shards, so that a thousand requests in flight stay cheap.

httpx's connection pool re-examines every request and connection it holds each time a request
starts or ends. One client carrying N requests at once therefore costs O(N) per event and
O(N²) per round of N requests: at 1,000 concurrent generations in one process the pool's
bookkeeping was over a third of the relay's CPU, and the event loop stalled for seconds.
:class:`ClientShards` gives each request a lease on a client that carries at most
``shard_size`` requests, making another client when all are full, so the pool work per event
stays bounded::

    shards = ClientShards(lambda: openai.AsyncOpenAI(base_url=url), shard_size=32)
    async with shards.lease() as client:
        await client.models.list()
    await shards.aclose()

A lease goes to the first client with room, so light traffic uses one client (and its warm
keep-alive connections) and shards appear only as concurrency grows.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar


class _Closable(Protocol):
    async def close(self) -> None: ...


C = TypeVar("C", bound=_Closable)

DEFAULT_SHARD_SIZE = 32
"""Requests one HTTP client carries at once. Small enough that its pool's bookkeeping is
cheap, large enough that a single user's traffic never needs a second client."""


@dataclass
class _Shard(Generic[C]):
    client: C
    leases: int = 0


class ClientShards(Generic[C]):
    """Clients made by `make_client`, each leased to at most `shard_size` requests at once."""

    def __init__(self, make_client: Callable[[], C], shard_size: int = DEFAULT_SHARD_SIZE) -> None:
        if shard_size < 1:
            raise ValueError(f"shard_size must be at least 1, not {shard_size}")
        self._make_client = make_client
        self.shard_size = shard_size
        self._shards: list[_Shard[C]] = []

    @property
    def clients(self) -> int:
        """How many clients exist (grows with the most requests ever in flight at once)."""
        return len(self._shards)

    @asynccontextmanager
    async def lease(self) -> AsyncIterator[C]:
        """A client for one request (or one stream), returned when the block ends."""
        shard = self._shard_with_room()
        shard.leases += 1
        try:
            yield shard.client
        finally:
            shard.leases -= 1

    async def aclose(self) -> None:
        """Close every client (their connections with them)."""
        shards, self._shards = self._shards, []
        await asyncio.gather(*(shard.client.close() for shard in shards))

    def _shard_with_room(self) -> _Shard[C]:
        for shard in self._shards:
            if shard.leases < self.shard_size:
                return shard
        shard = _Shard(self._make_client())
        self._shards.append(shard)
        return shard
