"""Running a ``QueryableJob``: one streaming query whose every micro-batch is read and parsed
once, kept (persisted) while each operator's partial aggregates are computed from it, and
handed to a partials sink: qstate's (delta files, then a commit on every owning shard), or a
benchmark's baseline.

Exactly once (DESIGN §3.3): batch N's rows are fixed by Spark's offset log, its partials are
a deterministic function of them and of batch N-1's watermark (also in the offset log), and
a shard applies batch N once. ``foreachBatch`` returns only when every operator's batch is
committed, so Spark's commit log never runs ahead of the served state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from jobs import metrics
from jobs.parse import ERROR_KIND
from jobs.partials import Plan
from jobs.queryable import QueryableJob
from jobs.sinks import BatchReport, OperatorReport, PartialsSink, Reports, batch_watermark_ms

__all__ = ["start"]

log = logging.getLogger(__name__)


def start(job: QueryableJob, checkpoint: str, sink: PartialsSink, *, partitions: int,
          retention_ms: int, trigger_interval: str, reports: Reports | None = None,
          on_batch: Callable[[BatchReport], None] | None = None) -> StreamingQuery:
    """Start the job's one streaming query; every batch goes through ``sink``."""
    if not job.operators:
        raise ValueError(f"job {job.name!r} declares no operator")
    specs = {op.name: op.spec(job.name, partitions, retention_ms) for op in job.operators}
    sink.prepare(list(specs.values()))
    reports = reports if reports is not None else Reports()
    event_ms = job.event_ms()
    pool = ThreadPoolExecutor(len(job.operators), thread_name_prefix=f"{job.name}-op")

    def one_operator(name: str, good: DataFrame, batch: int, late: int,
                     watermark: int) -> OperatorReport:
        op = next(o for o in job.operators if o.name == name)
        spec = specs[name]
        rows = op.project(good, event_ms, spec.partitions)
        return sink.write(rows, Plan(spec, late, batch), watermark)

    def run_batch(df: DataFrame, batch: int) -> None:
        t0 = time.perf_counter()
        late = batch_watermark_ms(checkpoint, batch - 1)
        watermark = batch_watermark_ms(checkpoint, batch)
        df = df.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            # one action reads and parses the batch (and Spark sees every event time)
            kinds = {r[ERROR_KIND]: r["count"]
                     for r in df.groupBy(ERROR_KIND).count().collect()}
            t1 = time.perf_counter()
            events = sum(kinds.values())
            dead = {k: n for k, n in kinds.items() if k is not None}
            good = df.where(F.col(ERROR_KIND).isNull())
            futures = {name: pool.submit(one_operator, name, good, batch, late, watermark)
                       for name in specs}
            done = {name: f.result() for name, f in futures.items()}
        finally:
            df.unpersist()
        report = BatchReport(batch, events, dead, watermark, late, t1 - t0,
                             time.perf_counter() - t0, done)
        reports.batches.append(report)
        metrics.observe_batch(job.name, job.topic, report)
        if on_batch is not None:
            on_batch(report)
        log.info("batch %d: %d events, %s", batch, events,
                 {n: (r.rows, round(r.write_s, 2), round(r.commit_s, 2)) for n, r in done.items()})

    return (job.watermarked().writeStream.outputMode("append")
            .queryName(job.name)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime=trigger_interval)
            .foreachBatch(run_batch)
            .start())
