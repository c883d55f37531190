"""Spark-state mode: serve a streaming aggregation Spark keeps the state of
(docs/architecture.md §3).

    query = serve(counts, job="tweets", operator="p99_latency", key="tweet_id",
                  states=["p99"], window=WindowSpec("tumbling", 3_600_000), checkpoint=...)

For aggregates qstate cannot merge (a percentile, a user's own aggregate function): Spark's
stateful aggregation runs in update mode, and each batch's updated rows replace the served
values. Per batch N the executors write the rows as delta files and the driver commits N on
every owning shard before ``foreachBatch`` returns (``qstate.jobs.runtime.sinks.QStateSink``).
Aggregates that merge are better served in merge mode (``qstate.jobs.queryable``): no Spark
state at all.
"""

from __future__ import annotations

import time

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming import StreamingQuery

from qstate.core.config import settings
from qstate.core.errors import InvalidRequest
from qstate.core.records.operator import Aggregate, OperatorSpec, StateType, WindowSpec
from qstate.jobs.aggregates import state_type
from qstate.jobs.runtime import metrics
from qstate.jobs.runtime.partials import PART, Plan
from qstate.jobs.runtime.reports import BatchReport, Reports
from qstate.jobs.runtime.sinks import QStateSink, batch_log, batch_watermark_ms

__all__ = ["serve"]

WINDOW_COLUMNS = ("window", "session_window")


def _state_type(dtype: T.DataType, name: str) -> StateType:
    if (kind := state_type(dtype)) is not None:
        return kind
    raise InvalidRequest(f"state column {name!r} is {dtype.simpleString()}: "
                         f"only integral (exact counts) and floating aggregates are queryable")


def _rows(df: DataFrame, spec: OperatorSpec, window_col: str | None) -> DataFrame:
    """A batch of Spark's updated rows in the delta file's columns."""
    cols = [F.col(spec.key).cast("string").alias("key")]
    none = F.lit(None).cast("long")
    if window_col:
        cols += [F.unix_millis(F.col(f"{window_col}.start")).alias("start"),
                 F.unix_millis(F.col(f"{window_col}.end")).alias("end")]
    else:
        cols += [none.alias("start"), none.alias("end")]
    cols.append(none.alias("tag"))
    cols += [F.col(n).cast(t).alias(n) for n, t in spec.types.items()]
    cols.append(F.pmod(F.xxhash64(F.col(spec.key).cast("string")),
                       F.lit(spec.partitions)).cast("int").alias(PART))
    return df.where(F.col(spec.key).isNotNull()).select(*cols)


def serve(df: DataFrame, *, job: str, operator: str, key: str,
          states: list[str] | dict[str, StateType], window: WindowSpec | None = None,
          partitions: int | None = None, checkpoint: str, storage: str | None = None,
          shards: list[str] | None = None, retention_ms: int | None = None,
          trigger_interval: str = "1 second", query_name: str | None = None,
          reports: Reports | None = None) -> StreamingQuery:
    """Start ``df`` (a streaming aggregation) in update mode with the queryable sink.

    ``df`` has the grouping column ``key``, the aggregate columns ``states`` and, for
    windowed state, a ``window``/``session_window`` struct column.
    """
    cfg = settings()
    window_col = next((c for c in WINDOW_COLUMNS if c in df.columns), None)
    types = {f.name: f.dataType for f in df.schema.fields}
    if key not in types:
        raise InvalidRequest(f"key column {key!r} is not in {df.columns}")
    state_types = (states if isinstance(states, dict)
                   else {s: _state_type(types[s], s) for s in states if s in types})
    missing = [s for s in state_types if s not in types]
    if missing or len(state_types) != len(states):
        raise InvalidRequest(f"state columns {missing or states} are not all in {df.columns}")
    if window is None:
        window = WindowSpec("session" if window_col == "session_window" else
                            "tumbling" if window_col else "none")
    if (window.kind == "none") != (window_col is None):
        raise InvalidRequest(f"window {window.kind!r} does not match the columns {df.columns}")
    spec = OperatorSpec(job, operator, key, {n: Aggregate("value", t)
                                             for n, t in state_types.items()},
                        partitions or cfg.partitions, window,
                        cfg.retention_ms if retention_ms is None else retention_ms)
    sink = QStateSink(storage or cfg.storage_uri, shards, cfg.commit_timeout_s)
    sink.prepare([spec])
    reports = reports if reports is not None else Reports()

    def sink_batch(batch_df: DataFrame, batch: int) -> None:
        t0 = time.perf_counter()
        watermark, offsets = batch_log(checkpoint, batch)
        late = batch_watermark_ms(checkpoint, batch - 1)
        done = sink.write_final(_rows(batch_df, spec, window_col),
                                Plan(spec, late, batch, offsets), watermark)
        report = BatchReport(batch, done.rows, {}, watermark, late, 0.0,
                             time.perf_counter() - t0, {operator: done})
        reports.batches.append(report)
        metrics.observe_batch(job, None, report)

    return (df.writeStream.outputMode("update")
            .queryName(query_name or f"{job}.{operator}")
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime=trigger_interval)
            .foreachBatch(sink_batch)
            .start())
