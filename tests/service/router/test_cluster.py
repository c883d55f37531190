"""``GET /v1/cluster`` over the shop deployment: every partition once, under the server the
assignment names, as its owner reports it (state, last batch, watermark, freshness); the
partitions of a killed server are down, the others stay ready. With replicas=2 (the rescale
world of loadtest/rescale.py), each server also lists the copies it follows, and a read of a
dead owner's partition is answered by its copy only when it allows staleness."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import orjson
import pytest

from loadtest.rescale import JOB, OP, STATE, World, views
from qstate.client import Client
from qstate.core.address import partition_of
from qstate.core.errors import Unavailable
from qstate.embedded.procs import qstate_command
from qstate.proto import qstate_pb2 as pb
from qstate.proto import qstate_pb2_grpc as pb_grpc
from tests.helpers import metric, wait_until
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


# `make soak` (CI), keeping make test under 10 min (docs/architecture.md §9)
@pytest.mark.long
def test_followers_are_listed_under_the_servers_holding_the_copies(tmp_path: Path) -> None:
    """replicas=2 over two servers: /v1/cluster lists every partition once as owned and once
    as followed, by the other server, each as that server reports it; `qstate state
    inspect` names the same follower. A killed server's copies are down."""
    w = World(tmp_path, keys=200, partitions=4, replicas=2, interval_s=0.5)
    try:
        w.start(2)
        w.wait_settled({"s0", "s1"})
        router = w.routers[1].url  # over gRPC only

        def view() -> dict[str, Any]:
            r = httpx.get(f"{router}/v1/cluster", timeout=10)
            assert r.status_code == 200, r.text
            return {s["id"]: s for s in r.json()["shards"]}

        def copies_ready() -> bool:
            return all(p["state"] == "ready" for s in view().values() for p in s["following"])

        wait_until(copies_ready, 60, "every copy ready on its follower")
        a, shards = w.assignment(), view()
        for sid, s in shards.items():
            assert [p["partition"] for p in s["following"]] == [
                p for p in range(4) if a.followers_of(OP, p) == [sid]]
            assert {p["partition"] for p in s["following"]} \
                .isdisjoint(p["partition"] for p in s["partitions"])
            assert all(p["last_batch"] >= 0 and p["freshness_s"] is not None
                       for p in s["following"])
        assert sorted(p["partition"] for s in shards.values() for p in s["following"]) == \
            list(range(4))

        out = subprocess.run(qstate_command("state", "inspect", JOB, "--storage",
                                            w.storage.uri, "--json"),
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        rows = [orjson.loads(line) for line in out.stdout.splitlines()]
        assert [r["followers"] for r in rows] == [
            [f"{f}:ready" for f in a.followers_of(OP, r["partition"])] for r in rows]

        # the job stops (no coordinator: no lease runs out, nothing is promoted), then s1
        # dies: its partitions have no owner that answers, and a copy on s0 each
        w.pause()
        last = w.committed
        wait_until(lambda: all(p["last_batch"] == last for s in view().values()
                               for p in s["following"]), 30, f"every copy at batch {last}")
        w.shards["s1"].kill()  # its copies are down
        assert {p["state"] for p in view()["s1"]["following"]} == {"down"}
        stale_reads_only_when_allowed(w, last, router, w.routers[1].grpc_address)
    finally:
        w.stop()


def stale_reads_only_when_allowed(w: World, last: int, router: str, grpc_address: str) -> None:
    """A partition whose owner is down is read from its follower only by a read that allows
    staleness (allow_stale, as Kafka Streams' stale stores), as of the follower's batch; any
    other read is the owner's 503 + Retry-After, which says how to read the copy. Point and
    batch reads over HTTP, gRPC Get, the top-N, the Python client."""
    a = w.assignment()  # ``last``: the job's last batch, which every copy has
    dead = [k for k in w.names if a.owners[OP][partition_of(k, w.spec.partitions)] == "s1"]
    key = dead[0]
    path = f"/v1/state/{JOB}/{OP}/{STATE}/{key}"

    def refused() -> httpx.Response | None:
        r = httpx.get(f"{router}{path}", timeout=30)
        return r if r.status_code == 503 else None

    r = wait_until(refused, 30, "the router finding the owner down")
    assert isinstance(r, httpx.Response) and "Retry-After" in r.headers
    assert "allow_stale=true" in r.json()["message"], r.text

    def follower_reads() -> float:
        return metric(router, "qstate_router_shard_reads_total", path="follower")

    before = follower_reads()
    r = httpx.get(f"{router}{path}", params={"allow_stale": "true"}, timeout=30)
    assert r.status_code == 200, r.text
    got = r.json()
    assert (got["found"], got["batch"]) == (True, last)
    assert got["windows"][0]["value"] == views(key, last)
    assert follower_reads() > before
    r = httpx.post(f"{router}/v1/state/{JOB}/{OP}/{STATE}:batchGet", json={"keys": dead[:50]},
                   params={"allow_stale": "yes"}, timeout=30)
    assert r.status_code == 200, r.text
    assert [x["windows"][0]["value"] for x in r.json()["results"]] == \
        [views(k, last) for k in dead[:50]]
    assert httpx.post(f"{router}/v1/state/{JOB}/{OP}/{STATE}:batchGet",
                      json={"keys": dead[:50]}, timeout=30).status_code == 503

    top = f"{router}/v1/top/{JOB}/{OP}/{STATE}"
    assert httpx.get(top, params={"n": 5}, timeout=30).status_code == 503
    r = httpx.get(top, params={"n": 5, "allow_stale": "true"}, timeout=30)
    assert r.status_code == 200, r.text
    truth = sorted(w.names, key=lambda k: (-views(k, last), k))[:5]
    assert [e["key"] for e in r.json()["entries"]] == truth

    with grpc.insecure_channel(grpc_address) as ch:
        stub = pb_grpc.QueryableStateStub(ch)
        ask = pb.GetRequest(job=JOB, operator=OP, state=STATE, key=key)
        with pytest.raises(grpc.RpcError) as e:
            stub.Get(ask, timeout=30)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "allow_stale" in (e.value.details() or "")
        ask.allow_stale = True
        v = stub.Get(ask, timeout=30)
        assert (v.found, v.batch, v.windows[0].int_value) == (True, last, views(key, last))
        many = stub.MultiGet(pb.MultiGetRequest(job=JOB, operator=OP, state=STATE,
                                                keys=dead[:20], allow_stale=True), timeout=30)
        assert [v.windows[0].int_value for v in many.results] == \
            [views(k, last) for k in dead[:20]]
        board = stub.Top(pb.TopRequest(job=JOB, operator=OP, state=STATE, n=5,
                                       allow_stale=True), timeout=30)
        assert [e.key for e in board.entries] == truth

    with Client(router, retries=0) as c, pytest.raises(Unavailable):
        c.get(JOB, OP, STATE, key)
    with Client(router, retries=0, allow_stale=True) as c:
        assert c.get(JOB, OP, STATE, key).batch == last
