"""The queryable sink: one call makes a streaming aggregation queryable (DESIGN §3.3).

    query = serve(counts, job="tweets", operator="per_tweet_1h", key="tweet_id",
                  states=["impressions", "clicks"], window=WindowSpec("tumbling", 3_600_000))

Per batch N: executors write one delta file per (operator, partition, N) to checkpoint
storage; the driver then commits N on every owning shard server and returns only after all
of them acknowledged, so Spark's commit log never runs ahead of the served state.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import orjson
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming import StreamingQuery

from jobs import metrics
from jobs.coordinator import Coordinator, coordinator_for
from service.core import delta as deltas
from service.core.address import PartitionId
from service.core.config import settings
from service.core.errors import InvalidRequest
from service.core.operator import OperatorSpec, StateType, WindowSpec, save_spec
from service.core.storage import Storage

log = logging.getLogger(__name__)

WINDOW_COLUMNS = ("window", "session_window")


@dataclass
class BatchReport:
    batch: int
    rows: int
    partitions: int
    watermark_ms: int
    write_s: float
    commit_s: float
    applied: int
    skipped: int


@dataclass
class SinkStats:
    """What the sink did, batch by batch (exported as metrics by the job runner)."""
    reports: deque[BatchReport] = field(default_factory=lambda: deque(maxlen=10_000))

    @property
    def last(self) -> BatchReport | None:
        return self.reports[-1] if self.reports else None


def _state_type(dtype: T.DataType, name: str) -> StateType:
    if isinstance(dtype, T.LongType | T.IntegerType | T.ShortType | T.ByteType):
        return "long"
    if isinstance(dtype, T.DoubleType | T.FloatType | T.DecimalType):
        return "double"
    raise InvalidRequest(f"state column {name!r} is {dtype.simpleString()}: "
                    f"only integral (exact counts) and floating aggregates are queryable")


def batch_watermark_ms(checkpoint: str, batch: int) -> int:
    """The watermark Spark used for ``batch``: recorded in its offset log before the batch ran."""
    lines = Storage(checkpoint).read_bytes(f"offsets/{batch}").split(b"\n")
    return int(orjson.loads(lines[1]).get("batchWatermarkMs", 0))


def _write_deltas(spec: OperatorSpec, storage_uri: str, batch: int
                  ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """Build the mapInArrow function that runs on executors: one file per partition."""
    schema = deltas.delta_schema(spec)

    def write(it: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        batches = list(it)
        if not batches:
            return
        table = pa.Table.from_batches(batches)
        if table.num_rows == 0:
            return
        storage = Storage(storage_uri)
        table = table.sort_by([("_p", "ascending")])
        parts = table.column("_p").to_numpy()
        # boundaries of runs of equal partition ids in the sorted column
        cuts = [0, *((parts[1:] != parts[:-1]).nonzero()[0] + 1).tolist(), len(parts)]
        out_p, out_n = [], []
        body = table.drop_columns(["_p"]).cast(schema)
        for lo, hi in itertools.pairwise(cuts):
            p = int(parts[lo])
            deltas.write_delta(storage, PartitionId(spec.job, spec.operator, p), batch,
                               body.slice(lo, hi - lo))
            out_p.append(p)
            out_n.append(hi - lo)
        yield pa.RecordBatch.from_arrays(
            [pa.array(out_p, pa.int32()), pa.array(out_n, pa.int64())], ["partition", "rows"])

    return write


def _delta_frame(df: DataFrame, spec: OperatorSpec, window_col: str | None) -> DataFrame:
    key = F.col(spec.key).cast("string")
    cols = [key.alias("key")]
    if window_col:
        cols += [F.unix_millis(F.col(f"{window_col}.start")).alias("start"),
                 F.unix_millis(F.col(f"{window_col}.end")).alias("end")]
    else:
        cols += [F.lit(None).cast("long").alias("start"), F.lit(None).cast("long").alias("end")]
    cols += [F.col(n).cast(t).alias(n) for n, t in spec.states.items()]
    cols.append(F.pmod(F.xxhash64(key), F.lit(spec.partitions)).cast("int").alias("_p"))
    return df.where(F.col(spec.key).isNotNull()).select(*cols)


def serve(
    df: DataFrame,
    *,
    job: str,
    operator: str,
    key: str,
    states: list[str] | dict[str, StateType],
    window: WindowSpec | None = None,
    partitions: int | None = None,
    checkpoint: str,
    storage: str | None = None,
    shards: list[str] | None = None,
    retention_ms: int | None = None,
    trigger_interval: str = "1 second",
    query_name: str | None = None,
    stats: SinkStats | None = None,
) -> StreamingQuery:
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
    spec = OperatorSpec(job=job, operator=operator, key=key, states=dict(state_types),
                        partitions=partitions or cfg.partitions, window=window,
                        retention_ms=cfg.retention_ms if retention_ms is None else retention_ms)
    storage_uri = storage or cfg.storage_uri
    store = Storage(storage_uri)
    save_spec(store, spec)
    coordinator: Coordinator = coordinator_for(store, job, shards, cfg.commit_timeout_s)
    coordinator.register(spec)
    stats = stats if stats is not None else SinkStats()
    n_tasks = min(spec.partitions,
                  int(df.sparkSession.conf.get("spark.sql.shuffle.partitions") or 200))

    def sink_batch(batch_df: DataFrame, batch_id: int) -> None:
        t0 = time.perf_counter()
        frame = _delta_frame(batch_df, spec, window_col).repartition(n_tasks, "_p")
        rows = frame.mapInArrow(_write_deltas(spec, storage_uri, batch_id),
                                "partition int, rows long").collect()
        written = {r["partition"]: r["rows"] for r in rows}
        t1 = time.perf_counter()
        watermark = batch_watermark_ms(checkpoint, batch_id)
        done = coordinator.commit(spec, batch_id, watermark, written)
        stats.reports.append(BatchReport(batch_id, sum(written.values()), len(written),
                                         watermark, t1 - t0, done.seconds, done.applied,
                                         done.skipped))
        metrics.COMMIT_SECONDS.labels(job, operator).observe(done.seconds)
        metrics.LAST_BATCH.labels(job, operator).set(batch_id)
        metrics.WATERMARK.labels(job, operator).set(watermark)
        log.info("batch %d: %d rows in %d partitions, write %.3fs commit %.3fs", batch_id,
                 sum(written.values()), len(written), t1 - t0, done.seconds)

    return (
        df.writeStream.outputMode("update")
        .queryName(query_name or f"{job}.{operator}")
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=trigger_interval)
        .foreachBatch(sink_batch)
        .start()
    )


__all__ = ["BatchReport", "SinkStats", "WindowSpec", "batch_watermark_ms", "serve"]
