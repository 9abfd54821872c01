"""Client shards: each client carries at most `shard_size` requests; light traffic uses one."""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest

from benchmarks.server_load.client_shards import ClientShards


class Client:
    made = 0

    def __init__(self) -> None:
        Client.made += 1
        self.number = Client.made
        self.closed = False

    async def close(self) -> None:
        self.closed = True


async def test_leases_fill_a_client_before_making_the_next_and_reuse_freed_room() -> None:
    Client.made = 0
    shards = ClientShards(Client, shard_size=2)
    async with AsyncExitStack() as held:
        leased = [await held.enter_async_context(shards.lease()) for _ in range(5)]
        assert [c.number for c in leased] == [1, 1, 2, 2, 3]
        assert shards.clients == 3
    async with shards.lease() as first, shards.lease() as second, shards.lease() as third:
        assert (first.number, second.number, third.number) == (1, 1, 2)
    assert shards.clients == 3  # clients are kept (with their warm connections), not remade
    async with shards.lease() as alone:
        assert alone.number == 1  # one request at a time always goes to the first client


async def test_a_lease_ending_in_an_error_still_returns_its_room() -> None:
    shards = ClientShards(Client, shard_size=1)
    with pytest.raises(RuntimeError):
        async with shards.lease():
            raise RuntimeError("request failed")
    async with shards.lease(), shards.lease():
        pass
    assert shards.clients == 2


async def test_aclose_closes_every_client_even_with_leases_out() -> None:
    shards = ClientShards(Client, shard_size=1)
    async with shards.lease() as first, shards.lease() as second:
        await shards.aclose()
    assert first.closed and second.closed and shards.clients == 0


def test_a_shard_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="shard_size must be at least 1"):
        ClientShards(Client, shard_size=0)
