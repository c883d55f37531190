"""Aggregates qstate merges, declared the way ``pyspark.sql.functions`` reads:

    from qstate.jobs import aggregates as A
    A.count().alias("views")
    A.count(when=F.col("event") == "url-click").alias("clicks")
    A.sum("price").alias("revenue"), A.avg("latency_ms"), A.max("t")
    A.approx_count_distinct("user_id").alias("users")     # HyperLogLog, mergeable

Spark evaluates each one's input per row (``input``: a column expression, null where ``when``
does not hold); the batch's partial aggregates are computed on the executors
(``qstate.jobs.runtime.partials``) and combined with the stored value on the shard
(``qstate.partition.codec``): count and sum add, min and max keep the extreme, avg adds its sum
and count, approx_count_distinct unions Apache DataSketches HLL sketches. ``when`` counts or
aggregates only the rows where the condition holds, in the same pass.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from qstate.core.errors import InvalidRequest
from qstate.core.records.operator import Aggregate, StateType

__all__ = ["Agg", "approx_count_distinct", "avg", "count", "max", "min", "state_type", "sum"]

Kind = Literal["count", "sum", "min", "max", "avg", "approx_count_distinct"]
ColumnLike = str | Column


@dataclass(frozen=True)
class Agg:
    kind: Kind
    column: ColumnLike | None  # None: count rows
    when: Column | None = None
    name: str | None = None
    lg_k: int = 12

    def alias(self, name: str) -> Agg:
        return replace(self, name=name)

    @property
    def label(self) -> str:
        if self.name is None:
            raise InvalidRequest(f"an aggregate {self.kind}({self._described()}) needs a name: "
                                 "add .alias(\"...\")")
        return self.name

    def _described(self) -> str:
        return "*" if self.column is None else str(self.column)

    def input(self) -> Column:
        """The value this aggregate takes of a row: null where ``when`` does not hold."""
        col = F.lit(1) if self.column is None else (
            F.col(self.column) if isinstance(self.column, str) else self.column)
        return F.when(self.when, col) if self.when is not None else col

    def aggregate(self, events: DataFrame) -> Aggregate:
        """The stored aggregate, its answer type decided by the input column's type."""
        if self.kind in ("count", "approx_count_distinct"):
            return Aggregate(self.kind, "long", self.lg_k if self.kind != "count" else 0)
        if self.kind == "avg":
            return Aggregate("avg", "double")
        dtype = events.select(self.input().alias("_x")).schema["_x"].dataType
        return Aggregate(self.kind, _numeric(dtype, self))


def state_type(dtype: T.DataType) -> StateType | None:
    """How a value of Spark type ``dtype`` is stored: integral values exactly (long), the
    rest of the numbers as double; None for what cannot be aggregated."""
    if isinstance(dtype, T.LongType | T.IntegerType | T.ShortType | T.ByteType):
        return "long"
    if isinstance(dtype, T.DoubleType | T.FloatType | T.DecimalType):
        return "double"
    return None


def _numeric(dtype: T.DataType, agg: Agg) -> StateType:
    if (kind := state_type(dtype)) is not None:
        return kind
    raise InvalidRequest(f"{agg.kind}({agg._described()}) of a {dtype.simpleString()} column: "
                         "only integral (exact) and floating values can be aggregated")


def count(column: ColumnLike | None = None, *, when: Column | None = None) -> Agg:
    """Rows (or rows where ``column`` is not null), optionally only where ``when`` holds."""
    return Agg("count", None if column == "*" else column, when)


def sum(column: ColumnLike, *, when: Column | None = None) -> Agg:
    return Agg("sum", column, when)


def min(column: ColumnLike, *, when: Column | None = None) -> Agg:
    return Agg("min", column, when)


def max(column: ColumnLike, *, when: Column | None = None) -> Agg:
    return Agg("max", column, when)


def avg(column: ColumnLike, *, when: Column | None = None) -> Agg:
    return Agg("avg", column, when)


def approx_count_distinct(column: ColumnLike, lg_k: int = 12, *,
                          when: Column | None = None) -> Agg:
    """Distinct values, estimated by a HyperLogLog sketch of 2**lg_k registers (lg_k 12:
    about 1.6% relative error), mergeable across batches and partitions."""
    return Agg("approx_count_distinct", column, when, lg_k=lg_k)
