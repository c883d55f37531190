"""The router over real sockets: HTTP and gRPC against shard server processes.

Every answer is compared with what the shop fixture committed (tests/shop.py), through both
read paths: in-process from a co-located shard (router ``local``) and over the shard's
internal gRPC API (router ``grpc``); the router's own metric says which path served
(``qstate_router_shard_reads_total{path="local"|"remote"}``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import h11
import httpx
import orjson
import pytest

from qstate.client import Client
from qstate.core.address import partition_of
from qstate.core.errors import Unavailable
from qstate.embedded.procs import RouterProcess
from qstate.proto import qstate_pb2 as qpb
from qstate.proto import qstate_pb2_grpc as qpb_grpc
from qstate.router.engine import ENGINE_THREADS
from tests.helpers import metric, wait_until
from tests.service.router.test_coalescing import calls_of
from tests.shop import (
    BATCHES,
    KEYS,
    MANY,
    ROUTES,
    WINDOW,
    P,
    Shop,
    avg_ms,
    shard_reads,
    views,
    window,
)

LAST = BATCHES - 1
MAX_BATCH = 2000  # keys a router's MultiGet carries at most (engine/core/src/remote.rs)


@pytest.fixture(params=ROUTES)
def route(request: pytest.FixtureRequest, shop: Shop) -> str:
    return str(request.param)


def test_latest_range_and_batch_get_through_both_read_paths(shop: Shop, route: str) -> None:
    router = shop.routers[route]
    with shop.served_by(route, len(KEYS) + 2 + 51), Client(router.url) as c:
        for k in KEYS:
            v = c.get("shop", "views_1m", "views", k)
            assert (v.found, v.batch, v.watermark) == (True, LAST, LAST * WINDOW)
            assert [(w.start, w.end, w.value) for w in v.windows] == [
                (*window(LAST), views(k, LAST))]
        h = c.history("shop", "views_1m", "views", KEYS[0], 0, 2 * WINDOW)
        assert [(w.start, w.value) for w in h.windows] == [(0, views(KEYS[0], 0)),
                                                           (WINDOW, views(KEYS[0], 1))]
        iso = c.get("shop", "views_1m", "avg_ms", KEYS[1], from_="1970-01-01T00:01:00Z")
        assert [(w.start, w.value) for w in iso.windows] == [(WINDOW, avg_ms(1)),
                                                             (2 * WINDOW, avg_ms(2))]
        many = c.multi_get("shop", "views_1m", "views", [*KEYS[:50], "nope"])
        assert [m.found for m in many] == [True] * 50 + [False]
        assert [m.windows[-1].value for m in many[:50]] == [views(k, LAST) for k in KEYS[:50]]
        assert many[-1].batch == LAST and many[-1].windows == []


def test_jobs_and_describe(shop: Shop, route: str) -> None:
    router = shop.routers[route]
    [op] = httpx.get(f"{router.url}/v1/jobs/shop").json()["operators"]
    assert (op["name"], op["partitions"], op["partitions_available"], op["last_batch"],
            op["watermark"]) == ("views_1m", P, P, LAST, LAST * WINDOW)
    assert httpx.get(f"{router.url}/v1/jobs").json() == {
        "jobs": [{"name": "shop", "operators": ["views_1m"]}]}


@pytest.mark.parametrize(("path", "status", "error", "text"), [
    ("/v1/state/nojob/views_1m/views/k", 404, "UnknownOperator", 'unknown job "nojob"'),
    ("/v1/state/shop/nop/views/k", 404, "UnknownOperator", 'no operator "nop"'),
    ("/v1/state/shop/views_1m/clicks/k", 404, "UnknownOperator", 'no state "clicks"'),
    ("/v1/state/shop/views_1m/views/absent-key", 404, "NotFound", f"as of batch {LAST}"),
    ("/v1/state/sh%20op/views_1m/views/k", 400, "InvalidAddress", "A-Z a-z 0-9"),
    ("/v1/state/shop/views_1m/views/" + "k" * 1025, 400, "InvalidAddress", "at most 1024"),
    ("/v1/state/shop/views_1m/views/k?from=yesterday", 400, "InvalidRequest", "ISO-8601"),
    ("/v1/state/shop/views_1m/views/k?from=10&to=5", 400, "InvalidRequest", "must be after"),
])
def test_http_errors_say_what_is_wrong(shop: Shop, route: str, path: str, status: int,
                                       error: str, text: str) -> None:
    r = httpx.get(shop.routers[route].url + path)
    assert r.status_code == status, r.text
    assert r.json()["error"] == error and text in r.json()["message"]
    if "absent" in path:
        assert (r.json()["batch"], r.json()["watermark"]) == (LAST, LAST * WINDOW)


def test_batch_get_limits(shop: Shop, route: str) -> None:
    url = f"{shop.routers[route].url}/v1/state/shop/views_1m/views:batchGet"
    too_many = httpx.post(url, json={"keys": ["k"] * 1001})
    assert too_many.status_code == 400 and "at most 1000" in too_many.json()["message"]
    missing = httpx.post(url, json={"nokeys": 1})
    assert missing.status_code == 400 and "unknown field `nokeys`" in missing.json()["message"]
    assert missing.json()["error"] == "InvalidRequest"


def test_grpc_get_multiget_and_errors(shop: Shop, route: str) -> None:
    with grpc.insecure_channel(shop.routers[route].grpc_address) as ch:
        stub = qpb_grpc.QueryableStateStub(ch)
        v = stub.Get(qpb.GetRequest(job="shop", operator="views_1m", state="views",
                                    key=KEYS[3]), timeout=5)
        assert (v.found, v.batch, [(w.start_ms, w.int_value) for w in v.windows]) == (
            True, LAST, [(window(LAST)[0], views(KEYS[3], LAST))])
        r = stub.Get(qpb.GetRequest(job="shop", operator="views_1m", state="avg_ms",
                                    key=KEYS[3], from_ms=0, to_ms=10**13), timeout=5)
        assert [w.double_value for w in r.windows] == [avg_ms(b) for b in range(BATCHES)]
        m = stub.MultiGet(qpb.MultiGetRequest(job="shop", operator="views_1m", state="views",
                                              keys=KEYS), timeout=5)
        assert [x.windows[0].int_value for x in m.results] == [views(k, LAST) for k in KEYS]
        d = stub.DescribeJob(qpb.DescribeJobRequest(job="shop"), timeout=5)
        assert (d.operators[0].last_batch, d.operators[0].states[1].type) == (LAST, "double")
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


Answers = list[tuple[str, int, int]]  # key, batch, latest value


async def _batch_gets(url: str, _: str, keys: list[str]) -> Answers:
    """Three batchGet requests of 800 keys at once."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        rs = await asyncio.gather(*(
            c.post("/v1/state/shop/views_1m/views:batchGet", json={"keys": keys[i:i + 800]})
            for i in range(0, len(keys), 800)))
    return [(x["key"], x["batch"], x["windows"][0]["value"])
            for r in rs for x in r.json()["results"]]


async def _http_get(host: str, port: int, path: str) -> tuple[int, dict]:
    """One GET on its own connection (h11 speaks the protocol: no client pool in the way)."""
    reader, writer = await asyncio.open_connection(host, port)
    conn = h11.Connection(h11.CLIENT)
    writer.write(conn.send(h11.Request(method="GET", target=path, headers=[
        ("host", host), ("connection", "close")])) + conn.send(h11.EndOfMessage()))
    status, body = 0, b""
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await reader.read(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                return status, orjson.loads(body)
    finally:
        writer.close()


async def _http_gets(url: str, _: str, keys: list[str]) -> Answers:
    """One GET per key, every one at once, each on its own connection."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    rs = await asyncio.gather(*(_http_get(host, int(port), f"/v1/state/shop/views_1m/views/{k}")
                                for k in keys))
    assert {status for status, _ in rs} == {200}
    return [(b["key"], b["batch"], b["windows"][0]["value"]) for _, b in rs]


async def _grpc_gets(_: str, address: str, keys: list[str]) -> Answers:
    """One public gRPC Get per key, all at once on one channel."""
    async with grpc.aio.insecure_channel(address) as ch:
        stub = qpb_grpc.QueryableStateStub(ch)
        rs = await asyncio.gather(*(stub.Get(qpb.GetRequest(
            job="shop", operator="views_1m", state="views", key=k), timeout=60) for k in keys))
    return [(r.key, r.batch, r.windows[0].int_value) for r in rs]


@pytest.fixture(scope="module")
def patient(shop: Shop, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProcess]:
    """A router reading every key over the hop that waits as long as a paused owner takes."""
    with shop.router_with(tmp_path_factory.mktemp("patient"), "patient",
                          QSTATE_LOCAL_READS="false", QSTATE_SHARD_TIMEOUT_S="120") as r:
        yield r


@pytest.mark.parametrize("send", [_batch_gets, _http_gets, _grpc_gets],
                         ids=["batchGet", "http-get", "grpc-get"])
def test_concurrent_lookups_of_one_shard_are_coalesced(
        shop: Shop, patient: RouterProcess,
        send: Callable[[str, str, list[str]], Coroutine[None, None, Answers]]) -> None:
    """2,400 distinct keys of one shard asked while its owner cannot answer (paused): they
    wait in the router and leave together, in at most the two calls in flight before the
    pause plus 2,000 keys a call after it (remote.rs), not one call a key; every answer
    exact. Each front thread coalesces its own requests (its lane, remote.rs): a GET a
    connection spreads them over every thread (the router here has this process's
    ENGINE_THREADS, the same cores). Unpaused, how many share a call is the race of arrivals
    against the owner's answers, which a faster owner wins (692 calls of 2,400 keys in one CI
    run, 10 in another)."""
    owner = shop.owner_of(MANY[0])
    mine = [k for k in MANY if shop.owner_of(k) is owner][:2400]
    assert len(mine) == 2400
    # the router's channel to the owner is open before the pause
    with Client(patient.url) as c:
        assert c.get("shop", "views_1m", "views", mine[0]).windows[-1].value == \
            views(mine[0], LAST)
    shard_url = shop.metrics_url(owner)
    calls_before, reads_before = calls_of(shard_url), shard_reads(patient.url)
    with ThreadPoolExecutor(1) as pool:
        with shop.paused(owner):
            asked = pool.submit(asyncio.run, send(patient.url, patient.grpc_address, mine))
            wait_until(lambda: asked.done() or metric(
                patient.url, "qstate_router_shard_keys_waiting") >= len(mine), 60,
                "every key waiting for the paused owner")
        answers = asked.result(timeout=120)
    assert sorted(answers) == sorted((k, LAST, views(k, LAST)) for k in mine)
    reads = {p: n - reads_before[p] for p, n in shard_reads(patient.url).items()}
    assert reads["remote"] >= len(mine) and reads["local"] == 0, reads  # read remotely
    calls = calls_of(shard_url) - calls_before
    lanes = ENGINE_THREADS if send is _http_gets else 1  # one request, or one gRPC connection
    # each lane: two calls before the pause, then its keys 2,000 a call
    most = 2 * lanes + -(-len(mine) // MAX_BATCH) + lanes - 1
    assert 2 <= calls <= most, (calls, most)


def test_killed_shard_is_a_fast_503_while_other_shards_answer(shop: Shop, route: str) -> None:
    router = shop.routers[route]
    victim = shop.shards[1]
    live_key = next(k for k in KEYS if shop.owner_of(k) is not victim)
    def unavailable(reason: str) -> float:
        return metric(router.url, "qstate_router_unavailable_total", reason=reason)

    with shop.shard_down(victim) as dead_key:
        for _ in range(3):
            down, timeouts = unavailable("shard-down"), unavailable("shard-timeout")
            r = httpx.get(f"{router.url}/v1/state/shop/views_1m/views/{dead_key}", timeout=5)
            assert r.status_code == 503, r.text
            assert int(r.headers["Retry-After"]) >= 1
            # fast: the refused connection answered it, not the shard timeout run out
            assert (unavailable("shard-down") - down, unavailable("shard-timeout") - timeouts) \
                == (1, 0)
            body = r.json()
            assert body["error"] == "Unavailable" and victim.address in body["message"]
            assert body["partition"] == partition_of(dead_key, P)
            ok = httpx.get(f"{router.url}/v1/state/shop/views_1m/views/{live_key}", timeout=5)
            assert ok.status_code == 200
        with pytest.raises(Unavailable), Client(router.url, retries=1, backoff_s=0.05) as c:
            c.get("shop", "views_1m", "views", dead_key)
        with grpc.insecure_channel(router.grpc_address) as ch:
            with pytest.raises(grpc.RpcError) as gerr:
                qpb_grpc.QueryableStateStub(ch).Get(qpb.GetRequest(
                    job="shop", operator="views_1m", state="views", key=dead_key), timeout=5)
            assert gerr.value.code() == grpc.StatusCode.UNAVAILABLE
            assert dict(gerr.value.trailing_metadata())["retry-after-ms"] == "1000"
    # back after the restart, from its own RocksDB
    with Client(router.url, retries=8) as c:
        assert c.get("shop", "views_1m", "views", dead_key).windows[-1].value == \
            views(dead_key, LAST)


def test_an_unknown_job_names_the_jobs_served_and_the_storage(shop: Shop, route: str) -> None:
    """A router without client tokens names what it serves and where from (a typo is then
    plain); its start-up line says the same."""
    r = httpx.get(shop.routers[route].url + "/v1/state/shpo/views_1m/views/k")
    assert r.status_code == 404
    assert r.json()["message"] == (f'unknown job "shpo": this router serves "shop" (from '
                                   f"checkpoint storage {shop.storage.root})")
    ready = next(ln for ln in shop.routers[route].log_path.read_text().splitlines()
                 if ln.startswith("qstate router ready"))
    assert ready.endswith(f" storage={shop.storage.root} jobs=shop"), ready
