"""Where a batch's per-operator rows go, and what each batch did.

``QStateSink`` is qstate's: delta files on checkpoint storage, then ``Commit(N)`` on every
owning shard, returning only when each acknowledged. ``NoopSink`` computes the rows and drops
them (Spark's own ceiling, for benchmarks); a benchmark's baselines (Redis) implement the
same ``PartialsSink`` protocol.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

import orjson
from pyspark.sql import DataFrame

from jobs import metrics
from jobs.coordinator import coordinator_for
from jobs.deltas import write_deltas
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
    write_s: float = 0.0  # aggregate + write (one Spark job)
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

    def write(self, spec: OperatorSpec, partials: DataFrame, batch: int,
              watermark_ms: int) -> OperatorReport: ...


class QStateSink:
    """Delta files on checkpoint storage, then ``Commit(N)`` on every owning shard."""

    def __init__(self, storage_uri: str, shards: list[str] | None, commit_timeout_s: float,
                 tasks: int) -> None:
        self.storage_uri = storage_uri
        self.shards = shards
        self.commit_timeout_s = commit_timeout_s
        self.tasks = tasks

    def prepare(self, specs: list[OperatorSpec]) -> None:
        storage = Storage(self.storage_uri)
        for spec in specs:
            save_spec(storage, spec)
        self.coordinator = coordinator_for(storage, specs[0].job, self.shards,
                                           self.commit_timeout_s)
        for spec in specs:
            self.coordinator.register(spec)

    def write(self, spec: OperatorSpec, partials: DataFrame, batch: int,
              watermark_ms: int) -> OperatorReport:
        t0 = time.perf_counter()
        written = write_deltas(partials, spec, self.storage_uri, batch, self.tasks)
        t1 = time.perf_counter()
        done = self.coordinator.commit(spec, batch, watermark_ms, written)
        metrics.COMMIT_SECONDS.labels(spec.job, spec.operator).observe(done.seconds)
        return OperatorReport(sum(written.values()), t1 - t0, done.seconds, done.applied,
                              done.skipped)


class NoopSink:
    """Computes every operator's partials and drops them: Spark's own ceiling."""

    def prepare(self, specs: list[OperatorSpec]) -> None:
        pass

    def write(self, spec: OperatorSpec, partials: DataFrame, batch: int,
              watermark_ms: int) -> OperatorReport:
        t0 = time.perf_counter()
        rows = partials.count()
        return OperatorReport(rows, time.perf_counter() - t0)
