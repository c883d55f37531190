"""``GET /v1/cluster`` over the shop deployment: every partition once, under the server the
assignment names, as its owner reports it (state, last batch, watermark, freshness); the
partitions of a killed server are down, the others stay ready."""

from __future__ import annotations

import time
from typing import Any

import httpx

from tests.shop import BATCHES, SPEC, WINDOW, Shop

LAST = BATCHES - 1


def cluster(shop: Shop) -> tuple[dict[str, Any], float, float]:
    t0 = time.time()
    r = httpx.get(f"{shop.routers['grpc'].url}/v1/cluster", timeout=10)
    t1 = time.time()
    assert r.status_code == 200, r.text
    return r.json(), t0, t1


def test_every_partition_under_its_owner_as_its_owner_reports_it(shop: Shop) -> None:
    c, t0, t1 = cluster(shop)
    a = shop.coordinator.assignment
    ids = {address: sid for sid, address in a.servers.items()}
    owned = a.partitions_of(SPEC.operator)
    assert int(t0 * 1000) <= c["now"] <= t1 * 1000
    assert c["unassigned"] == []
    assert sorted(s["address"] for s in c["shards"]) == sorted(s.address for s in shop.shards)
    for s in c["shards"]:
        assert (s["id"], s["up"]) == (ids[s["address"]], True)
        assert [(p["job"], p["operator"], p["partition"]) for p in s["partitions"]] == [
            (SPEC.job, SPEC.operator, p) for p in owned[s["address"]]]
        for p in s["partitions"]:
            assert (p["state"], p["last_batch"], p["watermark"]) == ("ready", LAST, LAST * WINDOW)
            age = c["now"] / 1000 - LAST * WINDOW / 1000
            assert abs(p["freshness_s"] - age) < 0.01
    assert sum(len(s["partitions"]) for s in c["shards"]) == SPEC.partitions


def test_a_killed_servers_partitions_are_down(shop: Shop) -> None:
    victim = shop.shards[1]
    with shop.shard_down(victim):
        c, _, _ = cluster(shop)
        by_address = {s["address"]: s for s in c["shards"]}
        dead = by_address.pop(victim.address)
        assert dead["up"] is False and dead["partitions"]
        assert {(p["state"], p["last_batch"], p["freshness_s"]) for p in dead["partitions"]} \
            == {("down", None, None)}
        (alive,) = by_address.values()
        assert alive["up"] and {p["state"] for p in alive["partitions"]} == {"ready"}
