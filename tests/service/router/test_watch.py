"""Watch (issue 27): after each committed batch a watcher is pushed the new values of its
keys that changed (or its top-N board), over Server-Sent Events and gRPC, on a shop of its
own whose batches the tests commit. Ground truth is what the tests write (``tests/shop.py``
and the partial batches below); every event is compared with it."""

from __future__ import annotations

import asyncio
import queue
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pyarrow as pa
import pytest
from httpx_sse import connect_sse

from qstate.client import AsyncClient, Client
from qstate.core import delta as deltas
from qstate.core.address import PartitionId, partition_of
from qstate.core.answer import WatchEvent
from qstate.jobs.commit import Committer
from qstate.proto import qstate_pb2 as qpb
from qstate.proto import qstate_pb2_grpc as qpb_grpc
from tests.helpers import metric, wait_until
from tests.shop import BATCHES, KEYS, MANY, SPEC, P, Shop, own_shop, views, window

JOB, OP, STATE = "shop", "views_1m", "views"
PATH = f"/v1/watch/{JOB}/{OP}/{STATE}"
WATCHED = KEYS[:10]


class Truth:
    """The value of each key in the latest window, as the tests wrote it."""

    def __init__(self) -> None:
        self.batch = BATCHES - 1
        self.start = window(self.batch)[0]
        self.values = {k: views(k, self.batch) for k in KEYS + MANY}

    def full(self, shop: Shop) -> None:
        """The next batch, every key in a new window (tests/shop.py)."""
        self.batch += 1
        shop.commit(self.batch)
        self.start = window(self.batch)[0]
        self.values = {k: views(k, self.batch) for k in KEYS + MANY}

    def some(self, shop: Shop, keys: list[str], add: int = 1) -> None:
        """The next batch, only ``keys``, each set to ``add`` views in the current window (the
        shop's states declare no aggregate: a row replaces the value)."""
        self.batch += 1
        written = {}
        for p in range(P):
            mine = [k for k in keys if partition_of(k, P) == p]
            t = pa.table({"key": mine, "start": [self.start] * len(mine),
                          "end": [self.start + 60_000] * len(mine),
                          "tag": pa.nulls(len(mine), pa.int64()),
                          "views": [add] * len(mine), "avg_ms": [0.5] * len(mine)}
                         ).cast(deltas.delta_schema(SPEC))
            if mine:
                deltas.write_delta(shop.storage, PartitionId(JOB, OP, p), self.batch, t)
                written[p] = {0: t.num_rows}
        Committer(shop.coordinator).commit(SPEC, self.batch, self.start, written)
        for k in keys:
            self.values[k] = add

    def top(self, n: int) -> list[tuple[str, int]]:
        return sorted(self.values.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


@pytest.fixture(scope="module")
def own(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Shop, Truth]]:
    with own_shop(tmp_path_factory.mktemp("watch")) as s:
        yield s, Truth()


class Stream:
    """One SSE watch read on a thread: its events arrive in a queue a test waits on."""

    def __init__(self, url: str, params: list[tuple[str, str]],
                 headers: dict[str, str] | None = None) -> None:
        self.events: queue.Queue[tuple[str | None, WatchEvent] | BaseException] = queue.Queue()
        self.status: queue.Queue[int] = queue.Queue()
        self._stop = threading.Event()
        self._client = httpx.Client(base_url=url, timeout=httpx.Timeout(5, read=60))
        self._t = threading.Thread(target=self._run, args=(params, headers or {}), daemon=True)
        self._t.start()

    def _run(self, params: list[tuple[str, str]], headers: dict[str, str]) -> None:
        try:
            with connect_sse(self._client, "GET", PATH, params=params, headers=headers) as es:
                self.status.put(es.response.status_code)
                for sse in es.iter_sse():
                    if self._stop.is_set():
                        return
                    if not sse.data:  # a ping (qstate.client._watch_event)
                        continue
                    self.events.put((sse.id, WatchEvent.model_validate_json(sse.data)))
        except BaseException as exc:  # a closed stream while stopping, or the failure
            if not self._stop.is_set():
                self.events.put(exc)

    def next(self, timeout: float = 20) -> tuple[str | None, WatchEvent]:
        got = self.events.get(timeout=timeout)
        if isinstance(got, BaseException):
            raise got
        return got

    def close(self) -> None:
        self._stop.set()
        self._client.close()


def _through(s: Stream, batch: int) -> tuple[WatchEvent, dict]:
    """Events until one says every change up to ``batch`` was sent (partitions commit one
    after another, so a batch's changes may come in several events), their changes merged:
    the last event and the values."""
    values: dict[str, tuple[int, int | float | None]] = {}
    while True:
        eid, ev = s.next()
        assert eid == str(ev.batch) and not ev.snapshot
        values.update(_values(ev))
        if ev.batch >= batch:
            return ev, values


def _params(keys: list[str], from_batch: int | None = None) -> list[tuple[str, str]]:
    out = [("key", k) for k in keys]
    return out + ([("from_batch", str(from_batch))] if from_batch is not None else [])


def _values(ev: WatchEvent) -> dict[str, tuple[int, int | float | None]]:
    return {a.key: (a.windows[-1].start or 0, a.windows[-1].value) for a in ev.changes
            if a.windows}


def _expect(truth: Truth, keys: list[str]) -> dict[str, tuple[int, int | float | None]]:
    return {k: (truth.start, truth.values[k]) for k in keys}


@pytest.mark.parametrize("route", ["local", "grpc"])
def test_sse_pushes_the_changed_keys_after_each_batch(own: tuple[Shop, Truth],
                                                      route: str) -> None:
    shop, truth = own
    s = Stream(shop.routers[route].url, _params(WATCHED))
    try:
        assert s.status.get(timeout=20) == 200
        eid, first = s.next()
        assert first.snapshot and not first.coalesced and first.batch == truth.batch
        assert eid == str(first.batch)
        assert _values(first) == _expect(truth, WATCHED)

        changed = [WATCHED[1], WATCHED[4], *MANY[:50]]  # two watched, others not
        truth.some(shop, changed, add=3)
        ev, got = _through(s, truth.batch)
        assert ev.batch == truth.batch
        assert got == _expect(truth, [WATCHED[1], WATCHED[4]])  # only what changed
        assert ev.committed_at is not None and ev.committed_at > 0

        truth.full(shop)  # every key in a new window
        ev, got = _through(s, truth.batch)
        assert ev.batch == truth.batch and got == _expect(truth, WATCHED)
    finally:
        s.close()


def test_a_resume_gets_only_what_changed_since_or_every_value_when_it_cannot_tell(
        own: tuple[Shop, Truth]) -> None:
    shop, truth = own
    url = shop.routers["local"].url
    keeper = Stream(url, _params(WATCHED))  # keeps the router watching the keys
    try:
        keeper.next()
        gone = Stream(url, _params(WATCHED))
        _, seen = gone.next()
        gone.close()  # a client drops out at seen.batch ...
        truth.some(shop, [WATCHED[2]], add=5)  # ... misses this batch ...
        _through(keeper, truth.batch)
        # ... and comes back: EventSource sends the last id it got
        back = Stream(url, _params(WATCHED), {"Last-Event-ID": str(seen.batch)})
        _, ev = back.next()
        back.close()
        assert not ev.snapshot and ev.batch == truth.batch
        assert _values(ev) == _expect(truth, [WATCHED[2]])
        # from_batch as a parameter too; nothing changed since the latest: an empty event
        same = Stream(url, _params(WATCHED, truth.batch))
        _, ev = same.next()
        same.close()
        assert not ev.snapshot and ev.changes == [] and ev.batch == truth.batch
        # from before this router watched the keys, it cannot tell: every value
        other = Stream(url, _params(WATCHED, 0))
        _, ev = other.next()
        other.close()
        assert ev.snapshot and _values(ev) == _expect(truth, WATCHED)
    finally:
        keeper.close()


def test_grpc_watch_of_keys_and_of_a_board(own: tuple[Shop, Truth]) -> None:
    shop, truth = own
    with grpc.insecure_channel(shop.routers["local"].grpc_address) as ch:
        stub = qpb_grpc.QueryableStateStub(ch)
        keys = stub.Watch(qpb.WatchRequest(job=JOB, operator=OP, state=STATE, keys=WATCHED),
                          timeout=60)
        board = stub.Watch(qpb.WatchRequest(job=JOB, operator=OP, state=STATE, top_n=5),
                           timeout=60)
        first, top0 = next(keys), next(board)
        assert first.snapshot and {v.key: v.windows[-1].int_value for v in first.changes} == \
            {k: truth.values[k] for k in WATCHED}
        assert [(e.key, e.int_value) for e in top0.top.entries] == truth.top(5)
        # the board's fifth key gets far ahead of everyone: both watches see it
        leader = truth.top(5)[4][0]
        truth.some(shop, [leader, WATCHED[0]], add=5000)
        ev = next(keys)
        assert {v.key: v.windows[-1].int_value for v in ev.changes} == {
            WATCHED[0]: truth.values[WATCHED[0]]}
        top1 = next(board)
        while top1.batch < truth.batch:  # read while partitions were still committing
            top1 = next(board)
        assert [(e.key, e.int_value) for e in top1.top.entries] == truth.top(5)
        assert leader in [e.key for e in top1.top.entries[:3]]
        keys.cancel()
        board.cancel()


def test_a_watch_that_cannot_be_served_says_why(own: tuple[Shop, Truth],
                                                tmp_path: Path) -> None:
    shop, _ = own
    url = shop.routers["local"].url
    cases = {
        (): 400,  # neither keys nor top
        (("key", "a"), ("top", "3")): 400,  # both
        tuple(("key", f"k{i}") for i in range(101)): 400,  # over QSTATE_MAX_WATCH_KEYS
    }
    for params, status in cases.items():
        r = httpx.get(f"{url}{PATH}", params=list(params), timeout=10)
        assert r.status_code == status and r.json()["error"] == "InvalidRequest", r.text
    r = httpx.get(f"{url}/v1/watch/{JOB}/nope/{STATE}", params={"key": "a"}, timeout=10)
    assert r.status_code == 404, r.text
    r = httpx.get(f"{url}{PATH}", params={"key": "a"}, headers={"Last-Event-ID": "x"},
                  timeout=10)
    assert r.status_code == 400 and "Last-Event-ID" in r.json()["message"]
    with shop.router_with(tmp_path / "logs", "one-watch", QSTATE_MAX_WATCHERS="1") as r1:
        s = Stream(r1.url, _params(WATCHED))
        try:
            s.next()
            assert metric(r1.url, "qstate_router_watchers", form="keys", protocol="http") == 1
            r = httpx.get(f"{r1.url}{PATH}", params={"key": "a"}, timeout=10)
            assert r.status_code == 429 and r.headers["retry-after"], r.text
            assert "QSTATE_MAX_WATCHERS" in r.json()["message"]
        finally:
            s.close()


def test_clients_watch_and_resume(own: tuple[Shop, Truth]) -> None:
    shop, truth = own
    url = shop.routers["local"].url
    with Client(url) as c:
        events = c.watch(JOB, OP, STATE, WATCHED[:3])
        first = next(events)
        assert first.snapshot and _values(first) == _expect(truth, WATCHED[:3])
        truth.some(shop, [WATCHED[1]], add=2)
        ev = next(events)
        assert _values(ev) == _expect(truth, [WATCHED[1]]) and ev.batch == truth.batch
        events.close()

    async def board() -> tuple[WatchEvent, WatchEvent]:
        async with AsyncClient(url) as ac:
            it = ac.watch(JOB, OP, STATE, top=3)
            b0 = await it.__anext__()
            truth.some(shop, [truth.top(3)[2][0]], add=7000)
            b1 = await it.__anext__()
            while b1.batch < truth.batch:  # read while partitions were still committing
                b1 = await it.__anext__()
            await it.aclose()
            return b0, b1

    b0, b1 = asyncio.run(board())
    assert b1.top is not None and b0.top is not None
    assert [(e.key, e.value) for e in b1.top.entries] == truth.top(3)
    assert b1.top.batch == truth.batch and b0.top.entries != b1.top.entries


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_router_with_open_watches_stops_at_once_and_clients_resume_elsewhere(
        own: tuple[Shop, Truth], tmp_path: Path, sig: int) -> None:
    shop, truth = own
    with shop.router_with(tmp_path / "logs", f"stopping-{sig}") as r:
        s = Stream(r.url, _params(WATCHED))
        with grpc.insecure_channel(r.grpc_address) as ch:
            rpc = qpb_grpc.QueryableStateStub(ch).Watch(
                qpb.WatchRequest(job=JOB, operator=OP, state=STATE, top_n=3), timeout=60)
            next(rpc)
            _, seen = s.next()
            t0 = time.monotonic()
            assert r.proc is not None
            r.proc.send_signal(sig)
            assert r.proc.wait(10) == 0
            took = time.monotonic() - t0
            with pytest.raises(grpc.RpcError) as ended:  # the stream ends with the router
                for _ in rpc:
                    pass
            assert ended.value.code() == grpc.StatusCode.UNAVAILABLE  # a client retries
        with pytest.raises((queue.Empty, httpx.HTTPError)):  # no event after the stop
            s.next(timeout=2)
        s.close()
    assert took < 8, took  # uvicorn's graceful wait is 2 s; the streams do not hold it
    # a client resumes on another router with the last batch it saw
    back = Stream(shop.routers["local"].url, _params(WATCHED, seen.batch))
    try:
        _, ev = back.next()
        assert ev.batch >= seen.batch and _values(ev).items() <= _expect(truth, WATCHED).items()
    finally:
        back.close()


def test_a_quiet_watch_is_kept_open_by_pings_and_the_client_takes_them_in_stride(
        own: tuple[Shop, Truth], tmp_path: Path) -> None:
    shop, truth = own
    with shop.router_with(tmp_path / "logs", "pinging", QSTATE_WATCH_PING_S="0.2") as r, \
            Client(r.url) as c:
        events = c.watch(JOB, OP, STATE, WATCHED[:2])
        assert next(events).snapshot
        pings = 0
        with httpx.stream("GET", f"{r.url}{PATH}", timeout=10,
                          params=[("key", k) for k in WATCHED[:2]]) as raw:
            for line in raw.iter_lines():
                pings += line.startswith(":")
                if pings == 3:
                    break
        truth.some(shop, [WATCHED[0]], add=9)  # after a few pings on the client's stream too
        ev = next(events)
        while ev.batch < truth.batch:
            ev = next(events)
        assert _values(ev) == _expect(truth, [WATCHED[0]]) and not ev.snapshot
        events.close()
        # one connection each: the client never reconnected over the pings
        route = "/v1/watch/{job}/{operator}/{state}"
        assert metric(r.url, "qstate_router_http_requests_total", route=route, method="GET",
                      status="200") == 2


def test_a_watch_that_ends_at_once_leaves_nothing_behind(own: tuple[Shop, Truth],
                                                         tmp_path: Path) -> None:
    """A client that leaves before reading may never run the stream: the watch is closed all
    the same (else each would hold one of QSTATE_MAX_WATCHERS for ever)."""
    shop, _ = own
    with shop.router_with(tmp_path / "logs", "short-lived") as r:
        for _ in range(5):
            with httpx.stream("GET", f"{r.url}{PATH}", params=[("key", k) for k in WATCHED],
                              timeout=10) as resp:
                assert resp.status_code == 200  # and gone without reading a byte
        wait_until(lambda: metric(r.url, "qstate_router_watchers", form="keys",
                                  protocol="http") == 0, 10, "every watch closed")
