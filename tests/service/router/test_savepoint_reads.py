"""Reads as of a savepoint (issue 28): a real router and shard servers answer a key, a range,
a batch of keys and a top-N as the job was at the savepoint's batch, over HTTP, gRPC and the
Python client, while the live state goes on; the first read of a partition is a 503 with
Retry-After while its shard opens it.

The saved windows keep changing after the savepoint (issue 44): the window open at its
watermark is still open in the batches after it (Spark's rule: a window takes rows until the
watermark passes its end, docs/architecture.md §4, savepoints), and each of them grows it, so
live rows, whatever window they are filtered to, answer wrong. Two operators of one job: the
shop's ``views_1m`` (spark-state values, replaced each batch: a long and a double) and
``totals_1m``, whose per-batch partial aggregates the shards merge: count, sum of longs and
of doubles, min, max, avg and approx_count_distinct. Ground truth is folded here from what
each batch wrote: its rows for the one, its raw events for the other (the partials written
are made from them per batch; the truth from all of them at once)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import cache
from typing import Any, NamedTuple

import grpc
import httpx
import pyarrow as pa
import pytest

from qstate.client import Client
from qstate.core.address import PartitionId, partition_of
from qstate.core.answer import TopAnswer
from qstate.core.records.catalog import snapshot_batches
from qstate.core.records.delta import delta_schema, write_delta
from qstate.core.records.operator import Aggregate, OperatorSpec, WindowSpec, save_spec
from qstate.core.records.savepoint import NO_SNAPSHOT, create
from qstate.jobs.runtime.commit import Committer
from qstate.proto import qstate_pb2 as qpb
from qstate.proto import qstate_pb2_grpc as qpb_grpc
from tests.helpers import wait_until
from tests.service.shard.sim import sketch
from tests.shop import BATCHES, KEYS, MANY, SPEC, WINDOW, P, Shop, avg_ms, own_shop, views, window

SAVED = BATCHES - 1  # the savepoint's batch
LIVE = SAVED + 3  # the live state's, after three more batches
OPEN = window(SAVED)[0]  # the window open at the savepoint: every later batch grows it
MERGED = OperatorSpec("shop", "totals_1m", "page", {
    "events": Aggregate("count", "long"), "total": Aggregate("sum", "long"),
    "amount": Aggregate("sum", "double"), "low": Aggregate("min", "long"),
    "high": Aggregate("max", "double"), "mean": Aggregate("avg", "double"),
    "users": Aggregate("approx_count_distinct", "long", 12)},
    partitions=P, window=WindowSpec("tumbling", WINDOW))
# every (operator, state) read: the spark-state values and each merged aggregate kind
STATES = [(SPEC.operator, s) for s in SPEC.states] + [(MERGED.operator, s) for s in MERGED.states]
Rows = dict[tuple[str, int], Any]  # (key, window start) -> value
READ = frozenset(KEYS)  # the keys read window by window (MANY: by top-N)


def watermark(batch: int) -> int:
    """The shop's watermark (its batch's window start) up to the savepoint; after it the
    watermark moves on inside the saved window, which stays open."""
    return batch * WINDOW if batch <= SAVED else OPEN + (batch - SAVED) * 1000


# ---- views_1m: what each batch wrote, replaced ------------------------------------------
def views_written(batch: int) -> dict[str, Rows]:
    """state -> the rows batch ``batch`` wrote to views_1m: the shop's, the batch's window of
    every key (tests/shop.py); after the savepoint the saved window of every key again, a
    larger value (Spark's update mode emits a changed window whole)."""
    keys = KEYS + MANY
    rows: dict[str, Rows] = {
        "views": {(k, window(batch)[0]): views(k, batch) for k in keys},
        "avg_ms": {(k, window(batch)[0]): avg_ms(batch) for k in keys}}
    if batch > SAVED:
        rows["views"].update({(k, OPEN): views(k, SAVED) + batch * (1 + i % 5)
                              for i, k in enumerate(keys)})
        rows["avg_ms"].update({(k, OPEN): avg_ms(batch) + 0.125 for k in keys})
    return rows


@cache
def views_truth(batch: int) -> dict[str, Rows]:
    """views_1m as of ``batch``: each (key, window)'s last value written."""
    out: dict[str, Rows] = {s: {} for s in SPEC.states}
    for b in range(batch + 1):
        for state, rows in views_written(b).items():
            out[state].update(rows)
    return out


# ---- totals_1m: raw events, merged ---------------------------------------------------------
class Event(NamedTuple):
    start: int  # its window's
    n: int  # a long
    x: float  # a double (quarters: every sum of them is exact, whatever the order)
    user: int


def events(key: str, batch: int) -> list[Event]:
    """What batch ``batch`` brought for ``key``: one to three events in the batch's window;
    after the savepoint two more in the saved window, one past every earlier min and max and
    with a new user, so every aggregate of that window changes."""
    h = sum(map(ord, key)) + 31 * batch
    start = window(batch)[0]
    out = [Event(start, h * (i + 1) % 201 - 100, (h + i) % 97 * 0.25, (h + 3 * i) % 40)
           for i in range(1 + h % 3)]
    if batch > SAVED:
        out += [Event(OPEN, h % 50 - 25, h % 13 * 0.25, h % 40),
                Event(OPEN, -100 - batch, 25.0 + batch, 100 + batch)]
    return out


def fold(es: list[Event]) -> dict[str, int | float]:
    """Each aggregate of ``es``, computed whole. The distinct count is exact: a sketch of
    2**12 registers counts a few hundred values exactly (its list and set modes)."""
    xs = [e.x for e in es]
    return {"events": len(es), "total": sum(e.n for e in es), "amount": sum(xs),
            "low": min(e.n for e in es), "high": max(xs), "mean": sum(xs) / len(xs),
            "users": len({e.user for e in es})}


def partials(key: str, batch: int) -> list[dict[str, Any]]:
    """Batch ``batch``'s delta rows of ``key``: per window, its events' partial aggregates
    as the job writes them (docs/architecture.md §3)."""
    rows = []
    for start in sorted({e.start for e in events(key, batch)}):
        es = [e for e in events(key, batch) if e.start == start]
        part = fold(es)
        rows.append({"key": key, "start": start, "end": start + WINDOW, "tag": None,
                     **{s: part[s] for s in ("events", "total", "amount", "low", "high")},
                     "mean__sum": part["amount"], "mean__n": len(es),
                     "users": sketch(e.user for e in es)})
    return rows


@cache
def merged_truth(batch: int) -> dict[str, Rows]:
    """totals_1m as of ``batch``: each (key, window)'s aggregates of every event up to it."""
    grouped: dict[tuple[str, int], list[Event]] = {}
    for b in range(batch + 1):
        for k in KEYS:
            for e in events(k, b):
                grouped.setdefault((k, e.start), []).append(e)
    folded = {kw: fold(es) for kw, es in grouped.items()}
    return {s: {kw: f[s] for kw, f in folded.items()} for s in MERGED.states}


def truth(operator: str, state: str, batch: int) -> Rows:
    """Every window of the keys of KEYS (those ``every_window`` reads)."""
    rows = (views_truth if operator == SPEC.operator else merged_truth)(batch)[state]
    return {kw: v for kw, v in rows.items() if kw[0] in READ}


# ---- the deployment ------------------------------------------------------------------------
def commit(shop: Shop, spec: OperatorSpec, batch: int, rows: list[dict[str, Any]]) -> None:
    """Write ``rows`` as batch ``batch`` of ``spec`` and commit it at the batch's watermark."""
    by_partition: dict[int, list[dict[str, Any]]] = {p: [] for p in range(P)}
    for r in rows:
        by_partition[partition_of(r["key"], P)].append(r)
    for p, mine in by_partition.items():
        write_delta(shop.storage, PartitionId(spec.job, spec.operator, p), batch,
                    pa.Table.from_pylist(mine, schema=delta_schema(spec)))
    Committer(shop.coordinator).commit(spec, batch, watermark(batch),
                                       {p: {0: len(mine)} for p, mine in by_partition.items()})


def commit_views(shop: Shop, batch: int) -> None:
    written = views_written(batch)
    commit(shop, SPEC, batch, [
        {"key": k, "start": s, "end": s + WINDOW, "tag": None, "views": v,
         "avg_ms": written["avg_ms"][(k, s)]} for (k, s), v in written["views"].items()])


def commit_totals(shop: Shop, batch: int) -> None:
    commit(shop, MERGED, batch, [r for k in KEYS for r in partials(k, batch)])


def snapshotted(shop: Shop, spec: OperatorSpec) -> bool:
    return all(snapshot_batches(shop.storage, PartitionId(spec.job, spec.operator, p))
               for p in range(P))


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shop]:
    # a snapshot every other batch: some partitions start from one, replaying the rest
    with own_shop(tmp_path_factory.mktemp("savepoint-reads"),
                  shard_settings={"QSTATE_SNAPSHOT_EVERY": "2"}) as s:
        save_spec(s.storage, MERGED)  # a second operator of the shop's job
        s.coordinator.register(MERGED)
        for b in range(SAVED + 1):
            commit_totals(s, b)
        wait_until(lambda: snapshotted(s, SPEC) and snapshotted(s, MERGED), 30,
                   "a snapshot of every partition")
        sp = create(s.storage, SPEC.job, "before")
        assert sp.batch == SAVED and set(sp.operators) == {SPEC.operator, MERGED.operator}
        for cut in sp.operators.values():
            assert set(cut.snapshots.values()) - {NO_SNAPSHOT}
        for b in range(SAVED + 1, LIVE + 1):
            commit_views(s, b)
            commit_totals(s, b)
        yield s


# ---- reading -------------------------------------------------------------------------------
def path(operator: str, state: str) -> str:
    return f"/v1/state/{SPEC.job}/{operator}/{state}"


def opened(read: Callable[[], httpx.Response]) -> httpx.Response:
    """``read`` (of the savepoint) once the partitions it asks are open: 503s with
    Retry-After until then."""
    def attempt() -> httpx.Response | None:
        r = read()
        if r.status_code == 503:
            assert "retry-after" in r.headers and "restor" in r.json()["message"], r.text
            return None
        return r
    return wait_until(attempt, 60, "the savepoint's partitions open")  # type: ignore[return-value]


def get(url: str, key: str, savepoint: bool, operator: str = SPEC.operator,
        state: str = "views", **params: str) -> dict[str, Any]:
    """One key's answer, live or (``savepoint``) as of the savepoint."""
    def read() -> httpx.Response:
        return httpx.get(f"{url}{path(operator, state)}/{key}",
                         params={**params, **({"savepoint": "before"} if savepoint else {})})
    r = opened(read) if savepoint else read()
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def every_window(url: str, operator: str, state: str, savepoint: bool) -> tuple[set[int], Rows]:
    """Every window of every key of KEYS by one batchGet: the batches answered, and
    (key, start) -> value."""
    params = {"from": "0", "to": str(window(LIVE)[1]),
              **({"savepoint": "before"} if savepoint else {})}

    def read() -> httpx.Response:
        return httpx.post(f"{url}{path(operator, state)}:batchGet", params=params,
                          json={"keys": KEYS}, timeout=30)
    r = opened(read) if savepoint else read()
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    return ({a["batch"] for a in results},
            {(a["key"], w["start"]): w["value"] for a in results for w in a["windows"]})


def differences(got: Rows, want: Rows) -> dict[tuple[str, int], tuple[Any, Any]]:
    """(key, window start) -> (got, want) where they differ, at most ten, keys cut to 20
    characters: a failure that reads in a line."""
    wrong = {(k[:20], s): (got.get((k, s)), want.get((k, s)))
             for k, s in sorted(got.keys() | want.keys()) if got.get((k, s)) != want.get((k, s))}
    return dict(list(wrong.items())[:10])


def starts(answer: dict[str, Any]) -> list[tuple[int, Any]]:
    return [(w["start"], w["value"]) for w in answer["windows"]]


def open_every_partition(url: str) -> None:
    """The savepoint's partitions of both operators open (a key of each read once)."""
    for operator, state in ((SPEC.operator, "views"), (MERGED.operator, "events")):
        for key in {partition_of(k, P): k for k in KEYS}.values():
            get(url, key, savepoint=True, operator=operator, state=state)


# ---- the tests -----------------------------------------------------------------------------
@pytest.mark.parametrize("route", ["local", "grpc"])
def test_a_key_reads_as_of_the_savepoint_beside_the_live_state(shop: Shop, route: str) -> None:
    url = shop.routers[route].url
    saved, live = views_truth(SAVED)["views"], views_truth(LIVE)["views"]
    for key in KEYS[:20] + KEYS[-3:]:
        a = get(url, key, savepoint=False)
        newest = window(LIVE)[0]
        assert (a["batch"], starts(a)) == (LIVE, [(newest, live[(key, newest)])])
        a = get(url, key, savepoint=True)  # its latest window then: the open one
        assert (a["batch"], a["watermark"]) == (SAVED, watermark(SAVED))
        assert starts(a) == [(OPEN, saved[(key, OPEN)])]
        # the same window, read live, has grown since
        a = get(url, key, savepoint=False, **{"from": str(OPEN), "to": str(OPEN + 1)})
        assert starts(a) == [(OPEN, live[(key, OPEN)])]
        assert live[(key, OPEN)] != saved[(key, OPEN)]
    key = KEYS[3]
    a = get(url, key, savepoint=True, **{"from": "0", "to": str(window(LIVE)[1])})  # all
    assert starts(a) == [(window(b)[0], saved[(key, window(b)[0])]) for b in range(SAVED + 1)]


@pytest.mark.parametrize("route", ["local", "grpc"])
@pytest.mark.parametrize(("operator", "state"), STATES)
def test_every_aggregate_kind_as_of_the_savepoint_while_its_windows_grow(
        shop: Shop, route: str, operator: str, state: str) -> None:
    """Every window of every key: the savepoint's answer is the truth at its batch, the
    live one the truth at the newest, and the two differ in every key's saved open window."""
    url = shop.routers[route].url
    batches, saved = every_window(url, operator, state, savepoint=True)
    assert batches == {SAVED}
    assert differences(saved, truth(operator, state, SAVED)) == {}
    batches, live = every_window(url, operator, state, savepoint=False)
    assert batches == {LIVE}
    assert differences(live, truth(operator, state, LIVE)) == {}
    assert [k for k in KEYS if saved[(k, OPEN)] == live[(k, OPEN)]] == []


def test_a_batch_of_keys_the_python_client_and_grpc(shop: Shop) -> None:
    url = shop.routers["local"].url
    saved = views_truth(SAVED)["views"]
    open_every_partition(url)
    r = httpx.post(f"{url}{path(SPEC.operator, 'views')}:batchGet",
                   params={"savepoint": "before"}, json={"keys": KEYS})
    assert r.status_code == 200, r.text
    assert {a["key"]: (a["batch"], a["windows"][0]["value"]) for a in r.json()["results"]} \
        == {k: (SAVED, saved[(k, OPEN)]) for k in KEYS}
    mean = merged_truth(SAVED)["mean"]
    with Client(url) as c:
        a = c.get(SPEC.job, SPEC.operator, "views", KEYS[5], savepoint="before")
        assert (a.batch, a.windows[0].value) == (SAVED, saved[(KEYS[5], OPEN)])
        [m] = c.multi_get(SPEC.job, SPEC.operator, "views", [KEYS[6]], savepoint="before")
        assert (m.batch, m.windows[0].value) == (SAVED, saved[(KEYS[6], OPEN)])
        a = c.get(SPEC.job, MERGED.operator, "mean", KEYS[7], savepoint="before")
        assert (a.batch, a.windows[0].value) == (SAVED, mean[(KEYS[7], OPEN)])
    with grpc.insecure_channel(shop.routers["local"].grpc_address) as ch:
        stub = qpb_grpc.QueryableStateStub(ch)
        v = stub.Get(qpb.GetRequest(job=SPEC.job, operator=SPEC.operator, state="views",
                                    key=KEYS[7], savepoint="before"), timeout=10)
        assert (v.batch, v.windows[0].int_value) == (SAVED, saved[(KEYS[7], OPEN)])
        v = stub.Get(qpb.GetRequest(job=SPEC.job, operator=MERGED.operator, state="mean",
                                    key=KEYS[7], savepoint="before"), timeout=10)
        assert (v.batch, v.windows[0].double_value) == (SAVED, mean[(KEYS[7], OPEN)])


def live_start(board: TopAnswer) -> tuple[int, int]:
    """The board's batch and the start of its window (the current one then, if not named)."""
    assert board.window is not None
    return board.batch, board.window.start


def ranked(values: Rows, keys: list[str], start: int, n: int) -> list[tuple[str, Any]]:
    """The true top ``n`` of ``keys`` in the window at ``start``: largest first, ties by key."""
    return sorted(((k, values[(k, start)]) for k in keys), key=lambda e: (-e[1], e[0]))[:n]


def test_top_n_as_of_the_savepoint(shop: Shop) -> None:
    url = shop.routers["local"].url
    open_every_partition(url)
    everything = KEYS + MANY
    with Client(url) as c:
        board = c.top(SPEC.job, SPEC.operator, "views", 5, savepoint="before")
        assert live_start(board) == (SAVED, OPEN)  # its current window then
        assert [(e.key, e.value) for e in board.entries] == ranked(
            views_truth(SAVED)["views"], everything, OPEN, 5)
        # the same window is still the current one live, its values grown
        live = c.top(SPEC.job, SPEC.operator, "views", 5)
        assert live_start(live) == (LIVE, OPEN)
        grown = [(e.key, e.value) for e in live.entries]
        assert grown == ranked(views_truth(LIVE)["views"], everything, OPEN, 5)
        assert grown != [(e.key, e.value) for e in board.entries]
        old = c.top(SPEC.job, SPEC.operator, "views", 5, window=window(1)[0], savepoint="before")
        assert [(e.key, e.value) for e in old.entries] == ranked(
            views_truth(SAVED)["views"], everything, window(1)[0], 5)
        for batch, sp in ((SAVED, "before"), (LIVE, None)):  # a merged sum, ranked
            board = c.top(SPEC.job, MERGED.operator, "total", 5, window=OPEN, savepoint=sp)
            assert (board.batch, [(e.key, e.value) for e in board.entries]) == (
                batch, ranked(merged_truth(batch)["total"], KEYS, OPEN, 5))


def test_what_cannot_be_read_is_refused_saying_why(shop: Shop) -> None:
    url = f"{shop.routers['local'].url}{path(SPEC.operator, 'views')}/{KEYS[0]}"
    r = httpx.get(url, params={"savepoint": "nope"})
    assert r.status_code == 404 and "no savepoint 'nope' of job 'shop'; it has 'before'" \
        in r.json()["message"], r.text
    r = httpx.get(url, params={"savepoint": "../x"})
    assert r.status_code == 400 and "invalid savepoint name" in r.json()["message"], r.text
    r = httpx.get(url, params={"savepoint": "before", "min_batch": "1"})
    assert r.status_code == 400 and "'min_batch' and 'savepoint' together" \
        in r.json()["message"], r.text
