"""Session windows end to end (merge mode): Kafka -> Spark -> shards, exact against
``loadtest.truth.sessions``, with out-of-order rows that arrive in a later batch and bridge
two sessions of a key into one. The replaced sessions must be gone from the answer.
"""

from __future__ import annotations

import random
from pathlib import Path

from pyspark.sql import SparkSession

from loadtest.truth import load_events, sessions
from qstate.embedded.generate import produce
from qstate.jobs import aggregates as A
from qstate.jobs.job import JobContext
from qstate.jobs.parse import parse_events
from qstate.jobs.queryable import QueryableJob, dlq_topic
from qstate.jobs.runtime.launch import start_job
from qstate.jobs.source import read_kafka
from qstate.jobs.windows import session_window
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
    # Every key starts within 2 s of T0. Phase A, in time order: two sessions per key, 35 s
    # apart (more than the gap). No row of either phase is newer than T0 + 49 s, so the
    # watermark (newest - 10 s) stays below every first session's end (base + 10 s + gap):
    # both sessions are open when phase B comes, as they would be in Spark's state, and no
    # row of phase B is late.
    base = {k: T0 + rng.randrange(2_000) for k in keys}
    phase_a = [{"tweet_id": k, "event": "impression", "time": t} for t, k in sorted(
        (base[k] + d, k) for k in keys for d in (0, 10_000, 45_000))]
    # Phase B, out of order, in later batches: half the keys get a row 17 s and 18 s from
    # the two sessions (they merge into one), the other half a row that only extends the
    # second session.
    bridge = [{"tweet_id": k, "event": "impression",
               "time": base[k] + (27_000 if i % 2 == 0 else 47_000)}
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
    # the bridged keys hold one session of 4 rows, the replaced one is gone; the others
    # two, the second extended to 2 rows
    for i, k in enumerate(keys):
        if i % 2 == 0:
            assert got[(k, base[k])] == 4 and (k, base[k] + 45_000) not in got, k
        else:
            assert (got[(k, base[k])], got[(k, base[k] + 45_000)]) == (2, 2), k
