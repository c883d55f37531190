"""Where a batch's per-operator rows go, and what each batch did.

``QStateSink`` is qstate's: delta files on checkpoint storage, then ``Commit(N)`` on every
owning shard, returning only when each acknowledged. ``NoopSink`` computes the rows and drops
them (Spark's own ceiling, for benchmarks); a benchmark's baselines (Redis) implement the
same ``PartialsSink`` protocol.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

import orjson
import pyarrow as pa
from pyspark.sql import DataFrame, Row

from jobs import metrics
from jobs.coordinator import coordinator_for
from jobs.partials import PART, Plan, aggregate, fragment_writer
from service.core.manifest import Fragments
from service.core.operator import OperatorSpec, save_spec
from service.core.storage import Storage

__all__ = ["BatchReport", "NoopSink", "OperatorReport", "PartialsSink", "QStateSink",
           "Reports", "batch_watermark_ms"]


def batch_watermark_ms(checkpoint: str, batch: int) -> int:
    """The watermark of ``batch``, from Spark's offset log (0 before the first batch)."""
    if batch < 0:
        return 0
    lines = Storage(checkpoint).read_bytes(f"offsets/{batch}").split(b"\n")
    return int(orjson.loads(lines[1]).get("batchWatermarkMs", 0))


@dataclass
class OperatorReport:
    rows: int = 0  # partial rows written for the operator
    write_s: float = 0.0  # aggregate + write delta files (one Spark job)
    commit_s: float = 0.0
    applied: int = 0
    skipped: int = 0


@dataclass
class BatchReport:
    batch: int
    events: int
    dead_lettered: dict[str, int]
    watermark_ms: int
    late_ms: int
    read_s: float  # source + parse (+ persist)
    total_s: float
    operators: dict[str, OperatorReport] = field(default_factory=dict)


@dataclass
class Reports:
    """What the job did, batch by batch (for metrics, the status line and benchmarks)."""

    batches: deque[BatchReport] = field(default_factory=lambda: deque(maxlen=10_000))

    @property
    def last(self) -> BatchReport | None:
        return self.batches[-1] if self.batches else None


class PartialsSink(Protocol):
    def prepare(self, specs: list[OperatorSpec]) -> None: ...

    def write(self, rows: DataFrame, plan: Plan, watermark_ms: int) -> OperatorReport:
        """Take one operator's rows of a batch: projected by Spark for merged operators
        (``MergeOperator.project``, aggregated by the sink on the executors), final values
        for spark-state ones (``plan.spec.mode``)."""
        ...


def _written(result: list[Row]) -> dict[int, Fragments]:
    out: dict[int, Fragments] = {}
    for r in result:
        out.setdefault(r["partition"], {})[r["fragment"]] = r["rows"]
    return out


class QStateSink:
    """Delta files on checkpoint storage, then ``Commit(N)`` on every owning shard."""

    def __init__(self, storage_uri: str, shards: list[str] | None,
                 commit_timeout_s: float) -> None:
        self.storage_uri = storage_uri
        self.shards = shards
        self.commit_timeout_s = commit_timeout_s

    def prepare(self, specs: list[OperatorSpec]) -> None:
        storage = Storage(self.storage_uri)
        for spec in specs:
            save_spec(storage, spec)
        self.coordinator = coordinator_for(storage, specs[0].job, self.shards,
                                           self.commit_timeout_s)
        for spec in specs:
            self.coordinator.register(spec)

    def write(self, rows: DataFrame, plan: Plan, watermark_ms: int) -> OperatorReport:
        spec = plan.spec
        t0 = time.perf_counter()
        final = spec.mode == "spark-state"
        if final:  # one task per shard partition: Spark's rows are whole values
            tasks = int(rows.sparkSession.conf.get("spark.sql.shuffle.partitions") or 200)
            rows = rows.repartition(min(tasks, spec.partitions), PART)
        written = _written(rows.mapInArrow(fragment_writer(plan, self.storage_uri, final),
                                           "partition int, fragment int, rows long").collect())
        t1 = time.perf_counter()
        done = self.coordinator.commit(spec, plan.batch, watermark_ms, written)
        metrics.COMMIT_SECONDS.labels(spec.job, spec.operator).observe(done.seconds)
        return OperatorReport(sum(sum(f.values()) for f in written.values()), t1 - t0,
                              done.seconds, done.applied, done.skipped)


class NoopSink:
    """Computes every operator's partials and drops them: Spark's own ceiling."""

    def prepare(self, specs: list[OperatorSpec]) -> None:
        pass

    def write(self, rows: DataFrame, plan: Plan, watermark_ms: int) -> OperatorReport:
        t0 = time.perf_counter()

        def count(it: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            batches = list(it)
            n = aggregate(pa.Table.from_batches(batches), plan).num_rows if batches else 0
            yield pa.RecordBatch.from_arrays([pa.array([n], pa.int64())], ["rows"])

        n = sum(r["rows"] for r in rows.mapInArrow(count, "rows long").collect())
        return OperatorReport(n, time.perf_counter() - t0)
