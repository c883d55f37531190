"""Read your writes (issue 27): ``min_batch=N`` on a read answers as of batch N or a later
one. A read asked before N is committed waits for it (up to QSTATE_MIN_BATCH_WAIT_S) and
answers once the partition has it; past the wait, a 503 + Retry-After names the batch the
partition has. HTTP (fast path, batchGet, series) and gRPC alike, on a shop of its own."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import grpc
import httpx
import pytest

from qstate.client import Client
from qstate.proto import qstate_pb2 as qpb
from qstate.proto import qstate_pb2_grpc as qpb_grpc
from tests.helpers import metric, wait_until
from tests.shop import BATCHES, KEYS, Shop, held_until_commit, own_shop, shard_reads, views, window

KEY = KEYS[3]
OP = "/v1/state/shop/views_1m/views"


@pytest.fixture(scope="module")
def own(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shop]:
    """A shop of its own: these tests commit a batch the session's shop must not see."""
    with own_shop(tmp_path_factory.mktemp("min-batch"), min_batch_wait_s=30) as s:
        yield s


def test_a_read_asked_before_its_batch_answers_once_the_batch_is_committed(own: Shop) -> None:
    """Each front end asks for a batch not committed yet; each is seen waiting (its router
    reads its keys again while it has no answer), then the batch is committed and each
    answers as of it. Three rounds (three commits), one ask a router in each: the point GET
    and gRPC Get, then batchGet and the Python client, then several states in one read."""
    local, remote = own.routers["local"], own.routers["grpc"]
    have = BATCHES - 1
    now = httpx.get(f"{local.url}{OP}/{KEY}", params={"min_batch": have}, timeout=10)
    assert now.status_code == 200 and now.json()["batch"] == have

    def http_get(want: int) -> dict:
        r = httpx.get(f"{local.url}{OP}/{KEY}", params={"min_batch": want}, timeout=60)
        assert r.status_code == 200, r.text
        return dict(r.json())

    def batch_get(want: int) -> list:
        r = httpx.post(f"{local.url}{OP}:batchGet", params={"min_batch": want},
                       json={"keys": KEYS[:20]}, timeout=60)
        assert r.status_code == 200, r.text
        return list(r.json()["results"])

    def grpc_get(want: int) -> qpb.StateValue:
        with grpc.insecure_channel(remote.grpc_address) as ch:
            return qpb_grpc.QueryableStateStub(ch).Get(qpb.GetRequest(
                job="shop", operator="views_1m", state="views", key=KEY, min_batch=want),
                timeout=60)

    def client_get(want: int) -> int:
        with Client(remote.url, timeout=60) as c:
            return c.get("shop", "views_1m", "views", KEY, min_batch=want).batch

    b = BATCHES
    got, rpc = held_until_commit(own, b, [("local", 1, partial(http_get, b)),
                                          ("grpc", 1, partial(grpc_get, b))])
    start = window(b)[0]
    assert got["batch"] >= b and got["windows"][-1] == {
        "start": start, "end": start + window(0)[1], "value": views(KEY, b)}
    assert rpc.batch >= b and rpc.windows[-1].int_value == views(KEY, b)

    b = BATCHES + 1
    many, client_batch = held_until_commit(own, b, [("local", 20, partial(batch_get, b)),
                                                    ("grpc", 1, partial(client_get, b))])
    assert all(a["batch"] >= b and a["windows"][-1]["value"] == views(a["key"], b)
               for a in many)
    assert len(many) == 20 and client_batch >= b

    # several states of one operator, which the local router reads off each key's record
    # at once: still held to min_batch, then every state as of it
    def states_get(want: int) -> list:
        r = httpx.post(f"{local.url}/v1/state/shop/views_1m:batchGet", params={"min_batch": want},
                       json={"keys": KEYS[:10], "states": ["views", "avg_ms"]}, timeout=60)
        assert r.status_code == 200, r.text
        return list(r.json()["results"])

    b = BATCHES + 2
    [both] = held_until_commit(own, b, [("local", 10, partial(states_get, b))])
    assert [(a["key"], a["state"]) for a in both] == [
        (k, s) for k in KEYS[:10] for s in ("views", "avg_ms")]
    assert all(a["batch"] >= b for a in both)
    assert [a["windows"][-1]["value"] for a in both if a["state"] == "views"] == [
        views(k, b) for k in KEYS[:10]]


def test_past_the_wait_a_503_names_the_batch_the_partition_has(own: Shop,
                                                               tmp_path: Path) -> None:
    with own.router_with(tmp_path / "logs", "impatient", QSTATE_MIN_BATCH_WAIT_S="0.3") as r:
        far = 10**9
        for path in (f"{OP}/{KEY}", f"/v1/series/shop/views_1m/views/{KEY}"):
            got = httpx.get(f"{r.url}{path}", params={"min_batch": far}, timeout=10)
            assert got.status_code == 503 and "Retry-After" in got.headers, got.text
            body = got.json()
            assert body["error"] == "Unavailable" and f"not yet at min_batch {far}" in \
                body["message"] and body["batch"] < far
        # several states of one operator in one read too
        got = httpx.post(f"{r.url}/v1/state/shop/views_1m:batchGet", params={"min_batch": far},
                         json={"keys": KEYS[:5], "states": ["views", "avg_ms"]}, timeout=10)
        assert got.status_code == 503 and "Retry-After" in got.headers, got.text
        assert f"not yet at min_batch {far}" in got.json()["message"]
        for bad in ("-1", "x", "1.5"):
            for path in (f"{OP}/{KEY}", f"/v1/series/shop/views_1m/views/{KEY}"):
                refused = httpx.get(f"{r.url}{path}", params={"min_batch": bad}, timeout=10)
                assert refused.status_code == 400 and "min_batch" in refused.text, refused.text
        with grpc.insecure_channel(r.grpc_address) as ch, pytest.raises(grpc.RpcError) as err:
            qpb_grpc.QueryableStateStub(ch).Get(qpb.GetRequest(
                job="shop", operator="views_1m", state="views", key=KEY, min_batch=far),
                timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]


def test_a_read_waiting_when_the_router_stops_is_answered_before_it_goes(
        own: Shop, tmp_path: Path) -> None:
    """SIGTERM while a read waits for its batch: the front takes no new connection, and the
    read under way is answered (its 503 past the wait, shorter than the router's 2 s grace,
    service/router/front.py) before the router exits, never cut off (docs/architecture.md §5,
    the native front's threads)."""
    with own.router_with(tmp_path / "logs", "stopping", QSTATE_MIN_BATCH_WAIT_S="1") as r:
        before = sum(shard_reads(r.url).values())
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(httpx.get, f"{r.url}{OP}/{KEY}",
                                  params={"min_batch": 10**9}, timeout=30)
            wait_until(lambda: sum(shard_reads(r.url).values()) >= before + 2, 30,
                       "the read asked again while it waits for its batch")
            assert r.proc is not None
            r.proc.terminate()
            got = waiting.result(30)
        assert got.status_code == 503, got.text
        assert "not yet at min_batch" in got.json()["message"]
        assert r.proc.wait(30) == 0
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{r.url}{OP}/{KEY}", timeout=5)


def test_the_router_catches_a_partition_read_lately_up_off_the_read_path(own: Shop) -> None:
    """After a commit the read engine's follower (QSTATE_ROUTER_FOLLOW_MS, on by default)
    catches a partition read lately up with its shard before a read has to: the router's
    ``qstate_router_catchup_seconds{by="follower"}`` counts it, and the next read answers
    the new batch (docs/architecture.md §5)."""
    url = own.routers["local"].url
    now = httpx.get(f"{url}{OP}/{KEY}", timeout=10)
    assert now.status_code == 200, now.text
    b = now.json()["batch"] + 1

    def by_follower() -> float:
        return metric(url, "qstate_router_catchup_seconds_count", by="follower")

    before = by_follower()
    own.commit(b)
    wait_until(lambda: by_follower() > before, 30, f"the follower catching up to batch {b}")
    after = httpx.get(f"{url}{OP}/{KEY}", timeout=10).json()
    assert after["batch"] >= b and after["windows"][-1]["value"] == views(KEY, b)
