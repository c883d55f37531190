"""Fork and roll back a job from a savepoint (issue 28 items 3 and 4), on real components:
Kafka, Spark, the session's shard servers and router.

v1 (the tweets example) counts phase A; a savepoint is taken; the topic gets two more
partitions; v1 counts phase B. Then a v2 with a changed filter, an added aggregate and an
added operator forks from the savepoint and runs beside v1 (A/B) through phase C: its
answers equal "v1's logic up to the savepoint, v2's after it" (the added ones: v2's only),
and v1's stay v1's. v2 restarted with the same command goes on (phase D). Then v1 is
stopped, phase E written, and v1 rolled back to the savepoint: it reads B to E again from
the savepoint's offsets, counted once, over shards that held B to D already. Ground truth
is computed from the delivery reports of every event written (partition and offset) and the
savepoint's recorded offsets."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions
from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F

from qstate.core.savepoint import Savepoint, create
from qstate.core.storage import Storage
from qstate.jobs import aggregates as A
from qstate.jobs.examples import tweets
from qstate.jobs.job import JobContext
from qstate.jobs.launch import RunningJob, start_job
from qstate.jobs.origin import read_origin
from qstate.jobs.parse import parse_events
from qstate.jobs.queryable import QueryableJob, dlq_topic
from qstate.jobs.source import read_kafka
from qstate.jobs.windows import window
from qstate.shard.seed import seed
from tests.helpers import http_windows

P = 4
KEYS = [f"t{i}" for i in range(12)]  # t7: the tweet v2 filters out


@dataclass(frozen=True)
class Event:
    key: str
    kind: str  # impression | url-click
    partition: int
    offset: int


def v2_skips(key: str) -> bool:
    return key.endswith("7")


def build_v2(spark: SparkSession, ctx: JobContext) -> QueryableJob:
    """v1's operators with a changed filter (tweets ending in 7 are a bot's: not counted),
    an added aggregate and an added operator (all clicks per tweet, no window)."""
    topic = ctx.topic or tweets.TOPIC
    events = parse_events(
        read_kafka(spark, ctx.bootstrap, topic, starting_offsets=ctx.starting_offsets),
        tweets.FIELDS, keys=tweets.KEYS, dlq_topic=dlq_topic(topic), bootstrap=ctx.bootstrap,
        event_time="time")
    job = QueryableJob(ctx.job or "tweets_v2", events, event_time="time",
                       watermark=tweets.WATERMARK, topic=topic)

    def event(kind: str) -> Column:
        return F.col("event") == kind

    human = ~F.col("tweet_id").endswith("7")
    job.operator("per_tweet_1h").where(human).groupBy(window("1 hour"), "tweet_id").agg(
        A.count(when=event("impression")).alias("impressions"),
        A.count(when=event("url-click")).alias("clicks"),
        A.count().alias("events"))  # added: begins empty at the savepoint
    job.operator("per_tweet_1m").where(event("impression") & human).groupBy(
        window("1 minute", "10 seconds"), "tweet_id").agg(A.count().alias("impressions"))
    job.operator("clicks_total").where(event("url-click")).groupBy("tweet_id").agg(
        A.count().alias("clicks"))
    return job


def produce(producer: Producer, topic: str, n: int, t0: int, salt: int) -> list[Event]:
    """``n`` events in event-time order (none late), in one hour; each with where Kafka put
    it, from its delivery report."""
    out: list[Event] = []

    def delivered(err: object, msg) -> None:  # type: ignore[no-untyped-def]
        assert err is None, err
        body = orjson.loads(msg.value())
        out.append(Event(body["tweet_id"], body["event"], msg.partition(), msg.offset()))

    for i in range(n):
        key = KEYS[(i * 7 + salt) % len(KEYS)]
        kind = "url-click" if (i + salt) % 3 == 0 else "impression"
        producer.produce(topic, orjson.dumps({"tweet_id": key, "event": kind,
                                              "time": t0 + i}),
                         key.encode(), on_delivery=delivered)
    assert producer.flush(30) == 0
    assert len(out) == n
    return out


def counted(events: list[Event], kind: str, keep=lambda e: True) -> dict[str, int]:  # type: ignore[no-untyped-def]
    return dict(Counter(e.key for e in events if e.kind == kind and keep(e)))


def hourly(router, job: str, state: str) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """key -> the value of its one hourly window (every event is in one hour)."""
    got = http_windows(router.url, job, "per_tweet_1h", state, KEYS)
    assert len({start for _, start in got}) <= 1, got
    return {k: int(v) for (k, _), v in got.items() if v}


def totals(router, job: str) -> dict[str, int]:  # type: ignore[no-untyped-def]
    got = http_windows(router.url, job, "clicks_total", "clicks", KEYS, latest=True)
    return {k: int(v) for (k, _), v in got.items() if v}


def settle(*jobs: RunningJob) -> None:
    for job in jobs:
        job.process_all_available()


@pytest.fixture
def ctx(broker, topic: str, tmp_path: Path, storage_uri: str, shards) -> JobContext:  # type: ignore[no-untyped-def]
    return JobContext(broker.bootstrap, storage_uri, tmp_path / "ckpt", P, "500 milliseconds",
                      topic=topic, job=f"fk{topic[-6:]}", shards=[s.address for s in shards])


def test_fork_runs_beside_v1_and_rollback_replays_exactly(
        spark, broker, topic: str, ctx: JobContext, storage_uri: str, router) -> None:
    v1_name = ctx.job
    assert v1_name is not None
    v2_name = f"{v1_name}v2"
    storage = Storage(storage_uri)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    hour = int(time.time() * 1000) // 3_600_000 * 3_600_000
    v1 = start_job(spark, "tweets", replace(ctx, checkpoint=ctx.checkpoint / v1_name))
    running = [v1]
    try:
        phase_a = produce(producer, ctx.topic or "", 300, hour + 1_000, 0)
        settle(v1)
        sp: Savepoint = create(storage, v1_name, "before-v2")
        ends = sp.offsets[ctx.topic or ""]

        def before(e: Event) -> bool:
            return e.offset < ends.get(e.partition, 0)

        assert sum(map(before, phase_a)) == len(phase_a)  # v1 had counted all of A
        # the topic grows after the savepoint: a fork reads the new partitions whole
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for fut in admin.create_partitions([NewPartitions(ctx.topic or "", 6)]).values():
            fut.result(30)
        phase_b = produce(producer, ctx.topic or "", 300, hour + 2_000, 1)
        settle(v1)
        assert hourly(router, v1_name, "impressions") == counted(
            phase_a + phase_b, "impression")

        # the fork: v1's state up to the savepoint, v2's logic after it, beside v1
        v2_ctx = replace(ctx, job=v2_name, checkpoint=ctx.checkpoint / v2_name,
                         from_savepoint=f"{v1_name}@before-v2")
        v2 = start_job(spark, build_v2, v2_ctx, seed)
        running.append(v2)
        origin = read_origin(v2_ctx.checkpoint)
        assert origin is not None and origin.base == sp.batch + 1
        settle(v2)
        seen = phase_a + phase_b

        def v2_truth(kind: str, events: list[Event]) -> dict[str, int]:
            return counted(events, kind, lambda e: before(e) or not v2_skips(e.key))

        assert hourly(router, v2_name, "impressions") == v2_truth("impression", seen)
        assert hourly(router, v2_name, "clicks") == v2_truth("url-click", seen)
        assert totals(router, v2_name) == counted(  # added: begins empty at the savepoint
            seen, "url-click", lambda e: not before(e) and not v2_skips(e.key))
        assert hourly(router, v2_name, "events") == dict(Counter(  # added: v2's only
            e.key for e in seen if not before(e) and not v2_skips(e.key)))
        phase_c = produce(producer, ctx.topic or "", 200, hour + 3_000, 2)
        settle(v1, v2)
        seen += phase_c
        assert hourly(router, v2_name, "clicks") == v2_truth("url-click", seen)
        assert hourly(router, v1_name, "clicks") == counted(seen, "url-click")
        assert hourly(router, v2_name, "impressions") != hourly(router, v1_name, "impressions")
        # restarted with the same command, the fork goes on from its checkpoint
        v2.stop()
        running.remove(v2)
        v2 = start_job(spark, build_v2, v2_ctx, seed)
        running.append(v2)
        phase_d = produce(producer, ctx.topic or "", 100, hour + 4_000, 3)
        settle(v1, v2)
        seen += phase_d
        assert hourly(router, v2_name, "impressions") == v2_truth("impression", seen)

        # roll v1 back to the savepoint: B, C and D are read again, counted once
        v1.stop()
        running.remove(v1)
        phase_e = produce(producer, ctx.topic or "", 100, hour + 5_000, 4)
        seen += phase_e
        v1_ctx = replace(ctx, checkpoint=ctx.checkpoint / v1_name, from_savepoint="before-v2")
        v1 = start_job(spark, "tweets", v1_ctx, seed)
        running.append(v1)
        settle(v1)
        assert hourly(router, v1_name, "impressions") == counted(seen, "impression")
        assert hourly(router, v1_name, "clicks") == counted(seen, "url-click")
        moved = [p.name for p in v1_ctx.checkpoint.iterdir() if ".before-" in p.name]
        assert moved, "the old Spark checkpoint is kept aside"
    finally:
        for job in running:
            job.stop()

