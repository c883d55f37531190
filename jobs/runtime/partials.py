"""One operator's per-batch partial aggregates, computed on the executors in Arrow.

Spark evaluates the operator's filter and every aggregate's input expression (the JVM is
good at that), and hands each task's rows over as Arrow batches with the columns ``KEY``,
``TIME``, ``PART`` (the key's shard partition, ``pmod(xxhash64(key), P)``) and one input per
aggregate. Here each task assigns its rows to windows or panes with Spark's late-data rule
(``qstate.core.windows``), groups them with Arrow's hash aggregation and hands the partial
rows on: as delta files of its own (one fragment per partition it holds), or to a benchmark's
baseline. All of a job's operators are aggregated in the same pass over a task's rows, and
there is no Spark shuffle: the shard combines fragments of the same key as it combines
batches, so a key seen by two tasks is still counted once by each.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from qstate.core.address import PartitionId
from qstate.core.records import delta as deltas
from qstate.core.records.manifest import Offsets
from qstate.core.records.operator import Aggregate, OperatorSpec
from qstate.core.records.storage import Storage
from qstate.core.windows import ALL_WINDOWS, first_open_start
from qstate.jobs.queryable import columns
from qstate.partition.codec import INT64_MAX, INT64_MIN

__all__ = ["INPUT", "KEY", "PART", "RESULT", "TIME", "DeltaFiles", "Discard", "Plan", "Target",
           "aggregate", "final_writer", "run_operators", "split_by_partition"]

# The columns Spark hands over (qstate.jobs.queryable projects them).
KEY, TIME, PART = "_qs_key", "_qs_t", "_qs_p"


def INPUT(i: int) -> str:
    return f"_qs_a{i}"


_NO_TAG = 0  # the tag of rows that are not panes (replaced by null in the delta)


@dataclass(frozen=True)
class Plan:
    """What a task needs to aggregate one operator's rows of one batch."""

    spec: OperatorSpec
    late_ms: int  # batch N-1's watermark: a window ended at or before it takes no more rows
    batch: int
    # where the batch ends in its source (Spark's offset log), recorded in its manifest for
    # GET /v1/jobs/{job}/position (docs/architecture.md §5); the driver's, not the tasks'
    offsets: Offsets = field(default_factory=dict, compare=False)


def _assign(t: np.ndarray, plan: Plan) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Window (or pane) start, end and tag of each row, and which rows are kept."""
    w, late = plan.spec.window, plan.late_ms
    n = len(t)
    tags = np.full(n, _NO_TAG, np.int64)
    if w.kind == "none":
        zeros = np.zeros(n, np.int64)
        return zeros, zeros, tags, np.ones(n, bool)
    if w.kind == "tumbling":
        start = t - t % w.size_ms
        end = start + w.size_ms
        return start, end, tags, end > late
    if w.kind == "sliding":
        size, slide, g = w.size_ms, w.slide_ms, w.pane_ms
        pane = t - t % g
        older = pane - size
        oldest = older - older % slide + slide
        newest = pane - pane % slide
        open_from = first_open_start(late, size, slide)
        tags = np.where(open_from <= oldest, ALL_WINDOWS, open_from).astype(np.int64)
        return pane, pane + g, tags, open_from <= newest
    # session: each row opens [t, t + gap); late when that ended at or before the watermark
    return t, t + w.gap_ms, tags, t + w.gap_ms > late


def _sessions(rows: pa.Table, gap: int) -> pa.Array:
    """Session ids within one batch: rows sorted by (key, time), a new session where the key
    changes or the gap to the previous row is more than ``gap`` (Spark merges a row whose
    [t, t + gap) touches the session's end)."""
    k, t = rows.column(KEY).combine_chunks(), rows.column(TIME).to_numpy()
    new = np.ones(len(t), bool)
    if len(t) > 1:
        same = pc.equal(k.slice(1), k.slice(0, len(k) - 1)).to_numpy(zero_copy_only=False)
        new[1:] = ~same | (np.diff(t) > gap)
    return pa.array(np.cumsum(new))


def _sketches(rows: pa.Table, groups: list[str], column: str, lg_k: int) -> pa.Table:
    """An HLL sketch per group of the column's non-null values."""
    import datasketches as ds

    listed = rows.group_by(groups, use_threads=False).aggregate([(column, "list")])
    out = []
    for values in listed.column(f"{column}_list").to_pylist():
        sketch = ds.hll_sketch(lg_k, ds.tgt_hll_type.HLL_8)
        for v in values:
            if v is not None:
                sketch.update(v)
        out.append(sketch.serialize_updatable() if not sketch.is_empty() else None)
    return listed.drop_columns([f"{column}_list"]).append_column(column, pa.array(out,
                                                                                   pa.binary()))


def _saturated(wrapped: pa.ChunkedArray, witness: pa.ChunkedArray) -> pa.Array:
    """A long sum as the shard keeps it (qstate.partition.codec): at the int64 bound it
    crossed where Arrow's sum wrapped, which the float64 sum of the same values shows (a wrap
    is 2**64 away from it; rounding, many orders of magnitude less)."""
    s = wrapped.fill_null(0).to_numpy()
    f = witness.fill_null(0.0).to_numpy()
    valid = pc.is_valid(wrapped).to_numpy(zero_copy_only=False)
    over = np.abs(f - s.astype(np.float64)) > 2.0**62
    out = np.where(over, np.where(f > 0, INT64_MAX, INT64_MIN), s)
    return pa.array(out, pa.int64(), mask=~valid)


# ---- one aggregate's partial, by kind: the columns of ``delta_fields`` and how a task's rows
# give them (Arrow's hash aggregation; a sketch built beside it) --------------------------------


class _Partial:
    """Aggregate ``name`` (``agg``) of the input column ``col``: count, min or max, or a sum of
    doubles, as Arrow's aggregation of the same name gives it."""

    def __init__(self, name: str, col: str, agg: Aggregate) -> None:
        self.name, self.col, self.agg = name, col, agg

    def prepare(self, rows: pa.Table) -> pa.Table:
        """The task's rows with any column this aggregation needs added."""
        return rows

    def aggregations(self) -> list[tuple[str, str]]:
        return [(self.col, self.agg.kind)]

    def joined(self, out: pa.Table, rows: pa.Table, groups: list[str]) -> pa.Table:
        """The grouped rows ``out`` (of ``rows``) with what is built beside the aggregation."""
        return out

    def columns(self, out: pa.Table) -> dict[str, pa.ChunkedArray | pa.Array]:
        """Its delta columns, of the grouped rows."""
        return {self.name: out.column(f"{self.col}_{self.agg.kind}")}


class _LongSum(_Partial):
    """Arrow's int64 sum wraps: a float64 sum of the same values beside it is the witness that
    says where, and the sum is saturated there as the shard keeps it (``_saturated``)."""

    def prepare(self, rows: pa.Table) -> pa.Table:
        return rows.append_column(f"{self.col}__f",
                                  rows.column(self.col).cast(pa.float64(), safe=False))

    def aggregations(self) -> list[tuple[str, str]]:
        return [(self.col, "sum"), (f"{self.col}__f", "sum")]

    def columns(self, out: pa.Table) -> dict[str, pa.ChunkedArray | pa.Array]:
        return {self.name: _saturated(out.column(f"{self.col}_sum"),
                                      out.column(f"{self.col}__f_sum"))}


class _Avg(_Partial):
    """A double sum and a count: the shard divides at read time."""

    def prepare(self, rows: pa.Table) -> pa.Table:
        return rows.set_column(rows.schema.get_field_index(self.col), self.col,
                               rows.column(self.col).cast(pa.float64(), safe=False))

    def aggregations(self) -> list[tuple[str, str]]:
        return [(self.col, "sum"), (self.col, "count")]

    def columns(self, out: pa.Table) -> dict[str, pa.ChunkedArray | pa.Array]:
        return {f"{self.name}__sum": out.column(f"{self.col}_sum"),
                f"{self.name}__n": out.column(f"{self.col}_count")}


class _Sketch(_Partial):
    """approx_count_distinct: an HLL sketch per group, built beside the aggregation
    (``_sketches``) and joined to it under the input column's name."""

    def aggregations(self) -> list[tuple[str, str]]:
        return []

    def joined(self, out: pa.Table, rows: pa.Table, groups: list[str]) -> pa.Table:
        sketches = _sketches(rows, groups, self.col, self.agg.lg_k)
        return out.join(sketches, groups, join_type="left outer", use_threads=False)

    def columns(self, out: pa.Table) -> dict[str, pa.ChunkedArray | pa.Array]:
        return {self.name: out.column(self.col)}


def _partial(name: str, col: str, agg: Aggregate) -> _Partial:
    if agg.kind == "sum" and agg.type == "long":
        return _LongSum(name, col, agg)
    kinds: dict[str, type[_Partial]] = {"count": _Partial, "min": _Partial, "max": _Partial,
                                        "sum": _Partial, "avg": _Avg,
                                        "approx_count_distinct": _Sketch}
    return kinds[agg.kind](name, col, agg)


def aggregate(rows: pa.Table, plan: Plan) -> pa.Table:
    """The partial rows of ``rows`` (one task's): ``PART``, key, start, end, tag and the
    partial columns ``qstate.core.records.delta.delta_fields`` names."""
    spec = plan.spec
    t = rows.column(TIME).to_numpy(zero_copy_only=False)
    start, end, tag, keep = _assign(t, plan)
    rows = rows.append_column("_s", pa.array(start)).append_column("_e", pa.array(end)) \
        .append_column("_g", pa.array(tag)).filter(pa.array(keep))
    w = spec.window
    if w.kind == "session":
        rows = rows.sort_by([(KEY, "ascending"), (TIME, "ascending")])
        rows = rows.append_column("_sid", _sessions(rows, w.gap_ms))
        groups = [PART, KEY, "_sid"]
        bounds = [("_s", "min"), ("_e", "max")]
    else:
        groups = [PART, KEY, "_s", "_g"]
        bounds = [("_e", "max")]
    parts = [_partial(name, INPUT(i), a) for i, (name, a) in enumerate(spec.states.items())]
    aggs: list[tuple[str, str]] = list(bounds)
    for part in parts:
        rows = part.prepare(rows)
        aggs += part.aggregations()
    out = rows.group_by(groups, use_threads=False).aggregate(aggs)
    for part in parts:
        out = part.joined(out, rows, groups)
    start_col = "_s_min" if w.kind == "session" else "_s"
    columns: dict[str, pa.Array | pa.ChunkedArray] = {
        PART: out.column(PART), "key": out.column(KEY),
        "start": out.column(start_col), "end": out.column("_e_max"),
        "tag": out.column("_g") if spec.panes else pa.nulls(out.num_rows, pa.int64())}
    if w.kind == "none":
        columns["start"] = columns["end"] = pa.nulls(out.num_rows, pa.int64())
    for part in parts:
        columns.update(part.columns(out))
    schema = deltas.delta_schema(spec)
    table = pa.table(columns)
    return table.select([PART, *schema.names]).cast(
        pa.schema([pa.field(PART, pa.int32()), *schema]))


def split_by_partition(table: pa.Table) -> Iterator[tuple[int, pa.Table]]:
    """(partition, its rows without the partition column), partitions ascending."""
    table = table.sort_by([(PART, "ascending")])
    parts = table.column(PART).to_numpy()
    cuts = [0, *((parts[1:] != parts[:-1]).nonzero()[0] + 1).tolist(), len(parts)]
    body = table.drop_columns([PART])
    for lo, hi in itertools.pairwise(cuts):
        if hi > lo:
            yield int(parts[lo]), body.slice(lo, hi - lo)


class Target(Protocol):
    """Where a task's partial rows of an operator go (runs on the executors, pickled)."""

    def consume(self, plan: Plan, rows: pa.Table, fragment: int) -> list[tuple[int, int]]:
        """Take ``rows`` (with ``PART``); returns (partition, rows taken) pairs."""
        ...


@dataclass(frozen=True)
class DeltaFiles:
    """qstate's target: one delta fragment per shard partition, named by the task, so a
    re-run task rewrites the same files."""

    storage_uri: str

    def consume(self, plan: Plan, rows: pa.Table, fragment: int) -> list[tuple[int, int]]:
        storage = Storage(self.storage_uri)
        out = []
        for p, part in split_by_partition(rows):
            pid = PartitionId(plan.spec.job, plan.spec.operator, p)
            deltas.write_delta(storage, pid, plan.batch, part, fragment, plan.spec.states)
            out.append((p, part.num_rows))
        return out


@dataclass(frozen=True)
class Discard:
    """Counts the partial rows and drops them (Spark's own ceiling, for benchmarks)."""

    def consume(self, plan: Plan, rows: pa.Table, fragment: int) -> list[tuple[int, int]]:
        return [(-1, rows.num_rows)]


# One row per thing a task reports: the events it read (op -1, no kind), the records it
# dead-lettered by reason (op -1, kind), the partial rows it handed on per operator and
# partition (op >= 0).
RESULT = "op int, kind string, partition int, fragment int, rows long"


def _task_rows(it: Iterator[pa.RecordBatch]) -> tuple[pa.Table, int] | None:
    """A task's rows as one table, and its Spark partition id (the fragment its delta files
    are numbered by); None for an empty task."""
    from pyspark import TaskContext

    batches = list(it)
    if not batches:
        return None
    fragment = TaskContext.get().partitionId()  # type: ignore[union-attr]
    return pa.Table.from_batches(batches), fragment


def _result(out: list[tuple[int, str | None, int, int]], fragment: int) -> pa.RecordBatch:
    """A task's report in ``RESULT``'s shape: (operator, dead-letter kind, partition, rows)
    of one fragment."""
    ops, kinds, parts, ns = zip(*out, strict=True) if out else ((), (), (), ())
    return pa.RecordBatch.from_arrays(
        [pa.array(ops, pa.int32()), pa.array(kinds, pa.string()), pa.array(parts, pa.int32()),
         pa.array([fragment] * len(out), pa.int32()), pa.array(ns, pa.int64())],
        ["op", "kind", "partition", "fragment", "rows"])


def run_operators(plans: list[Plan], target: Target, error_kind: str
                  ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The mapInArrow function of a merged batch: a task's rows (every operator's columns,
    ``error_kind`` set on dead-lettered records) aggregated per operator and handed to
    ``target``, one pass for all operators."""

    def run(it: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task = _task_rows(it)
        if task is None:
            return
        table, fragment = task
        out: list[tuple[int, str | None, int, int]] = [(-1, None, -1, table.num_rows)]
        kinds = table.column(error_kind)
        if kinds.null_count < table.num_rows:
            counted = pc.value_counts(kinds.drop_null().combine_chunks())
            out += [(-1, str(v["values"]), -1, int(v["counts"])) for v in counted.to_pylist()]
        good = table.filter(pc.is_null(kinds))
        for j, plan in enumerate(plans):
            key, part, inputs = columns(j, len(plan.spec.states))
            rows = good.select([key, TIME, part, *inputs]).rename_columns(
                [KEY, TIME, PART, *(INPUT(i) for i in range(len(inputs)))])
            rows = rows.filter(pc.is_valid(rows.column(KEY)))
            if rows.num_rows:
                for p, n in target.consume(plan, aggregate(rows, plan), fragment):
                    out.append((j, None, p, n))
        yield _result(out, fragment)

    return run


def final_writer(plan: Plan, target: Target
                 ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The mapInArrow function of a spark-state batch: Spark's updated rows, whole values
    (with ``PART``), handed to ``target`` as they are."""

    def write(it: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task = _task_rows(it)
        if task is None:
            return
        table, fragment = task
        out = target.consume(plan, table, fragment) if table.num_rows else []
        yield _result([(0, None, p, n) for p, n in out], fragment)

    return write
