"""Reads as of a savepoint (issue 28): a real router and shard servers answer a key, a range
and a batch of keys as the job was at the savepoint's batch, over HTTP, gRPC and the Python
client, while the live state goes on; the first read of a partition is a 503 with
Retry-After while its shard opens it. Ground truth: what the shop fixture committed."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import httpx
import pytest

from qstate.client import Client
from qstate.core.address import PartitionId
from qstate.core.answer import TopAnswer
from qstate.core.catalog import snapshot_batches
from qstate.core.savepoint import NO_SNAPSHOT, create
from qstate.proto import qstate_pb2 as qpb
from qstate.proto import qstate_pb2_grpc as qpb_grpc
from tests.helpers import wait_until
from tests.shop import BATCHES, KEYS, MANY, SPEC, WINDOW, P, Shop, own_shop, views, window

SAVED = BATCHES - 1  # the savepoint's batch
LIVE = SAVED + 3  # the live state's, after three more batches
PATH = f"/v1/state/{SPEC.job}/{SPEC.operator}/views"


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shop]:
    # a snapshot every other batch: some partitions start from one, replaying the rest
    with own_shop(tmp_path_factory.mktemp("savepoint-reads"),
                  shard_settings={"QSTATE_SNAPSHOT_EVERY": "2"}) as s:
        wait_until(lambda: all(snapshot_batches(s.storage, PartitionId(SPEC.job,
                                                                       SPEC.operator, p))
                               for p in range(P)), 30, "a snapshot of every partition")
        sp = create(s.storage, SPEC.job, "before")
        assert sp.batch == SAVED
        assert set(sp.operators[SPEC.operator].snapshots.values()) - {NO_SNAPSHOT}
        for b in range(SAVED + 1, LIVE + 1):
            s.commit(b)
        yield s


def opened(url: str, key: str, **params: str) -> httpx.Response:
    """The read once the savepoint's partition is open: 503s with Retry-After until then."""
    def read() -> httpx.Response | None:
        r = httpx.get(f"{url}{PATH}/{key}", params={"savepoint": "before", **params})
        if r.status_code == 503:
            assert "retry-after" in r.headers and "restor" in r.json()["message"], r.text
            return None
        return r
    return wait_until(read, 60, "the savepoint's partition open")  # type: ignore[return-value]


@pytest.mark.parametrize("route", ["local", "grpc"])
def test_a_key_reads_as_of_the_savepoint_beside_the_live_state(shop: Shop, route: str) -> None:
    url = shop.routers[route].url
    for key in KEYS[:20] + KEYS[-3:]:
        live = httpx.get(f"{url}{PATH}/{key}").json()
        assert (live["batch"], live["windows"][0]["value"]) == (LIVE, views(key, LIVE))
        r = opened(url, key)
        assert r.status_code == 200, r.text
        a = r.json()
        assert a["batch"] == SAVED and a["watermark"] == SAVED * WINDOW
        assert [(w["start"], w["value"]) for w in a["windows"]] == [
            (window(SAVED)[0], views(key, SAVED))]
    key = KEYS[3]
    r = opened(url, key, **{"from": "0", "to": str(window(LIVE)[1])})  # every window
    assert [(w["start"], w["value"]) for w in r.json()["windows"]] == [
        (window(b)[0], views(key, b)) for b in range(SAVED + 1)]


def test_a_batch_of_keys_the_python_client_and_grpc(shop: Shop) -> None:
    url = shop.routers["local"].url
    for key in KEYS:
        opened(url, key)  # every partition open
    r = httpx.post(f"{url}{PATH}:batchGet", params={"savepoint": "before"},
                   json={"keys": KEYS})
    assert r.status_code == 200, r.text
    assert {a["key"]: (a["batch"], a["windows"][0]["value"]) for a in r.json()["results"]} \
        == {k: (SAVED, views(k, SAVED)) for k in KEYS}
    with Client(url) as c:
        a = c.get(SPEC.job, SPEC.operator, "views", KEYS[5], savepoint="before")
        assert (a.batch, a.windows[0].value) == (SAVED, views(KEYS[5], SAVED))
        [m] = c.multi_get(SPEC.job, SPEC.operator, "views", [KEYS[6]], savepoint="before")
        assert (m.batch, m.windows[0].value) == (SAVED, views(KEYS[6], SAVED))
    with grpc.insecure_channel(shop.routers["local"].grpc_address) as ch:
        stub = qpb_grpc.QueryableStateStub(ch)
        v = stub.Get(qpb.GetRequest(job=SPEC.job, operator=SPEC.operator, state="views",
                                    key=KEYS[7], savepoint="before"), timeout=10)
        assert (v.batch, v.windows[0].int_value) == (SAVED, views(KEYS[7], SAVED))


def live_start(board: TopAnswer) -> tuple[int, int]:
    """The board's batch and the start of its window (the current one then, if not named)."""
    assert board.window is not None
    return board.batch, board.window.start


def test_top_n_as_of_the_savepoint(shop: Shop) -> None:
    url = shop.routers["local"].url
    for key in KEYS:
        opened(url, key)  # every partition open
    everything = KEYS + MANY
    with Client(url) as c:
        board = c.top(SPEC.job, SPEC.operator, "views", 5, savepoint="before")
        truth = sorted(everything, key=lambda k: (-views(k, SAVED), k))[:5]
        assert live_start(board) == (SAVED, window(SAVED)[0])  # its current window then
        assert [(e.key, e.value) for e in board.entries] == [(k, views(k, SAVED)) for k in truth]
        live = c.top(SPEC.job, SPEC.operator, "views", 5)
        assert live_start(live) == (LIVE, window(LIVE)[0])
        old = c.top(SPEC.job, SPEC.operator, "views", 5, window=window(1)[0], savepoint="before")
        truth = sorted(everything, key=lambda k: (-views(k, 1), k))[:5]
        assert [(e.key, e.value) for e in old.entries] == [(k, views(k, 1)) for k in truth]


def test_what_cannot_be_read_is_refused_saying_why(shop: Shop) -> None:
    url = shop.routers["local"].url
    r = httpx.get(f"{url}{PATH}/{KEYS[0]}", params={"savepoint": "nope"})
    assert r.status_code == 404 and "no savepoint 'nope' of job 'shop'; it has 'before'" \
        in r.json()["message"], r.text
    r = httpx.get(f"{url}{PATH}/{KEYS[0]}", params={"savepoint": "../x"})
    assert r.status_code == 400 and "invalid savepoint name" in r.json()["message"], r.text
    r = httpx.get(f"{url}{PATH}/{KEYS[0]}", params={"savepoint": "before", "min_batch": "1"})
    assert r.status_code == 400 and "'min_batch' and 'savepoint' together" \
        in r.json()["message"], r.text
