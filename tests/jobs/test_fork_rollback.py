"""Fork and roll back a job from a savepoint (issue 28 items 3 and 4), on real components:
Kafka, Spark, the session's shard servers and router, and the ``qstate job`` command.

v1 (the tweets example plus a session operator, ``tests/jobs/fork_jobs.py``: a tumbling, a
sliding and a session window) counts phase A; a savepoint is taken; the topic gets two more
partitions; v1 counts phase B. Then v2, with a changed filter, an added aggregate and an
added operator, forks from the savepoint through the command line a user types (``qstate
job MODULE:build_v2 --name v2 --from-savepoint v1@before-v2``, no ``--partitions``: the fork
takes the savepoint's) and runs beside v1 (A/B) through phase C: its answers equal "v1's
logic up to the savepoint, v2's after it" (the added ones: v2's only), and v1's stay v1's.
v2 stopped and restarted with the same savepoint goes on (phase D). Then v1 is stopped,
phase E written, and v1 rolled back to the savepoint: it reads B to E again from the
savepoint's offsets, counted once, over shards that held B to D already. Sessions open at
the savepoint are extended after it (A and B, 4 s apart, are one session of each tweet; so
are C and D).

Every operator and state is compared, every window of every key, with ground truth computed
by ``loadtest.truth`` (pandas, no code shared with qstate) from the delivery reports of the
events written (partition, offset) and the savepoint's recorded offsets."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import httpx
import orjson
import pandas as pd
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions

from loadtest.truth import sessions, window_counts
from qstate.core.records.catalog import manifest_batches
from qstate.core.records.manifest import read_manifest
from qstate.core.records.savepoint import Savepoint, create
from qstate.core.records.storage import Storage
from qstate.embedded.procs import Child, qstate_command
from qstate.jobs import JobContext
from qstate.jobs.runtime.launch import RunningJob, start_job
from qstate.jobs.runtime.origin import read_origin
from qstate.shard.seed import seed
from tests.helpers import http_windows, wait_until
from tests.jobs.fork_jobs import GAP_MS, build_v1, build_v2, v2_skips

P = 4  # not the default (64): the fork through `qstate job` must take the savepoint's
KEYS = [f"t{i}" for i in range(12)]  # t7: the tweet v2 filters out
HOUR = 3_600_000
ROOT = Path(__file__).resolve().parents[2]
# where each phase's events start in the hour: A and B are one session of each tweet, C and
# D another (less than GAP_MS apart); none is late (each phase after the one before)
PHASE_MS = {"A": 1_000, "B": 5_000, "C": 30_000, "D": 35_000, "E": 60_000}

Served = dict[tuple[str, int | None], int]  # (key, window start) -> count
Truth = dict[tuple[str, str], Served]  # (operator, state) -> what it serves


@dataclass(frozen=True)
class Event:
    key: str
    kind: str  # impression | url-click
    time: int
    partition: int
    offset: int


def produce(producer: Producer, topic: str, n: int, phase: str, hour: int,
            salt: int) -> list[Event]:
    """``n`` events in event-time order (none late), 1 ms apart from the phase's start; each
    with where Kafka put it, from its delivery report."""
    out: list[Event] = []

    def delivered(err: object, msg) -> None:  # type: ignore[no-untyped-def]
        assert err is None, err
        body = orjson.loads(msg.value())
        out.append(Event(body["tweet_id"], body["event"], body["time"], msg.partition(),
                         msg.offset()))

    t0 = hour + PHASE_MS[phase]
    for i in range(n):
        key = KEYS[(i * 7 + salt) % len(KEYS)]
        kind = "url-click" if (i + salt) % 3 == 0 else "impression"
        producer.produce(topic, orjson.dumps({"tweet_id": key, "event": kind,
                                              "time": t0 + i}),
                         key.encode(), on_delivery=delivered)
    assert producer.flush(30) == 0
    assert len(out) == n
    return out


# ---- ground truth (loadtest.truth) -----------------------------------------------------
def _served(table: pd.DataFrame) -> Served:
    return {(k, int(s)): int(n) for k, s, n in
            zip(table["key"], table["start"], table["count"], strict=True)}


def v1_truth(events: list[Event]) -> Truth:
    """What v1's operators serve having counted ``events``: impressions and clicks per hour,
    impressions per sliding minute (every 10 s), events per session."""
    df = pd.DataFrame([asdict(e) for e in events])
    return {
        ("per_tweet_1h", "impressions"): _served(window_counts(
            df, "key", "time", HOUR, where={"kind": "impression"})),
        ("per_tweet_1h", "clicks"): _served(window_counts(
            df, "key", "time", HOUR, where={"kind": "url-click"})),
        ("per_tweet_1m", "impressions"): _served(window_counts(
            df, "key", "time", 60_000, 10_000, where={"kind": "impression"})),
        ("visits", "events"): _served(sessions(df, "key", "time", GAP_MS)),
    }


def v2_truth(events: list[Event], before: Callable[[Event], bool]) -> Truth:
    """What the fork serves: v1's logic up to the savepoint (``before``), v2's filter after
    it; its added aggregate and operator count only what came after."""
    counted = [e for e in events if before(e) or not v2_skips(e.key)]
    added = [e for e in counted if not before(e)]
    return {**v1_truth(counted),
            ("per_tweet_1h", "events"): _served(window_counts(
                pd.DataFrame([asdict(e) for e in added]), "key", "time", HOUR)),
            ("clicks_total", "clicks"): {(k, None): n for k, n in Counter(
                e.key for e in added if e.kind == "url-click").items()}}


# ---- what the router serves ------------------------------------------------------------
def serving(router, job: str, want: Truth) -> Truth:  # type: ignore[no-untyped-def]
    """Every window of every key of each (operator, state) of ``want``, as ``job`` serves
    it (windows of count 0 left out: truth has no row for them)."""
    return {(op, state): {kw: int(v) for kw, v in http_windows(
        router.url, job, op, state, KEYS, latest=op == "clicks_total").items() if v}
        for op, state in want}


def assert_serves(router, job: str, want: Truth) -> None:  # type: ignore[no-untyped-def]
    got = serving(router, job, want)
    for what, windows in want.items():
        assert got[what] == windows, (job, *what)


def settle(*jobs: RunningJob) -> None:
    for job in jobs:
        job.process_all_available()


@pytest.fixture
def ctx(broker, topic: str, tmp_path: Path, storage_uri: str, shards) -> JobContext:  # type: ignore[no-untyped-def]
    return JobContext(broker.bootstrap, storage_uri, tmp_path / "ckpt", P, "500 milliseconds",
                      topic=topic, job=f"fk{topic[-6:]}", shards=[s.address for s in shards])


def fork_command(ctx: JobContext, name: str, savepoint: str, log: Path) -> Child:
    """``qstate job tests.jobs.fork_jobs:build_v2 --name NAME --from-savepoint SAVEPOINT``
    as a user runs it, with the test's deployment and no partition count set anywhere."""
    env = {k: v for k, v in os.environ.items() if k != "QSTATE_PARTITIONS"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return Child("fork", qstate_command(
        "job", "tests.jobs.fork_jobs:build_v2", "--name", name, "--from-savepoint", savepoint,
        "--bootstrap", ctx.bootstrap, "--storage", ctx.storage,
        "--checkpoints", str(ctx.checkpoint), "--shards", ",".join(ctx.shards or []),
        "--trigger", ctx.trigger_interval, "--metrics-port", "0", "--no-live",
        "--option", f"topic={ctx.topic}"), log, env=env
    ).start()


def answered_batch(router, job: str, operator: str, state: str) -> int:  # type: ignore[no-untyped-def]
    """The oldest batch the router answers KEYS of ``operator`` as of (-1: not yet served)."""
    r = httpx.post(f"{router.url}/v1/state/{job}/{operator}/{state}:batchGet",
                   json={"keys": KEYS}, timeout=30)
    return min(a["batch"] for a in r.json()["results"]) if r.status_code == 200 else -1


def until_counted(router, storage: Storage, job: str, topic: str, events: list[Event],  # type: ignore[no-untyped-def]
                  want: Truth, process: Child) -> None:
    """Wait until ``job``, run by ``process`` (not here: no process_all_available), has
    recorded a batch that ends past every one of ``events`` in ``topic`` and the router
    answers each operator as of it; then what it serves must be ``want``, exactly."""
    ends: dict[int, int] = {}
    for e in events:
        ends[e.partition] = max(ends.get(e.partition, 0), e.offset + 1)

    def covered() -> list[int]:
        """[the newest batch recorded] if it ended past every event, else []."""
        assert process.alive(), process.log_path.read_text()[-3000:]
        newest = manifest_batches(storage, job, "per_tweet_1h")[-1:]
        read = read_manifest(storage, job, "per_tweet_1h", newest[0]).offsets.get(topic, {}) \
            if newest else {}
        return newest if read and all(read.get(p, 0) >= n for p, n in ends.items()) else []

    found: list[int] = wait_until(  # type: ignore[assignment]
        covered, 240, f"{job} recording a batch past the events written")
    batch = found[0]
    wait_until(lambda: all(answered_batch(router, job, op, state) >= batch
                           for op, state in want), 60, f"{job}'s batch {batch} answered")
    assert_serves(router, job, want)


@pytest.mark.long  # two more jobs on Spark: `make soak` (CI; docs/architecture.md §9)
def test_fork_runs_beside_v1_and_rollback_replays_exactly(
        spark, broker, topic: str, ctx: JobContext, storage_uri: str, router,
        tmp_path: Path) -> None:
    v1_name = ctx.job
    assert v1_name is not None
    v2_name = f"{v1_name}v2"
    storage = Storage(storage_uri)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    hour = int(time.time() * 1000) // HOUR * HOUR
    v1 = start_job(spark, build_v1, replace(ctx, checkpoint=ctx.checkpoint / v1_name))
    running = [v1]
    fork = None
    try:
        phase_a = produce(producer, topic, 300, "A", hour, 0)
        settle(v1)
        sp: Savepoint = create(storage, v1_name, "before-v2")
        assert {c.partitions for c in sp.operators.values()} == {P}
        ends = sp.offsets[topic]

        def before(e: Event) -> bool:
            return e.offset < ends.get(e.partition, 0)

        assert sum(map(before, phase_a)) == len(phase_a)  # v1 had counted all of A
        # the topic grows after the savepoint: a fork reads the new partitions whole
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for fut in admin.create_partitions([NewPartitions(topic, 6)]).values():
            fut.result(30)
        seen = phase_a + produce(producer, topic, 300, "B", hour, 1)
        settle(v1)
        assert_serves(router, v1_name, v1_truth(seen))

        # the fork, by the command line: v1's state up to the savepoint, v2's logic after it
        v2_ctx = replace(ctx, job=v2_name, checkpoint=ctx.checkpoint / v2_name,
                         from_savepoint=f"{v1_name}@before-v2")
        fork = fork_command(ctx, v2_name, f"{v1_name}@before-v2", tmp_path / "fork.log")
        until_counted(router, storage, v2_name, topic, seen, v2_truth(seen, before), fork)
        origin = read_origin(v2_ctx.checkpoint)
        assert origin is not None and origin.base == sp.batch + 1
        seen += produce(producer, topic, 200, "C", hour, 2)
        until_counted(router, storage, v2_name, topic, seen, v2_truth(seen, before), fork)
        settle(v1)  # beside it, v1 counts everything as v1
        assert_serves(router, v1_name, v1_truth(seen))
        assert serving(router, v2_name, v1_truth(seen)) != v1_truth(seen)
        fork.stop(60)
        assert fork.proc is not None and fork.proc.returncode == 0, \
            fork.log_path.read_text()[-3000:]

        # started again from the same savepoint, the fork goes on from its checkpoint
        v2 = start_job(spark, build_v2, v2_ctx, seed)
        running.append(v2)
        seen += produce(producer, topic, 100, "D", hour, 3)
        settle(v1, v2)
        assert read_origin(v2_ctx.checkpoint) == origin
        assert_serves(router, v2_name, v2_truth(seen, before))

        # roll v1 back to the savepoint: B, C and D are read again, counted once
        v1.stop()
        running.remove(v1)
        seen += produce(producer, topic, 100, "E", hour, 4)
        v1_ctx = replace(ctx, checkpoint=ctx.checkpoint / v1_name, from_savepoint="before-v2")
        v1 = start_job(spark, build_v1, v1_ctx, seed)
        running.append(v1)
        settle(v1)
        assert_serves(router, v1_name, v1_truth(seen))
        moved = [p.name for p in v1_ctx.checkpoint.iterdir() if ".before-" in p.name]
        assert moved, "the old Spark checkpoint is kept aside"
    finally:
        if fork is not None:
            fork.stop(60)
        for job in running:
            job.stop()
