"""Top-N through the router (issue 27): ``GET /v1/top/...`` and gRPC ``Top`` over the shop's
shard processes, through both read paths, against the ground truth the shop committed
(``views(key, batch)`` of every key: 6,203 keys over 8 partitions and two shards, values 1 to
1000, so ties cross partitions and are broken by key)."""

from __future__ import annotations

import grpc
import httpx
import pytest

from qstate.client import Client
from qstate.proto import qstate_pb2 as qpb
from qstate.proto import qstate_pb2_grpc as qpb_grpc
from tests.helpers import metric
from tests.shop import BATCHES, KEYS, MANY, ROUTES, WINDOW, P, Shop, avg_ms, views, window

LAST = BATCHES - 1
TOP = "/v1/top/shop/views_1m"


@pytest.fixture(params=ROUTES)
def route(request: pytest.FixtureRequest, shop: Shop) -> str:
    return str(request.param)


def truth(batch: int, n: int, descending: bool = True) -> list[dict[str, object]]:
    """The n keys of batch ``batch``'s window by views, from the values the shop wrote."""
    ranked = sorted(KEYS + MANY, key=lambda k: (-views(k, batch) if descending
                                                 else views(k, batch), k))
    return [{"key": k, "value": views(k, batch)} for k in ranked[:n]]


def test_top_n_is_the_ground_truth_through_both_read_paths(shop: Shop, route: str) -> None:
    url = shop.routers[route].url
    with shop.served_by(route, P):  # every partition, on the router's own path
        r = httpx.get(f"{url}{TOP}/views", timeout=10)
    assert r.status_code == 200, r.text
    start, end = window(LAST)
    assert r.json() == {"job": "shop", "operator": "views_1m", "state": "views",
                        "window": {"start": start, "end": end}, "order": "desc",
                        "batch": LAST, "watermark": LAST * WINDOW, "entries": truth(LAST, 10)}
    cases: list[tuple[dict[str, str | int], list[dict[str, object]]]] = [
        ({"n": 300}, truth(LAST, 300)),
        ({"n": 250, "order": "asc"}, truth(LAST, 250, descending=False)),
        ({"n": 40, "window": "0"}, truth(0, 40)),
        # a time inside a window: the window it is in
        ({"n": 40, "window": str(WINDOW + 12_345)}, truth(1, 40)),
        ({"n": 5, "window": "1970-01-01T00:01:30Z", "order": "asc"},
         truth(1, 5, descending=False))]
    for params, want in cases:
        got = httpx.get(f"{url}{TOP}/views", params=params, timeout=10)
        assert got.status_code == 200, (params, got.text)
        assert got.json()["entries"] == want, params
    # a window nobody wrote: an empty leaderboard, not an error
    empty = httpx.get(f"{url}{TOP}/views", params={"window": str(50 * WINDOW)}, timeout=10)
    assert empty.status_code == 200 and empty.json()["entries"] == []
    # a double state where every key ties: the keys in order
    avg = httpx.get(f"{url}{TOP}/avg_ms", params={"n": 7}, timeout=10).json()
    assert avg["entries"] == [{"key": k, "value": avg_ms(LAST)}
                              for k in sorted(KEYS + MANY)[:7]]


def test_grpc_and_the_client_answer_the_same(shop: Shop, route: str) -> None:
    router = shop.routers[route]
    with grpc.insecure_channel(router.grpc_address) as ch:
        stub = qpb_grpc.QueryableStateStub(ch)
        r = stub.Top(qpb.TopRequest(job="shop", operator="views_1m", state="views", n=25),
                     timeout=10)
        asc = stub.Top(qpb.TopRequest(job="shop", operator="views_1m", state="views", n=25,
                                      ascending=True, window_start_ms=0), timeout=10)
        with pytest.raises(grpc.RpcError) as bad:
            stub.Top(qpb.TopRequest(job="shop", operator="views_1m", state="views",
                                    n=1_000_000), timeout=10)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "QSTATE_MAX_TOP_N" in (bad.value.details() or "")
    assert (r.start_ms, r.end_ms, r.batch, r.watermark_ms) == (*window(LAST), LAST,
                                                               LAST * WINDOW)
    assert [{"key": e.key, "value": e.int_value} for e in r.entries] == truth(LAST, 25)
    assert [{"key": e.key, "value": e.int_value} for e in asc.entries] == \
        truth(0, 25, descending=False)
    with Client(router.url) as c:
        t = c.top("shop", "views_1m", "views", n=12)
        assert (t.batch, t.window and (t.window.start, t.window.end)) == (LAST, window(LAST))
        assert [{"key": e.key, "value": e.value} for e in t.entries] == truth(LAST, 12)


@pytest.mark.parametrize(("query", "status", "words"), [
    ("views?n=0", 400, "n"),
    ("views?n=1001", 400, "n"),
    ("views?order=up", 400, "order"),
    ("views?window=yesterday", 400, "window"),
    ("nope", 404, "nope"),
])
def test_bad_top_requests_say_what_to_fix(shop: Shop, query: str, status: int,
                                          words: str) -> None:
    r = httpx.get(f"{shop.routers['local'].url}{TOP}/{query}", timeout=10)
    assert r.status_code == status, r.text
    assert words in r.json()["message"]


def test_a_partition_that_cannot_answer_is_a_503_never_a_short_board(shop: Shop,
                                                                    route: str) -> None:
    url = shop.routers[route].url
    with shop.shard_down(shop.shards[0]):
        down = metric(url, "qstate_router_unavailable_total", reason="shard-down")
        r = httpx.get(f"{url}{TOP}/views", timeout=10)
        assert r.status_code == 503, r.text
        assert int(r.headers["Retry-After"]) >= 1
        assert r.json()["error"] == "Unavailable" and shop.shards[0].address in \
            r.json()["message"]
        assert metric(url, "qstate_router_unavailable_total", reason="shard-down") > down
    with Client(url, retries=8) as c:
        assert [{"key": e.key, "value": e.value}
                for e in c.top("shop", "views_1m", "views").entries] == truth(LAST, 10)
