"""The Python client, sync and async, against the shop deployment's routers: the one that
reads shards in-process and the one that reads them over gRPC (the router's metric says
which path served)."""

from __future__ import annotations

import asyncio

import pytest

from qstate.client import AsyncClient, Client
from qstate.core.answer import JobInfo, StateAnswer
from qstate.core.errors import InvalidAddress, NotFound, Unavailable, UnknownOperator
from tests.shop import BATCHES, KEYS, ROUTES, WINDOW, Shop, avg_ms, views, window

LAST = BATCHES - 1


@pytest.fixture(params=ROUTES)
def route(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_sync_client_answers_and_errors(shop: Shop, route: str) -> None:
    # three keys read: KEYS[5] twice, never-written once
    with shop.served_by(route, 3), Client(shop.routers[route].url) as c:
        v = c.get("shop", "views_1m", "views", KEYS[5])
        assert v.latest is not None and (v.latest.start, v.latest.value) == (
            window(LAST)[0], views(KEYS[5], LAST))
        rng = c.history("shop", "views_1m", "avg_ms", KEYS[5], 0, 10 * WINDOW)
        assert [w.value for w in rng.windows] == [avg_ms(b) for b in range(BATCHES)]
        assert [j.name for j in c.jobs().jobs] == ["shop"]
        assert c.describe("shop").operators[0].last_batch == LAST
        with pytest.raises(NotFound) as absent:
            c.get("shop", "views_1m", "views", "never-written")
        assert absent.value.detail["batch"] == LAST
        with pytest.raises(UnknownOperator):
            c.get("shop", "nope", "views", "k")
        with pytest.raises(InvalidAddress):
            c.get("shop", "views_1m", "views", "k" * 1025)


def test_async_client_matches_sync(shop: Shop, route: str) -> None:
    url = shop.routers[route].url

    async def go() -> tuple[list[StateAnswer], list[StateAnswer], JobInfo]:
        async with AsyncClient(url) as c:
            ones = await asyncio.gather(*(c.get("shop", "views_1m", "views", k)
                                          for k in KEYS[:20]))
            many = await c.multi_get("shop", "views_1m", "views", [*KEYS[:20], "nope"])
            info = await c.describe("shop")
            return list(ones), many, info

    with shop.served_by(route, 20 + 21):
        ones, many, info = asyncio.run(go())
    with Client(url) as c:
        assert ones == [c.get("shop", "views_1m", "views", k) for k in KEYS[:20]]
        assert many == c.multi_get("shop", "views_1m", "views", [*KEYS[:20], "nope"])
    assert [a.windows[-1].value for a in ones] == [views(k, LAST) for k in KEYS[:20]]
    assert many[-1].found is False
    assert info.operators[0].partitions_available == info.operators[0].partitions


def test_async_client_retries_a_503_then_raises(shop: Shop, route: str) -> None:
    with shop.shard_down(shop.shards[0]) as key:
        async def ask() -> None:
            async with AsyncClient(shop.routers[route].url, retries=2, backoff_s=0.01) as c:
                await c.get("shop", "views_1m", "views", key)

        loop_started = asyncio.run(_timed(ask))
        # two retries, the first honouring Retry-After (1 s): at least a second passed
        assert loop_started >= 1.0


async def _timed(fn) -> float:  # type: ignore[no-untyped-def]
    t0 = asyncio.get_running_loop().time()
    with pytest.raises(Unavailable) as err:
        await fn()
    assert err.value.retry_after_s >= 1.0
    return asyncio.get_running_loop().time() - t0
