"""A long sum past int64, end to end (issue 25): Kafka -> Spark -> the executors' partials ->
the shards' merge -> the router. It never wraps: it saturates at the bound it crossed, within
one batch (on the executors) or across batches (on the shard), and stays there whatever comes
after (docs/architecture.md §3). Truth is computed here in Python integers."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
from confluent_kafka import Producer
from pyspark.sql import DataFrame, SparkSession

from qstate.jobs import aggregates as A
from qstate.jobs.job import JobContext
from qstate.jobs.parse import parse_events
from qstate.jobs.queryable import QueryableJob
from qstate.jobs.runtime.launch import start_job
from qstate.jobs.source import read_kafka
from qstate.jobs.windows import window
from tests.helpers import http_windows

MAX, MIN = 2**63 - 1, -(2**63)
HOUR = 3_600_000
# key -> the amounts of each phase (a phase: produced, then processed, before the next)
PHASES: dict[str, list[list[int]]] = {
    "over-across-batches": [[2**62, 2**62 - 10], [100], [-50]],
    "over-in-one-batch": [[2**62, 2**62, 2**62], [], [-1]],
    "under": [[MIN + 1], [-5], [10]],
    "fine": [[5, -2], [2**62], [-(2**62)]],
}


def truth(phases: list[list[int]]) -> int:
    """The rule: each batch's amounts exactly, then its total onto the stored one; past int64,
    the bound crossed, for good."""
    total = 0
    for amounts in phases:
        total += sum(amounts)
        if not MIN < total < MAX:
            return MAX if total > 0 else MIN
    return total


def build(spark: SparkSession, ctx: JobContext) -> QueryableJob:
    assert ctx.topic is not None and ctx.job is not None
    raw: DataFrame = read_kafka(spark, ctx.bootstrap, ctx.topic)
    events = parse_events(raw, {"k": "string", "amount": "long", "time": "long"}, keys=["k"],
                          dlq_topic=None, bootstrap=ctx.bootstrap, event_time="time")
    job = QueryableJob(ctx.job, events, event_time="time", watermark="10 seconds",
                       topic=ctx.topic)
    job.operator("sums").groupBy(window("1 hour"), "k").agg(A.sum("amount").alias("total"))
    return job


def test_a_long_sum_past_int64_saturates_end_to_end(spark, broker, topic, tmp_path: Path,
                                                     storage_uri, shards, router) -> None:
    hour = int(time.time() * 1000) // HOUR * HOUR
    name = f"ov{topic[-6:]}"
    cfg = JobContext(broker.bootstrap, storage_uri, tmp_path / "ckpt", 4, "0 seconds",
                     topic=topic, job=name, shards=[s.address for s in shards])
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    running = start_job(spark, build, cfg)
    try:
        for phase in range(3):
            for key, phases in PHASES.items():
                for amount in phases[phase]:
                    producer.produce(topic, orjson.dumps(
                        {"k": key, "amount": amount, "time": hour + 1000}), key.encode())
            assert producer.flush(10) == 0
            running.process_all_available()
    finally:
        running.stop()
    got = http_windows(router.url, name, "sums", "total", list(PHASES))
    assert got == {(k, hour): truth(p) for k, p in PHASES.items()}
    assert got[("over-across-batches", hour)] == MAX and got[("under", hour)] == MIN
