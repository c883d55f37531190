"""Windows per range answer: a ``limit`` (1..max_windows) on every front end, and an answer
cut short says where the next page starts (``next_from``; the series' ``Next-From``
header), so paging on from it yields every window exactly once. No silent cap. Over the
session's shop (three one-minute windows per key), through both routers: in-process reads
and reads over the shards' gRPC API."""

from __future__ import annotations

from typing import Any

import grpc
import httpx
import pytest

from qstate.proto import qstate_pb2 as qpb
from qstate.proto import qstate_pb2_grpc as qpb_grpc
from tests.shop import BATCHES, KEYS, ROUTES, SPEC, Shop, views, window

pytestmark = pytest.mark.security

STATE = f"/v1/state/{SPEC.job}/{SPEC.operator}/views"
SERIES = f"/v1/series/{SPEC.job}/{SPEC.operator}/views"
TRUTH = {k: [(window(b)[0], views(k, b)) for b in range(BATCHES)] for k in KEYS[:3]}


def _pairs(a: dict[str, Any]) -> list[tuple[int, int]]:
    return [(w["start"], w["value"]) for w in a["windows"]]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("limit", [1, 2])
def test_paging_a_state_yields_every_window_once(shop: Shop, route: str, limit: int) -> None:
    url = shop.routers[route].url
    for key, truth in TRUTH.items():
        got: list[tuple[int, int]] = []
        frm: int | None = 0
        for _ in range(BATCHES + 1):
            r = httpx.get(f"{url}{STATE}/{key}", timeout=10,
                          params={"from": str(frm), "to": "now", "limit": str(limit)})
            assert r.status_code == 200, r.text
            a = r.json()
            assert len(a["windows"]) <= limit
            got += _pairs(a)
            frm = a["next_from"]
            if frm is None:
                break
            assert frm == truth[len(got)][0]  # the start of the first window left out
        assert got == truth
    # a range that fits in the limit is whole and says nothing more
    full = httpx.get(f"{url}{STATE}/{KEYS[0]}", params={"from": "0", "limit": str(BATCHES)},
                     timeout=10).json()
    assert _pairs(full) == TRUTH[KEYS[0]] and full["next_from"] is None


@pytest.mark.parametrize("route", ROUTES)
def test_batch_get_and_series_page_too(shop: Shop, route: str) -> None:
    url = shop.routers[route].url
    keys = list(TRUTH)
    r = httpx.post(f"{url}{STATE}:batchGet", params={"from": "0", "limit": "2"},
                   json={"keys": keys}, timeout=10)
    assert r.status_code == 200
    for a in r.json()["results"]:
        assert _pairs(a) == TRUTH[a["key"]][:2]
        assert a["next_from"] == window(2)[0]
    s = httpx.get(f"{url}{SERIES}/{keys[0]}", params={"from": "0", "limit": "2"}, timeout=10)
    assert s.status_code == 200
    assert [(p["time"], p["value"]) for p in s.json()] == TRUTH[keys[0]][:2]
    assert s.headers["next-from"] == str(window(2)[0])
    rest = httpx.get(f"{url}{SERIES}/{keys[0]}", timeout=10,
                     params={"from": s.headers["next-from"], "limit": "2"})
    assert [(p["time"], p["value"]) for p in rest.json()] == TRUTH[keys[0]][2:]
    assert "next-from" not in rest.headers


@pytest.mark.parametrize("limit", ["0", "10001", "-1", "two", "1e3"])
@pytest.mark.parametrize("path", [STATE, SERIES])  # the fast path and FastAPI alike
def test_a_limit_out_of_bounds_is_400_saying_the_bounds(shop: Shop, path: str,
                                                        limit: str) -> None:
    r = httpx.get(f"{shop.routers['local'].url}{path}/{KEYS[0]}",
                  params={"from": "0", "limit": limit}, timeout=10)
    assert r.status_code == 400
    assert r.json()["error"] == "InvalidRequest"
    assert "1 to 10000" in r.json()["message"], r.json()


def test_grpc_takes_a_limit_and_answers_next_from(shop: Shop) -> None:
    key = KEYS[0]
    with grpc.insecure_channel(shop.routers["grpc"].grpc_address) as ch:
        stub = qpb_grpc.QueryableStateStub(ch)
        v = stub.Get(qpb.GetRequest(job=SPEC.job, operator=SPEC.operator, state="views",
                                    key=key, from_ms=0, limit=2), timeout=10)
        assert [(w.start_ms, w.int_value) for w in v.windows] == TRUTH[key][:2]
        assert v.HasField("next_from_ms") and v.next_from_ms == window(2)[0]
        rest = stub.Get(qpb.GetRequest(job=SPEC.job, operator=SPEC.operator, state="views",
                                       key=key, from_ms=v.next_from_ms, limit=2), timeout=10)
        assert [(w.start_ms, w.int_value) for w in rest.windows] == TRUTH[key][2:]
        assert not rest.HasField("next_from_ms")
        many = stub.MultiGet(qpb.MultiGetRequest(job=SPEC.job, operator=SPEC.operator,
                                                 state="views", keys=list(TRUTH), from_ms=0,
                                                 limit=1), timeout=10)
        assert [(v.key, v.next_from_ms) for v in many.results] == [
            (k, window(1)[0]) for k in TRUTH]
        with pytest.raises(grpc.RpcError) as info:
            stub.Get(qpb.GetRequest(job=SPEC.job, operator=SPEC.operator, state="views",
                                    key=key, from_ms=0, limit=0), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert "1 to 10000" in info.value.details()  # type: ignore[attr-defined]
