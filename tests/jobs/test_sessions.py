"""Session windows end to end (merge mode): Kafka -> Spark -> shards, exact against
``loadtest.truth.sessions``, with out-of-order rows that arrive in a later batch and bridge
two sessions of a key into one. The replaced sessions must be gone from the answer.
"""

from __future__ import annotations

import random
from pathlib import Path

from pyspark.sql import SparkSession

from jobs import aggregates as A
from jobs.job import JobContext
from jobs.parse import parse_events
from jobs.queryable import QueryableJob, dlq_topic
from jobs.runner import start_job
from jobs.source import read_kafka
from jobs.windows import session_window
from loadtest.truth import load_events, sessions
from service.embedded.generate import produce
from tests.helpers import read_all_windows

P = 8
GAP = 30_000
T0 = 1_767_225_600_000
FIELDS = {"tweet_id": "string", "event": "string", "time": "long"}


def _builder(topic: str):
    def build(spark: SparkSession, ctx: JobContext) -> QueryableJob:
        raw = read_kafka(spark, ctx.bootstrap, topic,
                         max_offsets_per_trigger=ctx.max_rows_per_trigger)
        events = parse_events(raw, FIELDS, keys=["tweet_id"], dlq_topic=dlq_topic(topic),
                              bootstrap=ctx.bootstrap)
        job = QueryableJob(ctx.job or "sessions", events, event_time="time",
                           watermark="10 seconds", topic=topic)
        job.operator("visits").groupBy(session_window("30 seconds"), "tweet_id").agg(
            A.count().alias("events"))
        return job
    return build


def test_sessions_merge_across_batches_exactly(spark, broker, topic, tmp_path: Path,
                                                storage_uri, shards) -> None:
    rng = random.Random(11)
    keys = [f"u-{i}" for i in range(200)]
    # every key starts within 4 s of T0, so phase A's watermark (newest - 10 s) stays below
    # the end of every bridging row's own session window: none of phase B is late
    base = {k: T0 + rng.randrange(4_000) for k in keys}
    # phase A, in time order: two sessions per key, 50 s apart (more than the gap)
    phase_a = [{"tweet_id": k, "event": "impression", "time": t} for t, k in sorted(
        (base[k] + d, k) for k in keys for d in (0, 10_000, 60_000, 70_000))]
    # phase B, out of order, later batches: half the keys get a row 25 s from both
    # sessions (they merge into one), the other half a row that only extends the second
    bridge = [{"tweet_id": k, "event": "impression",
               "time": base[k] + (35_000 if i % 2 == 0 else 80_000)}
              for i, k in enumerate(keys)]
    rng.shuffle(bridge)
    log = tmp_path / "events.jsonl"
    cfg = JobContext(broker.bootstrap, storage_uri, tmp_path / "ckpt", P, "0 seconds",
                     max_rows_per_trigger=150, topic=topic, job=f"ses{topic[-6:]}",
                     shards=[s.address for s in shards])
    build = _builder(topic)
    for phase in (phase_a, bridge):
        produce(broker.bootstrap, topic, iter(phase), log_path=log, progress=False,
                partitions=1)  # one partition: the order above is the order Spark reads
        running = start_job(spark, build, cfg)
        try:
            running.process_all_available()
        finally:
            running.stop()
        assert len(running.reports["merged"].batches) > 1
    truth = sessions(load_events(log), "tweet_id", "time", GAP)
    want = {(k, int(s)): int(n) for k, s, n in
            zip(truth["tweet_id"], truth["start"], truth["count"], strict=True)}
    got, _ = read_all_windows(storage_uri, cfg.job or "", "visits", "events", keys, P)
    assert got == want
    # the bridged keys hold one session of 5 rows; the others two, the second of 3
    merged = [k for i, k in enumerate(keys) if i % 2 == 0]
    assert all(got[(k, base[k])] == 5 for k in merged)
    assert all((k, base[k] + 60_000) not in got for k in merged)
