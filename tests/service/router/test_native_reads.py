"""Reads through the native front while batches commit (docs/architecture.md §5, one read
core): three jobs of their own (a tumbling window with every aggregate kind, HyperLogLog
included; a sliding window stored as panes; session windows) over two real shard servers,
committed batch after batch by a thread of this test from random events, and a Hypothesis
property that reads them meanwhile through a router reading the shards' files in-process
(its secondaries caught up under it) and one asking the owners over gRPC: point reads, batch
reads, several states, latest windows and ranges paged to their end with ``next_from``, with and
without ``min_batch``. Every answer is compared with the truth as of the batch it names,
computed from the events by a brute-force model of Spark's windows and late-data rule
(``tests.service.shard.sim``), never with another router's answer."""

from __future__ import annotations

import functools
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from qstate.control.coordinator import Coordinator
from qstate.core.address import PartitionId, partition_of
from qstate.core.records import delta as deltas
from qstate.core.records.operator import OperatorSpec, WindowSpec, save_spec
from qstate.core.records.storage import Storage
from qstate.core.transport.shard_client import ShardClients
from qstate.embedded.ports import wait_for_port
from qstate.embedded.procs import RouterProcess, ShardProcess
from qstate.jobs.runtime.commit import Committer
from tests.helpers import metric, wait_until
from tests.service.shard.sim import STATES, SparkModel, answers, partials

P = 4
WINDOWS = {"tumble": WindowSpec("tumbling", 10), "slide": WindowSpec("sliding", 30, 10),
           "sess": WindowSpec("session", gap_ms=15)}
KEYS = [f"k{i}" for i in range(20)] + ["ü/é key", "a b"]
NAMES = list(STATES)  # n s lo hi a u: count, sum, min, max, avg, approx_count_distinct
MAX_PAGES = 6
EXAMPLES = 120  # under `make test`
LONG = 1500  # under `make soak` (QSTATE_LONG=1)


@dataclass(repr=False)
class Job:
    spec: OperatorSpec
    coordinator: Coordinator
    model: SparkModel
    # batch -> key -> window start -> (end, events): the truth as of each batch
    history: dict[int, dict[str, dict[int | None, tuple[int | None, list[Any]]]]] = \
        field(default_factory=dict)


class Live:
    """The deployment and its truth (a plain class: Hypothesis prints its fixtures with each
    failure, and this one's history changes while it would)."""

    def __init__(self, storage: Storage, shards: list[ShardProcess], jobs: dict[str, Job],
                 routers: dict[str, RouterProcess]) -> None:
        self.storage = storage
        self.shards = shards
        self.jobs = jobs
        self.routers = routers
        self.committed = -1  # the last batch every shard acknowledged, of every job

    def __repr__(self) -> str:
        return f"Live(committed={self.committed})"


def _ready(shards: list[ShardProcess], job: str) -> bool:
    clients = ShardClients()
    try:
        ready = {p.partition for s in shards for p in clients.describe(s.address).partitions
                 if p.job == job and not p.restoring}
    finally:
        clients.close()
    return ready == set(range(P))


def _commit(live: Live, job: Job, batch: int, rnd: random.Random) -> None:
    """Batch ``batch`` of ``job``: random events around its watermark (some late, some ahead),
    their partial aggregates as delta files by partition, the truth recorded, then committed."""
    wm = job.model.watermark
    events = [(rnd.choice(KEYS), wm + rnd.randint(-25, 40), rnd.choice([None, *range(-9, 30)]),
               rnd.randint(0, 40)) for _ in range(rnd.randint(0, 30))]
    late = job.model.watermark
    table = partials(job.spec, events, late)
    written = {}
    for p in range(P):
        mine = table.filter(pa.array([partition_of(k, P) == p
                                      for k in table.column("key").to_pylist()], pa.bool_()))
        deltas.write_delta(live.storage, PartitionId(job.spec.job, job.spec.operator, p), batch,
                           mine)
        written[p] = {0: mine.num_rows}
    new_wm = wm + 10
    job.model.batch(events, new_wm)
    # as of this batch (the model's lists go on growing), before the shards have it
    job.history[batch] = {k: {s: (end, list(evs)) for s, (end, evs) in ws.items()}
                          for k, ws in job.model.expected().items()}
    Committer(job.coordinator).commit(job.spec, batch, new_wm, written)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("native-reads")
    storage = Storage(str(tmp / "storage"))
    shards = [ShardProcess.make(f"rt{i}", tmp / "data", storage.uri, tmp / "logs")
              for i in range(2)]
    for s in shards:
        s.start()
    for s in shards:
        wait_for_port(s.host, s.port, 30, s.proc)
    jobs: dict[str, Job] = {}
    for name, window in WINDOWS.items():
        spec = OperatorSpec(f"rt-{name}", "op", "k", dict(STATES), partitions=P, window=window)
        save_spec(storage, spec)
        coord = Coordinator(storage, spec.job, [s.address for s in shards])
        coord.register(spec)
        wait_until(functools.partial(_ready, shards, spec.job), 30,
                   f"the shards serving {spec.job}")
        coord.stop()  # nothing moves while the test reads
        jobs[name] = Job(spec, coord, SparkModel(window))
    routers = {"local": RouterProcess.make(storage.uri, tmp / "logs", "rt-local"),
               "hop": RouterProcess.make(storage.uri, tmp / "logs", "rt-hop", None,
                                         "--no-local-reads")}
    for r in routers.values():
        r.start_and_wait()
    lv = Live(storage, shards, jobs, routers)
    rnd = random.Random(54)
    for job in jobs.values():
        _commit(lv, job, 0, rnd)
    lv.committed = 0
    done = threading.Event()
    failed: list[BaseException] = []

    def committing() -> None:
        try:
            while not done.is_set():
                batch = lv.committed + 1
                for job in jobs.values():
                    _commit(lv, job, batch, rnd)
                lv.committed = batch
        except BaseException as exc:  # the test fails on it, below
            failed.append(exc)

    committer = threading.Thread(target=committing, name="committer")
    committer.start()
    try:
        wait_until(lambda: lv.committed >= 5 or failed, 60, "five batches committed")
        assert not failed, failed
        yield lv
    finally:
        done.set()
        committer.join(60)
        for r in routers.values():
            r.stop()
        for s in shards:
            s.stop()
    assert not failed, failed


def _expected(job: Job, batch: int, key: str, rng: tuple[int, int] | None,
              limit: int) -> tuple[list[tuple[int | None, int | None, list[Any]]], int | None]:
    """A key's windows as of ``batch`` as the answer holds them, and where the next page
    starts."""
    windows = job.history[batch].get(key, {})
    starts = sorted(windows, key=lambda s: -(1 << 63) if s is None else s)
    if rng is None:
        starts = starts[-1:]
    else:
        starts = [s for s in starts if s is not None and rng[0] <= s < rng[1]]
    page, rest = starts[:limit], starts[limit:]
    return [(s, windows[s][0], windows[s][1]) for s in page], (rest[0] if rest else None)


def _check(job: Job, state: str, key: str, rng: tuple[int, int] | None, limit: int,
           a: dict[str, Any]) -> None:
    want, next_from = _expected(job, a["batch"], key, rng, limit)
    where = (job.spec.job, state, key, rng, limit, a["batch"])
    assert (a["job"], a["state"], a["key"]) == (job.spec.job, state, key), where
    assert a["found"] == bool(want), where
    assert [(w["start"], w["end"]) for w in a["windows"]] == [(s, e) for s, e, _ in want], where
    assert a["next_from"] == next_from, where
    i = NAMES.index(state)
    for w, (_, _, evs) in zip(a["windows"], want, strict=True):
        truth = answers(evs)[i]
        if state == "u":  # a HyperLogLog estimate
            assert w["value"] == pytest.approx(truth, rel=0.03, abs=1), where
        else:
            assert w["value"] == truth and type(w["value"]) is type(truth), (where, w, truth)


@st.composite
def reads(draw: st.DrawFn) -> dict[str, Any]:
    op = draw(st.sampled_from(sorted(WINDOWS)))
    kind = draw(st.sampled_from(["point", "batch", "states"]))
    keys = draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=1 if kind == "point" else 6))
    states = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=3, unique=True)) \
        if kind == "states" else [draw(st.sampled_from(NAMES))]
    rng = draw(st.one_of(st.none(), st.tuples(st.integers(-50, 400), st.integers(1, 400)).map(
        lambda t: (t[0], t[0] + t[1]))))
    limit = draw(st.integers(1, 8)) if rng is not None else 1
    return {"op": op, "kind": kind, "keys": keys, "states": states, "range": rng,
            "limit": limit, "router": draw(st.sampled_from(["local", "hop"])),
            "ahead": draw(st.sampled_from([None, None, 0, 1]))}


def _ask(c: httpx.Client, job: Job, r: dict[str, Any], rng: tuple[int, int] | None,
         min_batch: int | None) -> list[dict[str, Any]]:
    """The read's answers, key by key (each key's states in the order asked)."""
    params: dict[str, Any] = {}
    if rng is not None:
        params = {"from": str(rng[0]), "to": str(rng[1]), "limit": str(r["limit"])}
    if min_batch is not None:
        params["min_batch"] = str(min_batch)
    base = f"/v1/state/{job.spec.job}/op"
    if r["kind"] == "point":
        got = c.get(f"{base}/{r['states'][0]}/{quote(r['keys'][0], safe='')}",
                    params=params)
        if got.status_code == 404:  # absent as of the batch it names
            body = got.json()
            assert not job.history[body["batch"]].get(r["keys"][0]) or rng is not None, body
            return [{"job": job.spec.job, "operator": "op", "state": r["states"][0],
                     "key": r["keys"][0], "found": False, "batch": body["batch"],
                     "windows": [], "next_from": None}]
        assert got.status_code == 200, got.text
        return [got.json()]
    if r["kind"] == "batch":
        got = c.post(f"{base}/{r['states'][0]}:batchGet", params=params, json={"keys": r["keys"]})
    else:
        for _ in range(STATE_RETRIES):
            got = c.post(f"{base}:batchGet", params=params,
                         json={"keys": r["keys"], "states": r["states"]})
            if not _went_round(got):
                break
            # the read core's designed refusal when every one of its rounds saw a commit
            # (read/wait.rs, STATE_ROUNDS): a client retries it, as qstate's do
            event("states: 503 behind (the job committed during every round), asked again")
    assert got.status_code == 200, got.text
    return list(got.json()["results"])


STATE_RETRIES = 10


def _went_round(got: httpx.Response) -> bool:
    """A 503 + Retry-After of a key's states read at a different batch in each round."""
    return got.status_code == 503 and "Retry-After" in got.headers and \
        "faster than a read goes round" in got.json().get("message", "")


QUICK = settings(deadline=None, suppress_health_check=list(HealthCheck))


@settings(QUICK, max_examples=EXAMPLES)
@given(r=reads())
def test_reads_under_commits_answer_the_truth_of_their_batch(live: Live, r: dict[str, Any]
                                                             ) -> None:
    read_and_check(live, r)


@pytest.mark.long
@settings(QUICK, max_examples=LONG)
@given(r=reads())
def test_reads_under_commits_answer_the_truth_of_their_batch_long(live: Live,
                                                                  r: dict[str, Any]) -> None:
    read_and_check(live, r)


def read_and_check(live: Live, r: dict[str, Any]) -> None:
    """One drawn read (and the pages after it), each answer held to the truth of its batch."""
    job = live.jobs[r["op"]]
    router = live.routers[r["router"]]
    floor = None if r["ahead"] is None else live.committed + r["ahead"]
    rng = r["range"]
    with httpx.Client(base_url=router.url, timeout=30) as c:
        for page in range(MAX_PAGES):
            got = _ask(c, job, r, rng, floor)
            pairs = [(k, s) for k in r["keys"] for s in r["states"]]
            assert len(got) == len(pairs)
            for (key, state), a in zip(pairs, got, strict=True):
                if floor is not None:
                    assert a["batch"] >= floor, a
                try:
                    _check(job, state, key, rng, r["limit"], a)
                except AssertionError as exc:
                    raise AssertionError(f"through the {r['router']} router: {exc}") from None
            if r["kind"] == "states":  # a key's states as of one batch
                assert all(len({a["batch"] for a in got[i:i + len(r["states"])]}) == 1
                           for i in range(0, len(got), len(r["states"])))
            nexts = {a["next_from"] for a in got} - {None}
            event(f"{r['kind']} {r['op']} {r['router']}: page {page}")
            if rng is None or len(r["keys"]) != 1 or not nexts:
                break
            rng = (nexts.pop(), rng[1])  # the next page, as of whatever batch it is read at


def test_the_reads_were_answered_by_the_engine_and_read_here(live: Live) -> None:
    """Every read above was the native front's own (``answered_by=engine``), the local
    router's read this host's files, the other's the owners'."""
    local, hop = live.routers["local"].url, live.routers["hop"].url
    assert metric(local, "qstate_router_front_requests_total", answered_by="app",
                  route="/v1/state/{job}/{operator}/{state}/{key}") == 0
    assert metric(local, "qstate_router_shard_reads_total", path="local") > 0
    assert metric(hop, "qstate_router_shard_reads_total", path="local") == 0
    assert metric(hop, "qstate_router_shard_reads_total", path="remote") > 0
