"""/metrics of shard servers and routers after a run, against what the run did.

A deployment of its own (tests/shop.py: two shard processes, three committed batches, a
router reading in-process and one reading over gRPC), so every counter starts at zero here:
partitions by state equal the assignment, commit counters the batches committed, request
counters the requests this test made, by route template and status, and no label anywhere
holds a key or a path asked. docs/metrics.md documents these series.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from qstate.control.coordinator import Coordinator
from qstate.core.address import PartitionId, partition_of
from qstate.core.config import Settings
from qstate.core.records.operator import OperatorSpec, WindowSpec, save_spec
from qstate.core.records.storage import Storage
from qstate.core.transport import security
from qstate.embedded.procs import RouterProcess, ShardProcess
from qstate.partition.files import partition_dir
from qstate.proto import qstate_pb2 as qpb
from qstate.proto import qstate_pb2_grpc as qpb_grpc
from qstate.proto import shard_pb2 as spb
from qstate.proto import shard_pb2_grpc as spb_grpc
from tests.helpers import Scrape, scrape, shard_metrics_url, wait_until
from tests.shop import (
    BATCHES,
    BIG,
    KEYS,
    MANY,
    READ_PATH,
    READS,
    ROUTES,
    SHARD_MEMORY_MB,
    SPEC,
    WINDOW,
    P,
    Shop,
    commit_batch,
    start_shop,
)

LAST = BATCHES - 1
OP = {"job": SPEC.job, "operator": SPEC.operator}
STATE = "/v1/state/{job}/{operator}/{state}/{key}"
BATCH = "/v1/state/{job}/{operator}/{state}:batchGet"
# what a label must never hold: the keys asked and the paths they were asked by
FORBIDDEN = ("page-", "item-", BIG, "ünï", "a" * 64, "never-written", "/v1/state/shop")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Shop, Path]]:
    tmp = tmp_path_factory.mktemp("metrics")
    shop = start_shop(tmp)
    try:
        yield shop, tmp / "data"
    finally:
        shop.stop()


def metrics_url(storage: Storage, shard: ShardProcess) -> str:
    """Where this incarnation of ``shard`` serves /metrics, once it has registered."""
    return shard_metrics_url(storage.uri, shard)


def owned(shop: Shop, shard: ShardProcess) -> list[int]:
    return shop.coordinator.assignment.partitions_of(SPEC.operator).get(shard.address, [])


def data_bytes(data_dir: Path, shard: ShardProcess, partitions: list[int]) -> int:
    """SST and WAL bytes of ``partitions`` in the shard's folder, counted here."""
    total = 0
    for p in partitions:
        folder = partition_dir(data_dir / shard.name, PartitionId(SPEC.job, SPEC.operator, p))
        total += sum(os.path.getsize(folder / f) for f in os.listdir(folder)
                     if f.endswith((".sst", ".log")))
    return total


def by_state(m: Scrape) -> dict[str, float]:
    return {state: v for (state,), v in m.by("qstate_shard_partitions", "state").items()}


def no_key_in_labels(m: Scrape) -> None:
    for s in m.samples:
        for label, value in s.labels.items():
            assert not any(f in value for f in FORBIDDEN), (s.name, label, value[:80])


def test_each_shard_reports_what_it_holds_and_committed(
        deployment: tuple[Shop, Path]) -> None:
    shop, data_dir = deployment
    serving = 0.0
    for shard in shop.shards:
        mine = owned(shop, shard)
        keys = [k for k in KEYS + MANY if partition_of(k, P) in mine]
        m = scrape(shop.metrics_url(shard))
        assert by_state(m) == {"serving": len(mine), "restoring": 0, "retired": 0}
        serving += by_state(m)["serving"]
        assert m.by("qstate_shard_commits_total", "result") == {
            ("applied",): BATCHES * len(mine), ("skipped",): 0}
        assert m.value("qstate_shard_commit_seconds_count", **OP) == BATCHES  # one call each
        assert m.value("qstate_shard_applied_rows_total", **OP) == BATCHES * len(keys)
        assert m.value("qstate_shard_last_batch", **OP) == LAST
        assert m.value("qstate_shard_watermark_ms", **OP) == LAST * WINDOW
        size = m.value("qstate_shard_rocksdb_bytes", **OP)
        assert size == data_bytes(data_dir, shard, mine) > 0
        # the server's one RocksDB budget, as configured; the batches' rows in memtables
        # charged to its cache
        memory = {kind: v for (kind,), v in m.by("qstate_shard_rocksdb_memory_bytes",
                                                  "kind").items()}
        assert memory["budget"] == SHARD_MEMORY_MB << 20
        assert 0 < memory["memtables"] <= memory["cache"] < memory["budget"], memory
        no_key_in_labels(m)
    assert serving == P


@pytest.mark.parametrize("route", ROUTES)
def test_router_counts_requests_by_route_template_status_and_read_path(
        deployment: tuple[Shop, Path], route: str) -> None:
    shop, _ = deployment
    url = shop.routers[route].url
    shards = [shop.metrics_url(s) for s in shop.shards]
    found = [KEYS[0], KEYS[1], "ünï/cødé key", "a" * 1024, BIG]
    batch = MANY[:10]
    before, shards_before = scrape(url), [scrape(u) for u in shards]
    with httpx.Client(base_url=url, timeout=10) as c:
        for k in found:
            assert c.get(f"/v1/state/shop/views_1m/views/{k}").status_code == 200
        for k in ("never-written", "never-written-2"):
            assert c.get(f"/v1/state/shop/views_1m/views/{k}").status_code == 404
        assert c.get("/v1/state/sh%20op/views_1m/views/page-1").status_code == 400
        assert c.post("/v1/state/shop/views_1m/views:batchGet",
                      json={"keys": batch}).status_code == 200
        assert c.get("/v1/jobs").status_code == 200
        assert c.get("/v1/jobs/shop").status_code == 200
        assert c.get("/v1/jobs/nope").status_code == 404
        assert c.get("/no/such/page-9").status_code == 404
        assert c.delete("/v1/jobs").status_code == 405
    after = scrape(url)

    def delta(name: str, *keys: str) -> dict[tuple[str, ...], float]:
        b, a = before.by(name, *keys), after.by(name, *keys)
        out = {k: v - b.get(k, 0.0) for k, v in a.items() if k[0] != "/metrics"}
        return {k: v for k, v in out.items() if v}

    assert delta("qstate_router_http_requests_total", "route", "method", "status") == {
        (STATE, "GET", "200"): len(found), (STATE, "GET", "404"): 2, (STATE, "GET", "400"): 1,
        (BATCH, "POST", "200"): 1, ("/v1/jobs", "GET", "200"): 1,
        ("/v1/jobs/{job}", "GET", "200"): 1, ("/v1/jobs/{job}", "GET", "404"): 1,
        ("unmatched", "GET", "404"): 1, ("/v1/jobs", "DELETE", "405"): 1}
    assert delta("qstate_router_http_request_seconds_count", "route") == {
        (STATE,): len(found) + 3, (BATCH,): 1, ("/v1/jobs",): 2, ("/v1/jobs/{job}",): 2,
        ("unmatched",): 1}
    # every key asked was read once, through this router's path
    read = len(found) + 2 + len(batch)
    assert delta(READS, "path") == {(READ_PATH[route],): read}
    # ... and the shards saw exactly the remote reads (their readers' and their Python's)
    looked_up: dict[str, float] = {}
    for u, b in zip(shards, shards_before, strict=True):
        a = scrape(u)
        for series in ("qstate_shard_reader_keys_total", "qstate_shard_lookup_keys_total"):
            for (status,), v in a.by(series, "status").items():
                n = v - b.by(series, "status").get((status,), 0.0)
                if n:
                    looked_up[status] = looked_up.get(status, 0) + n
        no_key_in_labels(a)
    assert looked_up == ({} if route == "local" else {"FOUND": len(found) + len(batch),
                                                      "ABSENT": 2})
    no_key_in_labels(after)


def test_a_refused_commit_is_counted_by_its_error(deployment: tuple[Shop, Path]) -> None:
    shop, _ = deployment
    shard = shop.shards[0]
    mine = owned(shop, shard)[:2]
    req = spb.CommitRequest(job=SPEC.job, operator=SPEC.operator, batch=BATCHES,
                            watermark_ms=BATCHES * WINDOW, epoch=0)  # a stale writer
    for p in mine:
        req.partitions.add(partition=p, has_delta=False)
    # a stale writer of this deployment holds its cluster token (the host's, from home)
    with security.channel(shard.address, Settings(), []) as ch, \
            pytest.raises(grpc.RpcError) as err:
        spb_grpc.ShardStub(ch).Commit(req, timeout=10)
    assert err.value.code() == grpc.StatusCode.ABORTED
    m = scrape(shop.metrics_url(shard))
    assert m.by("qstate_shard_commits_total", "result") == {
        ("applied",): BATCHES * len(owned(shop, shard)), ("skipped",): 0,
        ("StaleEpoch",): len(mine)}


def unavailable(url: str) -> dict[str, float]:
    return {r: v for (r,), v in scrape(url).by("qstate_router_unavailable_total",
                                                "reason").items()}


def test_503s_are_counted_by_reason(deployment: tuple[Shop, Path]) -> None:
    shop, _ = deployment
    # an operator the job never assigned: its partitions have no shard server
    save_spec(shop.storage, OperatorSpec(SPEC.job, "unassigned_1m", "page", {"views": "long"},
                                         partitions=P, window=WindowSpec("tumbling", WINDOW)))
    before = {r: unavailable(router.url) for r, router in shop.routers.items()}
    for router in shop.routers.values():
        r = httpx.get(f"{router.url}/v1/state/shop/unassigned_1m/views/page-1", timeout=10)
        assert r.status_code == 503, r.text
    with shop.shard_down(shop.shards[1]) as key:
        for router in shop.routers.values():
            r = httpx.get(f"{router.url}/v1/state/shop/views_1m/views/{key}", timeout=10)
            assert r.status_code == 503, r.text
            with grpc.insecure_channel(router.grpc_address) as ch, \
                    pytest.raises(grpc.RpcError) as err:
                qpb_grpc.QueryableStateStub(ch).Get(qpb.GetRequest(
                    job="shop", operator="views_1m", state="views", key=key), timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        after = {r: unavailable(router.url) for r, router in shop.routers.items()}
    for name in shop.routers:
        got = {reason: n - before[name].get(reason, 0.0) for reason, n in after[name].items()}
        assert {k: v for k, v in got.items() if v} == {"no-owner": 1, "shard-down": 2}, name


def test_a_restarted_shard_reports_its_partitions_before_any_commit(
        deployment: tuple[Shop, Path]) -> None:
    """No commit since the restart: what it holds is still on its /metrics."""
    shop, data_dir = deployment
    shard = shop.shards[0]
    mine = owned(shop, shard)
    shard.stop()
    shard.start_and_wait()
    url = metrics_url(shop.storage, shard)
    wait_until(lambda: by_state(scrape(url)) == {"serving": len(mine), "restoring": 0,
                                                 "retired": 0}, 30, "partitions serving")
    m = scrape(url)
    assert m.value("qstate_shard_commits_total", **OP, result="applied") == 0
    assert m.value("qstate_shard_last_batch", **OP) == LAST
    assert m.value("qstate_shard_watermark_ms", **OP) == LAST * WINDOW
    # reopening may flush the WAL into a table file: wait for the next folder scan
    wait_until(lambda: scrape(url).value("qstate_shard_rocksdb_bytes", **OP)
               == data_bytes(data_dir, shard, mine) > 0, 30, "the size of what it holds")


def test_partitions_that_moved_away_are_retired(tmp_path: Path) -> None:
    """A second server joins, takes its share: the first reports those partitions retired
    (their folders stay on its disk) and counts only what it holds in its size."""
    storage = Storage(str(tmp_path / "storage"))
    save_spec(storage, SPEC)
    data_dir, logs = tmp_path / "data", tmp_path / "logs"
    first = ShardProcess.make("first", data_dir, storage.uri, logs).start_and_wait()
    shards = [first]
    try:
        alone = Coordinator(storage, SPEC.job, [first.address])
        alone.register(SPEC)
        commit_batch(storage, alone, 0)
        alone.stop()
        second = ShardProcess.make("second", data_dir, storage.uri, logs).start_and_wait()
        shards.append(second)
        both = Coordinator(storage, SPEC.job, [first.address, second.address])
        both.register(SPEC)  # a new coordinator: a new epoch over both servers
        # make-before-break: second follows its share first, then takes it over
        wait_until(lambda: second.address in both.assignment.partitions_of(SPEC.operator), 30,
                   "second taking over its share")
        both.stop()
        moved = both.assignment.partitions_of(SPEC.operator)[second.address]
        kept = [p for p in range(P) if p not in moved]
        assert 0 < len(moved) < P
        urls = {s.address: metrics_url(storage, s) for s in shards}
        wait_until(lambda: by_state(scrape(urls[first.address])) == {
            "serving": len(kept), "restoring": 0, "retired": len(moved)}, 30, "first: retired")
        wait_until(lambda: by_state(scrape(urls[second.address])) == {
            "serving": len(moved), "restoring": 0, "retired": 0}, 30, "second: serving")
        wait_until(lambda: scrape(urls[first.address]).value("qstate_shard_rocksdb_bytes", **OP)
                   == data_bytes(data_dir, first, kept) > 0, 30, "first: size of what it holds")
    finally:
        for s in shards:
            s.stop()


def test_a_fresh_router_shows_every_error_series_at_zero(deployment: tuple[Shop, Path],
                                                         tmp_path: Path) -> None:
    """Before any request, each reason a router counts has its series at 0, so a dashboard
    panel shows 0, not "No data", on a fresh deployment."""
    from qstate.router.metrics import UNAVAILABLE_REASONS

    shop, _ = deployment
    router = RouterProcess.make(shop.storage.uri, tmp_path, "fresh").start_and_wait()
    try:
        m = scrape(router.url)
    finally:
        router.stop()
    assert m.by("qstate_router_unavailable_total", "reason") == {
        (r,): 0.0 for r in UNAVAILABLE_REASONS}
    assert m.by("qstate_router_refused_total", "reason") == {
        (r,): 0.0 for r in ("unauthenticated", "forbidden", "too-large", "overloaded")}
    methods = set(qpb.DESCRIPTOR.services_by_name["QueryableState"].methods_by_name)
    assert m.by("qstate_router_grpc_requests_total", "method", "code") == {
        (method, "OK"): 0.0 for method in methods}
    assert {"Get", "MultiGet"} <= methods
