"""A queryable job in merge mode: one streaming query, every operator served
(docs/architecture.md §3).

    events = parse_json(read_kafka(spark, bootstrap, "tweet-events"), FIELDS, ...)
    job = QueryableJob("tweets", events, event_time="time", watermark="10 seconds")
    job.operator("per_tweet_1h").groupBy(window("1 hour"), "tweet_id").agg(
        A.count(when=F.col("event") == "impression").alias("impressions"),
        A.count(when=F.col("event") == "url-click").alias("clicks"))
    job.operator("per_tweet_1m").where(F.col("event") == "impression") \\
        .groupBy(window("1 minute", "10 seconds"), "tweet_id").agg(A.count().alias("impressions"))

Each micro-batch is one Spark job: the topic is read and parsed once, and every operator's
per-batch partial aggregates are computed from the same rows on the executors
(``qstate.jobs.runtime.pipeline``, ``qstate.jobs.runtime.partials``), stateless: no Spark
state store, the shard is the state. The watermark is Spark's own (``withWatermark`` on the
stream): batch N drops, per window, rows whose window ended at or before batch N-1's
watermark, exactly as Spark's stateful aggregation does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from qstate.core.errors import InvalidRequest
from qstate.core.records.operator import MERGEABLE, Aggregate, OperatorSpec, WindowSpec
from qstate.jobs.aggregates import Agg
from qstate.jobs.windows import Window, duration_ms

__all__ = ["EVENT_TS", "MergeOperator", "QueryableJob", "SparkStateOperator", "columns",
           "dlq_topic"]

# The event-time column qstate adds to the stream for Spark's watermark.
EVENT_TS = "_qs_event_ts"


def columns(j: int, n_inputs: int) -> tuple[str, str, list[str]]:
    """The names operator ``j``'s key, partition and inputs have in the batch's projection,
    which holds every operator's side by side; the executors' runtime
    (``qstate.jobs.runtime.partials``) reads them by these names."""
    return f"_qs_k{j}", f"_qs_p{j}", [f"_qs_a{j}_{i}" for i in range(n_inputs)]


def dlq_topic(topic: str) -> str:
    """Where the bad records of ``topic`` go."""
    return f"{topic}.dlq"


@dataclass(frozen=True)
class SparkStateOperator:
    """An aggregation Spark keeps the state of (``qstate.jobs.runtime.spark_state.serve``): its own
    query."""

    name: str
    frame: DataFrame  # a streaming aggregation in update mode
    key: str
    states: list[str]
    window: WindowSpec


@dataclass
class MergeOperator:
    name: str
    key: str
    window: WindowSpec
    aggs: list[Agg]
    where: Column | None = None
    specs: dict[str, Aggregate] = field(default_factory=dict)  # set by QueryableJob.add
    replicas: int = 1  # copies of each partition on distinct shard servers (OperatorSpec)

    def spec(self, job: str, partitions: int, retention_ms: int) -> OperatorSpec:
        return OperatorSpec(job, self.name, self.key, dict(self.specs), partitions,
                            self.window, retention_ms, self.replicas)

    def columns(self, j: int, partitions: int) -> list[Column]:
        """This operator's columns in the batch's projection (named by ``columns``): its key
        as a string (null where the row is not the operator's), the key's shard partition and
        each aggregate's input, evaluated by Spark; the executors aggregate them
        (``qstate.jobs.runtime.partials.run_operators``)."""
        key_name, part_name, input_names = columns(j, len(self.aggs))
        key = F.col(self.key).cast("string")
        mine = key if self.where is None else F.when(self.where, key)
        return [mine.alias(key_name),
                F.pmod(F.xxhash64(key), F.lit(partitions)).cast("int").alias(part_name),
                *[a.input().alias(n) for a, n in zip(self.aggs, input_names, strict=True)]]


class _Grouped:
    def __init__(self, job: QueryableJob, name: str, where: Column | None, window: WindowSpec,
                 key: str, replicas: int) -> None:
        self._job, self._name, self._where, self._window, self._key = (job, name, where,
                                                                        window, key)
        self._replicas = replicas

    def agg(self, *aggs: Agg) -> MergeOperator:
        for a in aggs:
            if not isinstance(a, Agg):
                raise InvalidRequest(
                    f"operator {self._name!r}: {a!r} is not an aggregate qstate can merge "
                    f"({', '.join(sorted(MERGEABLE))}, from qstate.jobs.aggregates); aggregate it "
                    "with Spark's own groupBy and serve it with "
                    "qstate.jobs.runtime.spark_state.serve (spark-state mode)")
        op = MergeOperator(self._name, self._key, self._window, list(aggs), self._where,
                           replicas=self._replicas)
        self._job.add(op)
        return op


class _Builder:
    def __init__(self, job: QueryableJob, name: str, replicas: int) -> None:
        self._job, self._name, self._replicas = job, name, replicas
        self._where: Column | None = None

    def where(self, condition: Column) -> _Builder:
        self._where = condition if self._where is None else (self._where & condition)
        return self

    filter = where

    def groupBy(self, *by: Window | str) -> _Grouped:
        windows = [b for b in by if isinstance(b, Window)]
        keys = [b for b in by if isinstance(b, str)]
        if len(windows) > 1 or len(keys) != 1 or len(by) != len(windows) + len(keys):
            raise InvalidRequest(f"operator {self._name!r}: groupBy takes one key column "
                                 "(a name) and at most one window(...) or session_window(...)")
        w = windows[0].spec if windows else WindowSpec()
        return _Grouped(self._job, self._name, self._where, w, keys[0], self._replicas)


class QueryableJob:
    """The operators of one job, computed from one stream of parsed events."""

    def __init__(self, name: str, events: DataFrame, *, event_time: str,
                 watermark: str | int, topic: str) -> None:
        self.name = name
        self.topic = topic
        self.event_time = event_time
        self.watermark_ms = duration_ms(watermark)
        self.events = events
        self.operators: list[MergeOperator] = []
        self.spark_state: list[SparkStateOperator] = []

    def operator(self, name: str, *, replicas: int = 1) -> _Builder:
        """A queryable operator. ``replicas=2``: each partition also has a follower on another
        shard server that applies the same batches and answers reads when the owner dies,
        without a restore gap."""
        if any(op.name == name for op in self.operators):
            raise InvalidRequest(f"job {self.name!r} already has an operator {name!r}")
        return _Builder(self, name, replicas)  # checked by OperatorSpec

    def serve_spark_state(self, op: SparkStateOperator) -> None:
        """Serve an aggregation Spark keeps the state of, in its own streaming query."""
        if op.name in {o.name for o in self.operators} | {o.name for o in self.spark_state}:
            raise InvalidRequest(f"job {self.name!r} already has an operator {op.name!r}")
        self.spark_state.append(op)

    def add(self, op: MergeOperator) -> None:
        names = [a.label for a in op.aggs]
        if len(set(names)) != len(names) or not names:
            raise InvalidRequest(f"operator {op.name!r}: give each aggregate its own name")
        for a in op.aggs:
            op.specs[a.label] = a.aggregate(self.events)
        if op.key not in self.events.columns:
            raise InvalidRequest(f"operator {op.name!r}: key column {op.key!r} is not one of "
                                 f"{self.events.columns}")
        self.operators.append(op)

    def event_ms(self) -> Column:
        """The event time as epoch milliseconds, whatever its declared type."""
        dtype = self.events.schema[self.event_time].dataType
        col = F.col(self.event_time)
        if isinstance(dtype, T.TimestampType | T.TimestampNTZType):
            return F.unix_millis(col)
        if isinstance(dtype, T.LongType | T.IntegerType):
            return col.cast("long")
        raise InvalidRequest(f"event time {self.event_time!r} is {dtype.simpleString()}: use "
                             "epoch milliseconds (long) or a timestamp")

    def watermarked(self) -> DataFrame:
        """The stream with Spark's watermark on the event time: Spark tracks the maximum
        event time and records each batch's watermark in its offset log."""
        ts = F.timestamp_millis(self.event_ms())
        return self.events.withColumn(EVENT_TS, ts).withWatermark(
            EVENT_TS, f"{self.watermark_ms} milliseconds")

