"""Keys of one shard asked at once leave together (docs/architecture.md §5): the read engine
coalesces the keys that many concurrent requests ask of one owner into few MultiGet calls
(at most two in flight a shard; ``engine/core/src/remote.rs``), and every key still gets its
own answer. Over the session's shop, through the router that reads from the owners
(``--no-local-reads``), with the owning shard's own counts of calls and keys."""

from __future__ import annotations

import asyncio

import httpx

from tests.helpers import metric
from tests.shop import BATCHES, KEYS, Shop, views


def calls_of(url: str) -> float:
    """MultiGet calls a shard answered: its reader's and its Python's."""
    return metric(url, "qstate_shard_reader_calls_total") + \
        metric(url, "qstate_shard_lookup_seconds_count")


def found_of(url: str) -> float:
    """Keys a shard found: by its reader and by its Python."""
    return metric(url, "qstate_shard_reader_keys_total", status="FOUND") + \
        metric(url, "qstate_shard_lookup_keys_total", status="FOUND")


def test_concurrent_reads_of_one_shard_leave_in_fewer_calls_than_keys(shop: Shop) -> None:
    shard = shop.shards[0]
    mine = [k for k in KEYS if shop.owner_of(k) is shard][:60]
    url, shard_url = shop.routers["grpc"].url, shop.metrics_url(shard)
    calls, found = calls_of(shard_url), found_of(shard_url)

    async def read_all() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=len(mine))
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as c:
            return await asyncio.gather(*(c.get(f"/v1/state/shop/views_1m/views/{k}")
                                          for k in mine))

    answers = asyncio.run(read_all())
    assert [a.json()["windows"][-1]["value"] for a in answers] == \
        [views(k, BATCHES - 1) for k in mine]
    assert found_of(shard_url) == found + len(mine)
    assert calls_of(shard_url) - calls < len(mine)
