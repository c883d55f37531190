"""Top-N through the router (issue 27): ``GET /v1/top/...`` and gRPC ``Top`` over the shop's
shard processes, through both routers, against the ground truth the shop committed
(``views(key, batch)`` of every key: 6,203 keys over 8 partitions and two shards, values 1 to
1000, so ties cross partitions and are broken by key)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import grpc
import httpx
import pytest

from qstate.client import Client
from qstate.proto import qstate_pb2 as qpb
from qstate.proto import qstate_pb2_grpc as qpb_grpc
from tests.helpers import metric, wait_until
from tests.shop import (
    BATCHES,
    KEYS,
    MANY,
    ROUTES,
    WINDOW,
    P,
    Shop,
    avg_ms,
    held_until_commit,
    own_shop,
    shard_reads,
    views,
    window,
)

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


def test_top_n_is_the_ground_truth_through_both_routers(shop: Shop, route: str) -> None:
    url = shop.routers[route].url
    before = shard_reads(url)
    r = httpx.get(f"{url}{TOP}/views", timeout=10)
    assert r.status_code == 200, r.text
    # every partition from its owner, even on a router that reads co-located shards'
    # files for keys (docs/architecture.md §5)
    after = shard_reads(url)
    assert (after["remote"] - before["remote"], after["local"] - before["local"]) == (P, 0)
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
    full = truth(LAST, 10)
    with shop.shard_down(shop.shards[0]):
        down = metric(url, "qstate_router_unavailable_total", reason="shard-down")

        def answer() -> httpx.Response | None:
            r = httpx.get(f"{url}{TOP}/views", timeout=10)
            # until the router's next poll finds the owner gone, the board it keeps (every
            # partition as of LAST) may answer: whole, never short
            assert r.status_code == 503 or r.json()["entries"] == full, r.text
            return r if r.status_code == 503 else None

        r = wait_until(answer, 10, "the router answering 503 for the dead owner's partitions")
        assert isinstance(r, httpx.Response)
        assert int(r.headers["Retry-After"]) >= 1
        assert r.json()["error"] == "Unavailable" and shop.shards[0].address in \
            r.json()["message"]
        assert metric(url, "qstate_router_unavailable_total", reason="shard-down") > down
    with Client(url, retries=8) as c:
        assert [{"key": e.key, "value": e.value}
                for e in c.top("shop", "views_1m", "views").entries] == truth(LAST, 10)


@pytest.fixture(scope="module")
def own(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shop]:
    """A shop of its own: a test here commits a batch the session's shop must not see."""
    with own_shop(tmp_path_factory.mktemp("top"), min_batch_wait_s=30) as s:
        yield s


def test_a_board_is_read_once_per_batch_and_follows_each_commit(own: Shop) -> None:
    """A router keeps a board it was asked for current (re-read once per batch), and shards
    keep a partition's top-N until its batch moves on: the same board asked again is answered
    from those, a commit makes the next answers the new batch's; a read with min_batch asked
    before the commit answers once it is there."""
    url = own.routers["grpc"].url
    shard_urls = [own.metrics_url(s) for s in own.shards]

    def served(how: str) -> float:
        return sum(metric(u, "qstate_shard_top_partitions_total", how=how) for u in shard_urls)

    def board(**params: int) -> dict:
        r = httpx.get(f"{url}{TOP}/views", params={"n": 30, **params}, timeout=40)
        assert r.status_code == 200, r.text
        return dict(r.json())

    def kept() -> float:
        return metric(url, "qstate_router_top_answers_total", how="kept")

    reads = served("read")
    first = board()
    assert served("read") - reads >= P  # every partition read (a retried call reads again)
    reads, cached, router = served("read"), served("cached"), kept()
    assert board() == first  # the same board at the same batch: the router kept it ...
    assert (served("read") - reads, served("cached") - cached, kept() - router) == (0, 0, 1)
    # ... and a read that must ask the shards (min_batch) is answered from their cache
    assert board(min_batch=BATCHES - 1) == first
    assert (served("read") - reads, served("cached") - cached) == (0, P)
    # seen waiting (the router reads the P partitions again while it has no answer), then
    # answered by the commit
    [after] = held_until_commit(own, BATCHES, [("grpc", P, partial(board, min_batch=BATCHES))])
    assert after["batch"] == BATCHES and after["window"]["start"] == window(BATCHES)[0]
    assert after["entries"] == truth(BATCHES, 30)
    assert board() == after  # and no older board is served again
    own.commit(BATCHES + 1)  # the kept board follows by itself ...
    fresh = wait_until(lambda: (b := board())["batch"] == BATCHES + 1 and b, 10,
                       "the kept board following the commit")
    assert isinstance(fresh, dict) and fresh["entries"] == truth(BATCHES + 1, 30)
    reads, router = served("read"), kept()
    for _ in range(5):  # ... and answers every ask from memory until the next batch
        assert board() == fresh
    # every ask from memory; the shards may still be read by the polling that follows the
    # commit (a partition read mid-commit is read once more: at most one poll and one read
    # behind, docs/architecture.md §5), never once per ask
    assert kept() - router == 5
    assert served("read") - reads < P
