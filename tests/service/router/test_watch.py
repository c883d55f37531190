"""Watch (issue 27): after each committed batch a watcher is pushed the new values of its
keys that changed (or its top-N board), over Server-Sent Events and gRPC, and resumes after
the last batch it saw when its connection drops. One shop serves the module; each test
commits the batches of a job of its own (``tests/watching.py``, ``OwnJob``), whose truth is
what that test wrote, and checks every event it gets against the contract one by one
(``Contract``)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from qstate.client import AsyncClient, Client
from qstate.core.answer import WatchEvent
from tests.helpers import metric, wait_until
from tests.shop import Shop, own_shop
from tests.watching import (
    OP,
    OTHERS,
    STATE,
    WATCHED,
    AsyncClientWatch,
    ClientWatch,
    Contract,
    Ended,
    Event,
    GrpcWatch,
    OwnJob,
    Proxy,
    SseWatch,
    Watch,
    resume_after_a_cut,
    resume_after_a_restart,
)

SHOP_PATH = f"/v1/watch/shop/{OP}/{STATE}"  # the shop's own job: never committed to here


@pytest.fixture(scope="module")
def own(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shop]:
    with own_shop(tmp_path_factory.mktemp("watch")) as s:
        yield s


@pytest.fixture
def job(own: Shop) -> OwnJob:
    """A job of this test's own: no other test commits to it or watches it."""
    return OwnJob(own)


@pytest.mark.parametrize("route", ["local", "grpc"])
def test_sse_pushes_the_changed_keys_after_each_batch(own: Shop, job: OwnJob,
                                                      route: str) -> None:
    s = SseWatch(own.routers[route].url, job.name, WATCHED)
    try:
        c = Contract(job, WATCHED)
        [first] = c.through(s, job.batch)
        assert first.snapshot and not first.coalesced and first.batch == job.batch
        c.holds_the_truth()

        job.commit({WATCHED[1]: 3, WATCHED[4]: 3, **dict.fromkeys(OTHERS, 9)})  # two watched
        got = c.through(s, job.batch)
        assert sorted(k for ev in got for k in ev.keys) == sorted([WATCHED[1], WATCHED[4]])
        assert all(ev.committed_ms > 0 for ev in got if ev.changes)  # when it was applied
        c.holds_the_truth()

        job.commit({k: 100 + i for i, k in enumerate(WATCHED + OTHERS)}, new_window=True)
        got = c.through(s, job.batch)
        assert sorted(k for ev in got for k in ev.keys) == sorted(WATCHED)  # every one moved
        c.holds_the_truth()
    finally:
        s.close()


def test_a_change_sent_mid_commit_is_followed_by_the_batch_it_is_complete_at(
        own: Shop, job: OwnJob) -> None:
    """Partitions commit one after another: a watcher may get a batch's change in an event
    that says the batch before (its other keys' partitions are not there yet); once they are,
    an event says the batch, with no change if none came (docs/architecture.md §5, watch):
    its values are the truth at the batch it last saw."""
    key = WATCHED[1]
    first = job.owner(key)
    assert any(job.owner(k) != first for k in WATCHED)  # on both shards
    s = SseWatch(own.routers["local"].url, job.name, WATCHED)
    try:
        c = Contract(job, WATCHED)
        c.through(s, job.batch)
        written = job.record({key: 77})
        job.deliver(written, to=first)  # the other shard has not applied it yet
        [early] = c.through(s, job.batch - 1)
        assert early.keys == [key] and early.changes[0].batch == job.batch
        job.deliver(written)  # and now it has
        [done] = c.through(s, job.batch)
        assert done.changes == () and done.batch == job.batch
        c.holds_the_truth()
    finally:
        s.close()


def test_a_resume_at_the_latest_batch_is_empty_and_one_from_before_is_every_value(
        own: Shop, job: OwnJob) -> None:
    """``from_batch`` as a query parameter (Last-Event-ID, EventSource's way, is the cut test's)."""
    url = own.routers["local"].url
    job.commit({WATCHED[2]: 5})  # batch 1: the keeper below first reads the keys here
    keeper = SseWatch(url, job.name, WATCHED)  # keeps the router watching the keys
    try:
        Contract(job, WATCHED).through(keeper, job.batch)
        # nothing changed since the latest batch: an empty event, not a snapshot
        same = SseWatch(url, job.name, WATCHED, from_batch=job.batch)
        ev = same.next()
        same.close()
        assert not ev.snapshot and ev.changes == () and ev.batch == job.batch
        # from before this router watched the keys, it cannot tell what changed: every value
        other = SseWatch(url, job.name, WATCHED, from_batch=0)
        c = Contract(job, WATCHED)
        c.through(other, job.batch)
        other.close()
        c.holds_the_truth()
    finally:
        keeper.close()


@pytest.mark.parametrize("kind", ["sse", "grpc", "client", "async-client"])
def test_a_watch_resumes_after_its_connection_is_cut_while_batches_commit(
        own: Shop, job: OwnJob, kind: str) -> None:
    """Through a proxy the test cuts while a batch commits (tests/watching.py,
    ``resume_after_a_cut``): a raw stream reconnects as its client would (SSE with
    Last-Event-ID, gRPC with from_batch), the Python clients by themselves (the Node
    client's: tests/clients/test_node_client.py)."""
    router = own.routers["local"]
    proxy = Proxy(router.grpc_address if kind == "grpc" else router.url.removeprefix("http://"))

    def open_watch(last: int | None) -> Watch:
        if kind == "sse":
            return SseWatch(proxy.url, job.name, WATCHED, last_event_id=last)
        if kind == "grpc":
            return GrpcWatch(proxy.address, job.name, WATCHED, from_batch=last)
        return (ClientWatch if kind == "client" else AsyncClientWatch)(proxy.url, job.name,
                                                                       WATCHED)
    try:
        resume_after_a_cut(job, router.url, proxy, open_watch)
    finally:
        proxy.close()


@pytest.mark.parametrize("kind", ["client", "async-client"])
def test_the_python_clients_resume_on_a_router_that_restarted(own: Shop, job: OwnJob,
                                                              tmp_path: Path, kind: str) -> None:
    with own.router_with(tmp_path / "logs", f"restarting-{kind}") as r:
        resume_after_a_restart(job, r, lambda: (
            ClientWatch if kind == "client" else AsyncClientWatch)(r.url, job.name, WATCHED))


def test_grpc_watch_of_keys_and_of_a_board(own: Shop, job: OwnJob) -> None:
    address = own.routers["local"].grpc_address
    keys, board = GrpcWatch(address, job.name, WATCHED), GrpcWatch(address, job.name, top_n=5)
    try:
        c = Contract(job, WATCHED)
        c.through(keys, job.batch)
        c.holds_the_truth()
        top0 = board.next()
        assert top0.snapshot and top0.top == tuple(job.top(5, job.batch))
        # the board's fifth key gets far ahead of everyone: both watches see it
        leader = job.top(5, job.batch)[4][0]
        job.commit({leader: 5000, WATCHED[0]: 5000})
        got = c.through(keys, job.batch)
        assert [k for ev in got for k in ev.keys] == [WATCHED[0]]
        top1 = board.next()
        while top1.batch < job.batch:  # read while partitions were still committing
            top1 = board.next()
        assert top1.snapshot and top1.top == tuple(job.top(5, job.batch))
        assert leader in [k for k, _ in top1.top[:3]]
    finally:
        keys.close()
        board.close()


def test_the_async_client_watches_a_board(own: Shop, job: OwnJob) -> None:
    """Every event of a board is the whole board (a snapshot); the first and the one that
    says the last batch are the truth's top 3 at their batch."""
    async def boards() -> list[WatchEvent]:
        async with AsyncClient(own.routers["local"].url) as ac:
            it = ac.watch(job.name, OP, STATE, top=3)
            got = [await it.__anext__()]
            job.commit({job.top(3, job.batch)[2][0]: 7000})  # the third takes the lead
            while got[-1].batch < job.batch:  # read while partitions were still committing
                got.append(await it.__anext__())
            await it.aclose()
            return got

    got = asyncio.run(boards())
    assert all(ev.snapshot and ev.top is not None for ev in got), got
    assert [ev.batch for ev in got] == sorted(ev.batch for ev in got)
    for ev, batch in ((got[0], 0), (got[-1], job.batch)):
        assert ev.top is not None and ev.top.batch == ev.batch == batch
        assert [(e.key, e.value) for e in ev.top.entries] == job.top(3, batch), ev


def test_a_watch_that_cannot_be_served_says_why(own: Shop, tmp_path: Path) -> None:
    url = own.routers["local"].url
    cases = {
        (): 400,  # neither keys nor top
        (("key", "a"), ("top", "3")): 400,  # both
        tuple(("key", f"k{i}") for i in range(101)): 400,  # over QSTATE_MAX_WATCH_KEYS
    }
    for params, status in cases.items():
        r = httpx.get(f"{url}{SHOP_PATH}", params=list(params), timeout=10)
        assert r.status_code == status and r.json()["error"] == "InvalidRequest", r.text
    r = httpx.get(f"{url}/v1/watch/shop/nope/{STATE}", params={"key": "a"}, timeout=10)
    assert r.status_code == 404, r.text
    r = httpx.get(f"{url}{SHOP_PATH}", params={"key": "a"}, headers={"Last-Event-ID": "x"},
                  timeout=10)
    assert r.status_code == 400 and "Last-Event-ID" in r.json()["message"]
    with own.router_with(tmp_path / "logs", "one-watch", QSTATE_MAX_WATCHERS="1") as r1:
        s = SseWatch(r1.url, "shop", ["page-0"])
        try:
            assert s.next().snapshot
            assert metric(r1.url, "qstate_router_watchers", form="keys", protocol="http") == 1
            r = httpx.get(f"{r1.url}{SHOP_PATH}", params={"key": "a"}, timeout=10)
            assert r.status_code == 429 and r.headers["retry-after"], r.text
            assert "QSTATE_MAX_WATCHERS" in r.json()["message"]
        finally:
            s.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_router_with_open_watches_ends_them_as_it_stops_and_they_resume_elsewhere(
        own: Shop, job: OwnJob, tmp_path: Path, sig: int) -> None:
    with own.router_with(tmp_path / "logs", f"stopping-{sig}") as r:
        sse, rpc = SseWatch(r.url, job.name, WATCHED), GrpcWatch(r.grpc_address, job.name,
                                                                 WATCHED)
        seen = {"sse": Contract(job, WATCHED), "grpc": Contract(job, WATCHED)}
        for c, w in zip(seen.values(), (sse, rpc), strict=True):
            c.through(w, job.batch)
        job.commit({WATCHED[6]: 2})
        for c, w in zip(seen.values(), (sse, rpc), strict=True):
            c.through(w, job.batch)
        assert r.proc is not None
        r.proc.send_signal(sig)
        assert r.proc.wait(10) == 0
        # the hub ended both streams (no event after the stop): the SSE one closed as a
        # stream that is over, the gRPC one UNAVAILABLE, which a client retries elsewhere
        assert isinstance(sse.ended(), Ended)
        ended = rpc.ended()
        assert isinstance(ended, grpc.RpcError)
        assert ended.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
        assert "this router is stopping" in ended.details()  # type: ignore[attr-defined]
        sse.close()
        rpc.close()
    job.commit({WATCHED[3]: 7})  # while they are away
    job.commit({WATCHED[3]: 8, WATCHED[8]: 1}, new_window=True)
    # they resume on a router that never watched the keys: it cannot tell what changed,
    # every value comes (a snapshot), as of the last batch
    local = own.routers["local"]
    again = {"sse": SseWatch(local.url, job.name, WATCHED, last_event_id=seen["sse"].last),
             "grpc": GrpcWatch(local.grpc_address, job.name, WATCHED,
                               from_batch=seen["grpc"].last)}
    try:
        for name, w in again.items():
            seen[name].resume(snapshot=True)
            [ev] = seen[name].through(w, job.batch)
            assert ev.batch == job.batch
            seen[name].holds_the_truth()
    finally:
        for w in again.values():
            w.close()


def test_a_quiet_watch_is_kept_open_by_pings_and_the_client_takes_them_in_stride(
        own: Shop, job: OwnJob, tmp_path: Path) -> None:
    keys = WATCHED[:2]
    with own.router_with(tmp_path / "logs", "pinging", QSTATE_WATCH_PING_S="0.2") as r, \
            Client(r.url) as client:
        events = client.watch(job.name, OP, STATE, keys)
        c = Contract(job, keys)
        c.take(Event.of(next(events)))
        pings = 0
        with httpx.stream("GET", f"{r.url}/v1/watch/{job.name}/{OP}/{STATE}", timeout=10,
                          params=[("key", k) for k in keys]) as raw:
            for line in raw.iter_lines():
                pings += line.startswith(":")
                if pings == 3:
                    break
        job.commit({keys[0]: 9})  # after a few pings on the client's stream too
        while c.last is None or c.last < job.batch:
            c.take(Event.of(next(events)))
        assert [k for ev in c.events[1:] for k in ev.keys] == [keys[0]]
        c.holds_the_truth()
        events.close()
        # one connection each: the client never reconnected over the pings
        route = "/v1/watch/{job}/{operator}/{state}"
        assert metric(r.url, "qstate_router_http_requests_total", route=route, method="GET",
                      status="200") == 2


def test_a_watch_that_ends_at_once_leaves_nothing_behind(own: Shop, tmp_path: Path) -> None:
    """A client that leaves before reading may never run the stream: the watch is closed all
    the same (else each would hold one of QSTATE_MAX_WATCHERS for ever)."""
    with own.router_with(tmp_path / "logs", "short-lived") as r:
        for _ in range(5):
            with httpx.stream("GET", f"{r.url}{SHOP_PATH}", params=[("key", "page-0")],
                              timeout=10) as resp:
                assert resp.status_code == 200  # and gone without reading a byte
        wait_until(lambda: metric(r.url, "qstate_router_watchers", form="keys",
                                  protocol="http") == 0, 10, "every watch closed")
