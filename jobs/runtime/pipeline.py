"""Running a ``QueryableJob``: one streaming query, and one Spark job per micro-batch that
reads it, parses it and computes every operator's partial aggregates in one pass, then the
commits (docs/architecture.md §3).

Per batch N the Spark job projects every operator's columns side by side (its key, the key's
shard partition and each aggregate's input, evaluated by Spark) and each task aggregates its
rows per operator in Arrow (``qstate.jobs.runtime.partials``), handing the partial rows to the
sink's target: qstate's writes them as delta fragments. Then, per operator, the sink finishes
the batch: qstate's records N (its manifest, durable) and delivers it to every owning shard
while Spark computes N+1, which first waits for N's acknowledgements
(``qstate.jobs.runtime.sinks.QStateSink``), so Spark's commit log runs at most one batch ahead
of the served state and never ahead of what is durable.

Exactly once: batch N's records are fixed by Spark's offset log, its partials are a
deterministic function of them and of batch N-1's watermark (also in the offset log), and a
shard applies batch N once.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from qstate.jobs.parse import ERROR_KIND, KINDS
from qstate.jobs.queryable import QueryableJob
from qstate.jobs.runtime import metrics
from qstate.jobs.runtime.origin import Origin
from qstate.jobs.runtime.partials import RESULT, TIME, Plan, run_operators
from qstate.jobs.runtime.reports import BatchReport, Reports
from qstate.jobs.runtime.sinks import (
    PartialsSink,
    batch_log,
    batch_watermark_ms,
    written_by_operator,
)

__all__ = ["start"]

log = logging.getLogger(__name__)


def start(job: QueryableJob, checkpoint: str, sink: PartialsSink, *, partitions: int,
          retention_ms: int, trigger_interval: str, reports: Reports | None = None,
          on_batch: Callable[[BatchReport], None] | None = None,
          origin: Origin | None = None) -> StreamingQuery:
    """Start the job's one streaming query; every batch goes through ``sink``, numbered
    from ``origin`` (``qstate.jobs.runtime.origin``: a job begun from a savepoint)."""
    if not job.operators:
        raise ValueError(f"job {job.name!r} declares no operator")
    specs = [op.spec(job.name, partitions, retention_ms) for op in job.operators]
    origin = origin or Origin()
    sink.prepare(specs)
    reports = reports if reports is not None else Reports()
    event_ms = job.event_ms()
    target = sink.target()
    projection = [F.col(ERROR_KIND), event_ms.alias(TIME)] + [
        c for j, op in enumerate(job.operators) for c in op.columns(j, partitions)]
    pool = ThreadPoolExecutor(len(specs), thread_name_prefix=f"{job.name}-commit")
    metrics.expect_dead_letters(job.name, job.topic, KINDS)

    def run_batch(df: DataFrame, spark_batch: int) -> None:
        t0 = time.perf_counter()
        batch = origin.batch(spark_batch)
        late = origin.watermark(batch_watermark_ms(checkpoint, spark_batch - 1))
        spark_watermark, offsets = batch_log(checkpoint, spark_batch)
        watermark = origin.watermark(spark_watermark)
        plans = [Plan(spec, late, batch, offsets) for spec in specs]
        # one action over the whole batch: Spark also sees every event time (its watermark)
        result = df.select(*projection).mapInArrow(
            run_operators(plans, target, ERROR_KIND), RESULT).collect()
        t1 = time.perf_counter()
        events = sum(r["rows"] for r in result if r["op"] == -1 and r["kind"] is None)
        dead = Counter[str]()
        for r in result:
            if r["op"] == -1 and r["kind"] is not None:
                dead[r["kind"]] += r["rows"]
        written = written_by_operator(result)
        futures = {plan.spec.operator: pool.submit(sink.finish, plan, written.get(j, {}),
                                                   watermark)
                   for j, plan in enumerate(plans)}
        done = {name: f.result() for name, f in futures.items()}
        report = BatchReport(batch, events, dict(dead), watermark, late, t1 - t0,
                             time.perf_counter() - t0, done)
        reports.batches.append(report)
        metrics.observe_batch(job.name, job.topic, report)
        if on_batch is not None:
            on_batch(report)
        log.info("batch %d: %d events, spark %.2fs, %s", batch, events, t1 - t0,
                 {n: (r.rows, round(r.commit_s, 2)) for n, r in done.items()})

    return (job.watermarked().writeStream.outputMode("append")
            .queryName(job.name)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime=trigger_interval)
            .foreachBatch(run_batch)
            .start())
