"""The router over real sockets: HTTP and gRPC against shard server processes."""

from __future__ import annotations

import re
import time
from pathlib import Path

import grpc
import httpx
import pyarrow as pa
import pytest

from jobs.coordinator import Coordinator
from proto import qstate_pb2 as qpb
from proto import qstate_pb2_grpc as qpb_grpc
from service.client import Client
from service.core import delta as deltas
from service.core.address import PartitionId, partition_of
from service.core.errors import QStateError, Unavailable
from service.core.operator import OperatorSpec, WindowSpec, save_spec
from service.core.storage import Storage
from service.embedded.procs import RouterProcess, ShardProcess

P = 8
SPEC = OperatorSpec("shop", "views_1m", "page", {"views": "long", "avg_ms": "double"},
                    partitions=P, window=WindowSpec("tumbling", 60_000))
KEYS = [f"page-{i}" for i in range(200)] + ["ünï/cødé key", "a" * 1024]


def value(key: str, w: int) -> int:
    return (sum(map(ord, key)) * (w + 1)) % 1000 + 1


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp: Path = tmp_path_factory.mktemp("router")
    storage = Storage(str(tmp / "storage"))
    save_spec(storage, SPEC)
    shards = [ShardProcess.make(f"r{i}", tmp / "data", storage.uri, tmp / "logs").start_and_wait()
              for i in range(2)]
    coord = Coordinator(storage, "shop", [s.address for s in shards])
    coord.register(SPEC)
    # three one-minute windows per key, one batch each
    for batch in range(3):
        written = {}
        for p in range(P):
            mine = [k for k in KEYS if partition_of(k, P) == p]
            t = pa.table({"key": mine, "start": [batch * 60_000] * len(mine),
                          "end": [(batch + 1) * 60_000] * len(mine),
                          "views": [value(k, batch) for k in mine],
                          "avg_ms": [0.25 * batch] * len(mine)}).cast(deltas.delta_schema(SPEC))
            deltas.write_delta(storage, PartitionId(SPEC.job, SPEC.operator, p), batch, t)
            written[p] = t.num_rows
        coord.commit(SPEC, batch, batch * 60_000, written)
    router = RouterProcess.make(storage.uri, tmp / "logs").start_and_wait()
    yield storage, shards, router, coord
    coord.stop()
    router.stop()
    for s in shards:
        s.stop()


def test_http_latest_range_and_batch_get(cluster) -> None:
    _, _, router, _ = cluster
    with Client(router.url) as c:
        for k in KEYS:
            v = c.get("shop", "views_1m", "views", k)
            assert (v.batch, v.watermark) == (2, 120_000)
            assert [(w.start, w.end, w.value) for w in v.windows] == [
                (120_000, 180_000, value(k, 2))]
        h = c.history("shop", "views_1m", "views", KEYS[0], 0, 120_000)
        assert [(w.start, w.value) for w in h.windows] == [(0, value(KEYS[0], 0)),
                                                           (60_000, value(KEYS[0], 1))]
        iso = c.get("shop", "views_1m", "avg_ms", KEYS[1], from_="1970-01-01T00:01:00Z")
        assert [(w.start, w.value) for w in iso.windows] == [(60_000, 0.25), (120_000, 0.5)]
        many = c.multi_get("shop", "views_1m", "views", [*KEYS[:50], "nope"])
        assert [m.found for m in many] == [True] * 50 + [False]
        assert [m.latest.value for m in many[:50]] == [value(k, 2) for k in KEYS[:50]]
        assert many[-1].batch == 2 and many[-1].windows == []
    r = httpx.get(f"{router.url}/v1/jobs/shop")
    [op] = r.json()["operators"]
    assert (op["name"], op["partitions"], op["partitions_available"], op["last_batch"]) == (
        "views_1m", P, P, 2)
    assert httpx.get(f"{router.url}/v1/jobs").json() == {
        "jobs": [{"name": "shop", "operators": ["views_1m"]}]}
    metrics = httpx.get(f"{router.url}/metrics").text
    assert "qstate_router_http_requests_total" in metrics
    # the shards run on this host: lookups are read in-process, not over gRPC
    local = re.search(r'qstate_router_shard_reads_total\{path="local"\} ([\d.e+]+)', metrics)
    assert local and float(local.group(1)) >= len(KEYS)
    assert httpx.get(f"{router.url}/openapi.json").json()["paths"]


@pytest.mark.parametrize(("path", "status", "text"), [
    ("/v1/state/nojob/views_1m/views/k", 404, "unknown job 'nojob'"),
    ("/v1/state/shop/nop/views/k", 404, "no operator 'nop'"),
    ("/v1/state/shop/views_1m/clicks/k", 404, "no state 'clicks'"),
    ("/v1/state/shop/views_1m/views/absent-key", 404, "as of batch 2"),
    ("/v1/state/sh%20op/views_1m/views/k", 400, "A-Z a-z 0-9"),
    ("/v1/state/shop/views_1m/views/" + "k" * 1025, 400, "at most 1024"),
    ("/v1/state/shop/views_1m/views/k?from=yesterday", 400, "ISO-8601"),
    ("/v1/state/shop/views_1m/views/k?from=10&to=5", 400, "must be after"),
])
def test_http_errors_say_what_is_wrong(cluster, path: str, status: int, text: str) -> None:
    _, _, router, _ = cluster
    r = httpx.get(router.url + path)
    assert r.status_code == status, r.text
    assert text in r.json()["message"]
    if "absent" in path:
        assert r.json()["batch"] == 2


def test_batch_get_limits(cluster) -> None:
    _, _, router, _ = cluster
    url = f"{router.url}/v1/state/shop/views_1m/views:batchGet"
    too_many = httpx.post(url, json={"keys": ["k"] * 1001})
    assert too_many.status_code == 400 and "at most 1000" in too_many.json()["message"]
    missing = httpx.post(url, json={"nokeys": 1})
    assert missing.status_code == 400 and "keys: Field required" in missing.json()["message"]


def test_grpc_get_multiget_and_errors(cluster) -> None:
    _, _, router, _ = cluster
    with grpc.insecure_channel(router.grpc_address) as ch:
        stub = qpb_grpc.QueryableStateStub(ch)
        v = stub.Get(qpb.GetRequest(job="shop", operator="views_1m", state="views",
                                    key=KEYS[3]), timeout=5)
        assert (v.found, v.batch, [(w.start_ms, w.int_value) for w in v.windows]) == (
            True, 2, [(120_000, value(KEYS[3], 2))])
        r = stub.Get(qpb.GetRequest(job="shop", operator="views_1m", state="avg_ms",
                                    key=KEYS[3], from_ms=0, to_ms=10**13), timeout=5)
        assert [w.double_value for w in r.windows] == [0.0, 0.25, 0.5]
        m = stub.MultiGet(qpb.MultiGetRequest(job="shop", operator="views_1m", state="views",
                                              keys=KEYS), timeout=5)
        assert [x.windows[0].int_value for x in m.results] == [value(k, 2) for k in KEYS]
        d = stub.DescribeJob(qpb.DescribeJobRequest(job="shop"), timeout=5)
        assert (d.operators[0].last_batch, d.operators[0].states[1].type) == (2, "double")
        for req, code in [
            (qpb.GetRequest(job="x", operator="views_1m", state="views", key="k"),
             grpc.StatusCode.NOT_FOUND),
            (qpb.GetRequest(job="shop", operator="views_1m", state="views", key="nope"),
             grpc.StatusCode.NOT_FOUND),
            (qpb.GetRequest(job="b/d", operator="views_1m", state="views", key="k"),
             grpc.StatusCode.INVALID_ARGUMENT),
        ]:
            with pytest.raises(grpc.RpcError) as err:
                stub.Get(req, timeout=5)
            assert err.value.code() == code


def test_killed_shard_is_a_fast_503_while_other_shards_answer(cluster) -> None:
    _storage, shards, router, coord = cluster
    victim = shards[1]
    owned = set(coord.assignment.partitions_of("views_1m")[victim.address])
    dead_key = next(k for k in KEYS if partition_of(k, P) in owned)
    live_key = next(k for k in KEYS if partition_of(k, P) not in owned)
    victim.kill()
    try:
        for _ in range(3):
            t0 = time.perf_counter()
            r = httpx.get(f"{router.url}/v1/state/shop/views_1m/views/{dead_key}", timeout=5)
            took = time.perf_counter() - t0
            assert r.status_code == 503, r.text
            assert took < 1.0 and int(r.headers["Retry-After"]) >= 1
            assert victim.address in r.json()["message"]
            ok = httpx.get(f"{router.url}/v1/state/shop/views_1m/views/{live_key}", timeout=5)
            assert ok.status_code == 200
        with pytest.raises(QStateError) as err, Client(router.url, retries=1,
                                                          backoff_s=0.05) as c:
            c.get("shop", "views_1m", "views", dead_key)
        assert isinstance(err.value, Unavailable) and err.value.http_status == 503
        with grpc.insecure_channel(router.grpc_address) as ch:
            with pytest.raises(grpc.RpcError) as gerr:
                qpb_grpc.QueryableStateStub(ch).Get(qpb.GetRequest(
                    job="shop", operator="views_1m", state="views", key=dead_key), timeout=5)
            assert gerr.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        victim.start_and_wait()
    # back after restart, from its own RocksDB
    with Client(router.url, retries=5) as c:
        assert c.get("shop", "views_1m", "views", dead_key).latest.value == value(dead_key, 2)
