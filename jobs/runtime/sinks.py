"""Where a batch's per-operator rows go, and what each batch did.

``QStateSink`` is qstate's: delta files on checkpoint storage, then ``Commit(N)`` on every
owning shard, returning only when each acknowledged. ``NoopSink`` computes the rows and drops
them (Spark's own ceiling, for benchmarks); a benchmark's baselines (Redis) implement the
same ``PartialsSink`` protocol.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

import orjson
from pyspark.sql import DataFrame, Row

from qstate.control.coordinator import coordinator_for
from qstate.core.config import settings
from qstate.core.process import faults
from qstate.core.records.manifest import Fragments, Offsets
from qstate.core.records.operator import OperatorSpec, save_spec
from qstate.core.records.storage import Storage
from qstate.jobs.runtime import metrics
from qstate.jobs.runtime.commit import CommitOutcome, Committer
from qstate.jobs.runtime.partials import (
    PART,
    RESULT,
    DeltaFiles,
    Discard,
    Plan,
    Target,
    final_writer,
)
from qstate.jobs.runtime.reports import OperatorReport

__all__ = ["NoopSink", "PartialsSink", "QStateSink", "batch_log", "batch_watermark_ms",
           "written_by_operator"]


def batch_log(checkpoint: str, batch: int) -> tuple[int, Offsets]:
    """What Spark's offset log says of ``batch`` (one read): its watermark, and where it ends
    in its Kafka source, exclusive (each partition's next offset to read). The entry is a
    version line, the batch's metadata, then one line per source; lines of other sources
    are not Kafka's and left out."""
    lines = Storage(checkpoint).read_bytes(f"offsets/{batch}").split(b"\n")
    watermark = int(orjson.loads(lines[1]).get("batchWatermarkMs", 0))
    out: Offsets = {}
    for line in lines[2:]:
        try:
            source = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(source, dict):
            continue
        for topic, parts in source.items():
            if isinstance(parts, dict) and all(
                    str(p).isdigit() and type(o) is int for p, o in parts.items()):
                out[str(topic)] = {int(p): o for p, o in parts.items()}
    return watermark, out


def batch_watermark_ms(checkpoint: str, batch: int) -> int:
    """The watermark of ``batch``, from Spark's offset log (0 before the first batch)."""
    return 0 if batch < 0 else batch_log(checkpoint, batch)[0]


class PartialsSink(Protocol):
    """Where a batch's partial rows go: an executor-side ``target`` that takes each task's
    rows, and a driver-side ``finish`` once every task is done."""

    def prepare(self, specs: list[OperatorSpec]) -> None: ...

    def target(self) -> Target: ...

    def finish(self, plan: Plan, written: dict[int, Fragments], watermark_ms: int
               ) -> OperatorReport: ...

    def flush(self, operator: str | None = None) -> object:
        """Wait for what ``finish`` left under way (e.g. commits being delivered)."""
        ...


class QStateSink:
    """Delta files on checkpoint storage, then ``Commit(N)`` on every owning shard.

    Commits are pipelined: batch N is recorded (its manifest: from then on any shard can
    catch up on it from storage) before ``foreachBatch`` returns, and delivered to the shards
    while Spark computes batch N+1, which first waits for N's acknowledgement. So Spark's
    commit log runs at most one batch ahead of the served state, never ahead of what is
    durable, and a failed delivery fails the next batch.

    The driver's fault points (``qstate.core.process.faults``) are the steps of ``finish(N)``:
    ``driver.after-deltas`` (N-1 acknowledged, N's deltas written, no manifest),
    ``driver.after-record`` (N's manifest written, no Commit sent) and
    ``driver.after-commit`` (N acknowledged by every shard: only an armed fault waits for
    that inside ``finish``, so the driver dies before Spark commits N).
    """

    def __init__(self, storage_uri: str, shards: list[str] | None,
                 commit_timeout_s: float) -> None:
        self.storage_uri = storage_uri
        self.shards = shards
        self.commit_timeout_s = commit_timeout_s
        self._pool = ThreadPoolExecutor(thread_name_prefix="deliver")
        self._pending: dict[str, Future[CommitOutcome]] = {}
        self._lock = threading.Lock()  # finish (the query's thread) and flush (anyone's)

    def prepare(self, specs: list[OperatorSpec]) -> None:
        storage = Storage(self.storage_uri)
        for spec in specs:
            save_spec(storage, spec)
        self.coordinator = coordinator_for(storage, specs[0].job, self.shards)
        self.committer = Committer(self.coordinator, self.commit_timeout_s,
                                   settings().manifest_gc_every)
        for spec in specs:
            self.coordinator.register(spec)

    def target(self) -> Target:
        return DeltaFiles(self.storage_uri)

    def finish(self, plan: Plan, written: dict[int, Fragments], watermark_ms: int
               ) -> OperatorReport:
        """Wait for the previous batch's delivery, record this one, start delivering it.
        The report tells the previous batch's outcome (``applied``/``skipped``) and how
        long this batch waited for it (``commit_s``)."""
        spec = plan.spec
        t0 = time.perf_counter()
        before = self.flush(spec.operator)
        waited = time.perf_counter() - t0
        faults.hit("driver.after-deltas", plan.batch, spec.operator)
        self.committer.record(spec, plan.batch, watermark_ms, written, plan.offsets)
        faults.hit("driver.after-record", plan.batch, spec.operator)
        with self._lock:
            self._pending[spec.operator] = self._pool.submit(
                self._deliver, spec, plan.batch, watermark_ms, written)
        if faults.at("driver.after-commit", plan.batch, spec.operator):
            self.flush(spec.operator)
            faults.die()
        return OperatorReport(sum(sum(f.values()) for f in written.values()), 0.0, waited,
                              before.applied if before else 0, before.skipped if before else 0)

    def _deliver(self, spec: OperatorSpec, batch: int, watermark_ms: int,
                 written: dict[int, Fragments]) -> CommitOutcome:
        done = self.committer.deliver(spec, batch, watermark_ms, written)
        metrics.COMMIT_SECONDS.labels(spec.job, spec.operator).observe(done.seconds)
        return done

    def flush(self, operator: str | None = None) -> CommitOutcome | None:
        """Wait for the pending delivery of ``operator`` (of every operator: None); raises
        its failure. Returns the outcome of the last one waited for."""
        with self._lock:
            names = [operator] if operator is not None else list(self._pending)
            futures = [f for n in names if (f := self._pending.pop(n, None)) is not None]
        outcome = None
        for fut in futures:
            outcome = fut.result()
        return outcome

    def write_final(self, rows: DataFrame, plan: Plan, watermark_ms: int) -> OperatorReport:
        """Spark-state mode: Spark's updated rows (with ``PART``) are the values."""
        t0 = time.perf_counter()
        tasks = int(rows.sparkSession.conf.get("spark.sql.shuffle.partitions") or 200)
        rows = rows.repartition(min(tasks, plan.spec.partitions), PART)
        written = written_by_operator(rows.mapInArrow(
            final_writer(plan, self.target()), RESULT).collect()).get(0, {})
        t1 = time.perf_counter()
        batch, operator = plan.batch, plan.spec.operator
        faults.hit("driver.after-deltas", batch, operator)
        # delivered before the batch ends: spark-state mode is not pipelined
        self.committer.record(plan.spec, batch, watermark_ms, written, plan.offsets)
        faults.hit("driver.after-record", batch, operator)
        done = self._deliver(plan.spec, batch, watermark_ms, written)
        faults.hit("driver.after-commit", batch, operator)
        return OperatorReport(sum(sum(f.values()) for f in written.values()), t1 - t0,
                              done.seconds, done.applied, done.skipped)


class NoopSink:
    """Computes every operator's partials and drops them: Spark's own ceiling."""

    def prepare(self, specs: list[OperatorSpec]) -> None:
        pass

    def flush(self, operator: str | None = None) -> None:
        pass

    def target(self) -> Target:
        return Discard()

    def finish(self, plan: Plan, written: dict[int, Fragments], watermark_ms: int
               ) -> OperatorReport:
        return OperatorReport(sum(sum(f.values()) for f in written.values()))


def written_by_operator(result: list[Row]) -> dict[int, dict[int, Fragments]]:
    """operator -> partition -> fragment -> rows, from the tasks' reports."""
    out: dict[int, dict[int, Fragments]] = {}
    for r in result:
        if r["op"] >= 0:
            out.setdefault(r["op"], {}).setdefault(r["partition"], {})[r["fragment"]] = r["rows"]
    return out
