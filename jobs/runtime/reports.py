"""What a job did, batch by batch: read by its metrics, its status line and the benchmarks.
Plain records with no imports of their own, so every job module can use them."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

__all__ = ["BatchReport", "OperatorReport", "Reports"]


@dataclass
class OperatorReport:
    rows: int = 0  # partial rows written for the operator
    write_s: float = 0.0  # spark-state mode: writing delta files (merge mode: in the batch)
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
    spark_s: float  # the batch's Spark job: source, parse, every operator's partials, deltas
    total_s: float
    operators: dict[str, OperatorReport] = field(default_factory=dict)


@dataclass
class Reports:
    """What the job did, batch by batch (for metrics, the status line and benchmarks)."""

    batches: deque[BatchReport] = field(default_factory=lambda: deque(maxlen=10_000))

    @property
    def last(self) -> BatchReport | None:
        return self.batches[-1] if self.batches else None
