"""A read of several states of one operator in one request (``POST
/v1/state/{job}/{operator}:batchGet``, docs/feast.md): over the session's shop through a
router reading partitions in-process and one asking their owners, every key in every state
equals truth, key by key in the states' order, and a key's states are of one batch; what it
refuses and why; the client's face. The rounds that keep a key's states at one batch are the
read core's (``engine/core/src/read/wait.rs``, driven by commits in its cargo tests)."""

from __future__ import annotations

from typing import Any

import grpc
import httpx
import pytest

from qstate.client import Client
from qstate.proto import qstate_pb2 as qpb
from qstate.proto import qstate_pb2_grpc as qpb_grpc
from tests.shop import BATCHES, BIG, KEYS, ROUTES, Shop, avg_ms, views, window

LAST = BATCHES - 1
PATH = "/v1/state/shop/views_1m:batchGet"


def truth(key: str, state: str, batch: int) -> int | float:
    return avg_ms(batch) if state == "avg_ms" else views(key, batch)


@pytest.mark.parametrize("route", ROUTES)  # local reads on and off
def test_every_key_in_every_state_as_truth_key_by_key(shop: Shop, route: str) -> None:
    keys = [KEYS[0], "never-written", BIG, KEYS[7]]
    states = ["avg_ms", "views"]
    r = httpx.post(shop.routers[route].url + PATH, json={"keys": keys, "states": states},
                   timeout=10)
    assert r.status_code == 200, r.text
    got = [(a["key"], a["state"], a["found"], a["batch"], [w["value"] for w in a["windows"]])
           for a in r.json()["results"]]
    assert got == [(k, s, k != "never-written", LAST,
                    [] if k == "never-written" else [truth(k, s, LAST)])
                   for k in keys for s in states]


@pytest.mark.parametrize("route", ROUTES)
def test_a_range_of_every_state_holds_every_batchs_window(shop: Shop, route: str) -> None:
    r = httpx.post(shop.routers[route].url + PATH, params={"from": "0", "to": "999999999"},
                   json={"keys": [KEYS[3], KEYS[4]], "states": ["views", "avg_ms"]}, timeout=10)
    assert r.status_code == 200, r.text
    got = [(a["key"], a["state"], [(w["start"], w["value"]) for w in a["windows"]])
           for a in r.json()["results"]]
    assert got == [(k, s, [(window(b)[0], truth(k, s, b)) for b in range(BATCHES)])
                   for k in (KEYS[3], KEYS[4]) for s in ("views", "avg_ms")]


@pytest.mark.parametrize(("body", "status", "words"), [
    ({"keys": ["page-1"], "states": []}, 400, "'states' is empty"),
    ({"keys": ["page-1"], "states": ["views", "views"]}, 400, '"views" twice'),
    ({"keys": ["page-1"], "states": ["views", "likes"]}, 404, "likes"),
    ({"keys": ["page-1"], "states": ["a b"]}, 400, "state"),
    ({"keys": [f"page-{i}" for i in range(501)], "states": ["views", "avg_ms"]}, 400,
     "501 keys × 2 states = 1002 answers: at most 1000"),
    ({"keys": ["page-1"]}, 400, "states"),
])
def test_what_it_refuses_it_says_how_to_fix(shop: Shop, body: dict[str, Any], status: int,
                                           words: str) -> None:
    for router in shop.routers.values():
        r = httpx.post(router.url + PATH, json=body, timeout=10)
        assert r.status_code == status, r.text
        assert words in r.json()["message"], r.text


def test_the_client_answers_each_key_its_states(shop: Shop) -> None:
    with Client(shop.routers["local"].url) as c:
        got = c.multi_get_states("shop", "views_1m", ["views", "avg_ms"], [KEYS[9], "nope"])
    assert [{s: (a.found, a.latest.value if a.latest else None) for s, a in per.items()}
            for per in got] == [{"views": (True, views(KEYS[9], LAST)),
                                 "avg_ms": (True, avg_ms(LAST))},
                                {"views": (False, None), "avg_ms": (False, None)}]


@pytest.mark.parametrize("route", ROUTES)
def test_grpc_multiget_of_several_states_as_truth(shop: Shop, route: str) -> None:
    keys = [KEYS[11], "never-written"]
    with grpc.insecure_channel(shop.routers[route].grpc_address) as ch:
        stub = qpb_grpc.QueryableStateStub(ch)
        r = stub.MultiGet(qpb.MultiGetRequest(job="shop", operator="views_1m", keys=keys,
                                              states=["views", "avg_ms"]), timeout=10)
        got = [(v.key, v.state, v.found, v.batch,
                [w.int_value if w.HasField("int_value") else w.double_value for w in v.windows])
               for v in r.results]
        assert got == [(k, s, k != "never-written", LAST,
                        [] if k == "never-written" else [truth(k, s, LAST)])
                       for k in keys for s in ("views", "avg_ms")]
        with pytest.raises(grpc.RpcError) as e:
            stub.MultiGet(qpb.MultiGetRequest(job="shop", operator="views_1m", state="views",
                                              keys=keys, states=["avg_ms"]), timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not both" in (e.value.details() or "")
