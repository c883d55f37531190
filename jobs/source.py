"""A Kafka streaming source for PySpark 4.3 written as a Python data source ("qstate-kafka").

Why not Spark's own Kafka connector: it needs the spark-sql-kafka jar (and its Maven
resolution) on every machine; this source needs only confluent-kafka, which qstate already
uses everywhere else.

Offsets are ``{"<kafka partition>": next offset to read}``. A micro-batch is the half-open range
``[start, end)`` per Kafka partition; ``read`` returns exactly the records of that range, so a
batch replayed after a failure sees the same rows. Partitions that appear after the query
started are read from offset 0.

Options (``spark.readStream.format("qstate-kafka").option(...)``):

``bootstrap``           bootstrap servers (required)
``topic``               topic to read (required)
``startingOffsets``     ``earliest`` (default) or ``latest``; only used by a fresh checkpoint
``maxRowsPerTrigger``   cap on rows per micro-batch, spread over partitions by backlog
``maxRecordsPerSplit``  a partition range longer than this is split into several Spark tasks
``kafka.<conf>``        passed through to the librdkafka consumers (e.g. security settings)
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

__all__ = [
    "ARROW_SCHEMA",
    "BATCH_ROWS",
    "DEFAULT_MAX_RECORDS_PER_SPLIT",
    "METADATA_TIMEOUT_S",
    "POLL_TIMEOUT_S",
    "SCHEMA",
    "SOURCE_NAME",
    "STALL_TIMEOUT_S",
    "KafkaDataSource",
    "KafkaRange",
    "KafkaRangeUnavailable",
    "KafkaStreamReader",
    "SourceOptions",
    "cap_end_offsets",
    "close_worker_consumers",
    "plan_ranges",
    "read_kafka",
    "read_range",
    "register",
]

log = logging.getLogger(__name__)
SOURCE_NAME = "qstate-kafka"

# Built as a StructType rather than DDL: parsing DDL needs a JVM, and the reader runs in
# Python processes that have none.
SCHEMA = StructType([
    StructField("key", StringType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
])
# Spark compares the batches we yield against to_arrow_schema(SCHEMA, timezone="UTC") with
# Schema.equals, so this must match it field for field (types and nullability).
ARROW_SCHEMA = pa.schema([
    pa.field("key", pa.string()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
])

DEFAULT_MAX_RECORDS_PER_SPLIT = 200_000
BATCH_ROWS = 10_000
# consume() returns early once it has the messages asked for, so this only bounds the wait
# when the broker has nothing for us, which for a range below the high watermark means trouble.
POLL_TIMEOUT_S = 1.0
# How long a range read may go without receiving a single record before we give up.
STALL_TIMEOUT_S = 60.0
METADATA_TIMEOUT_S = 15.0


class KafkaRangeUnavailable(RuntimeError):
    """A planned offset range can no longer be read as planned (deleted, truncated, stalled)."""


# --------------------------------------------------------------------------------------------
# options


@dataclass(frozen=True)
class SourceOptions:
    bootstrap: str
    topic: str
    starting_offsets: str = "earliest"
    max_rows_per_trigger: int | None = None
    max_records_per_split: int = DEFAULT_MAX_RECORDS_PER_SPLIT
    kafka_conf: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        # Spark hands us a case-insensitive dict keyed in lower case; normalise so a plain
        # dict (as in unit tests) behaves the same.
        opts = {str(k).lower(): str(v) for k, v in options.items()}

        def required(name: str) -> str:
            value = opts.get(name.lower(), "").strip()
            if not value:
                raise ValueError(f"{SOURCE_NAME}: option '{name}' is required")
            return value

        def positive_int(name: str) -> int | None:
            raw = opts.get(name.lower())
            if raw is None or raw.strip() == "":
                return None
            try:
                value = int(raw)
            except ValueError:
                raise ValueError(
                    f"{SOURCE_NAME}: option '{name}' must be an integer, got {raw!r}"
                ) from None
            if value <= 0:
                raise ValueError(f"{SOURCE_NAME}: option '{name}' must be positive, got {value}")
            return value

        starting = opts.get("startingoffsets", "earliest").strip().lower()
        if starting not in ("earliest", "latest"):
            raise ValueError(
                f"{SOURCE_NAME}: startingOffsets must be 'earliest' or 'latest', got {starting!r}"
            )
        return cls(
            bootstrap=required("bootstrap"),
            topic=required("topic"),
            starting_offsets=starting,
            max_rows_per_trigger=positive_int("maxRowsPerTrigger"),
            max_records_per_split=positive_int("maxRecordsPerSplit")
            or DEFAULT_MAX_RECORDS_PER_SPLIT,
            kafka_conf={k[len("kafka."):]: v for k, v in opts.items() if k.startswith("kafka.")},
        )

    def consumer_conf(self) -> dict[str, Any]:
        return {
            "bootstrap.servers": self.bootstrap,
            # assign() never joins the group; librdkafka just insists on having one.
            "group.id": "qstate-kafka-source",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            # A start offset that no longer exists must fail loudly, never silently jump.
            "auto.offset.reset": "error",
            "enable.partition.eof": False,
            "allow.auto.create.topics": False,
            # Idle connections get closed by brokers all the time; that is not news.
            "log.connection.close": False,
            **self.kafka_conf,
        }


# --------------------------------------------------------------------------------------------
# planning (pure functions, so they are easy to test and identical on every run)


def _as_offsets(d: Mapping[str, Any] | None) -> dict[int, int]:
    return {int(p): int(o) for p, o in (d or {}).items()}


def _to_json_offsets(d: Mapping[int, int]) -> dict[str, int]:
    # Spark decides "new data or not" by comparing the JSON of the offsets, so key order must
    # never depend on how the dict was built.
    return {str(p): int(d[p]) for p in sorted(d)}


def cap_end_offsets(
    start: Mapping[int, int], latest: Mapping[int, int], max_rows: int
) -> dict[int, int]:
    """End offsets reading at most ``max_rows`` rows in total from ``start`` towards ``latest``.

    Rows are shared in proportion to each partition's backlog (so partitions stay roughly aligned
    in time); the rounding remainder goes to the largest fractional shares, ties by partition id.
    Integer arithmetic only, so the same inputs always give the same end.
    """
    backlog = {p: max(0, latest[p] - start.get(p, 0)) for p in sorted(latest)}
    total = sum(backlog.values())
    if total <= max_rows:
        return {p: start.get(p, 0) + n for p, n in backlog.items()}
    take = {p: max_rows * n // total for p, n in backlog.items()}
    remainder = max_rows - sum(take.values())
    # A non-zero fractional part means take[p] < exact share <= backlog[p], so +1 always fits.
    by_fraction = sorted(backlog, key=lambda p: (-(max_rows * backlog[p] % total), p))
    for p in by_fraction[:remainder]:
        take[p] += 1
    return {p: start.get(p, 0) + take[p] for p in backlog}


@dataclass(frozen=True)
class KafkaRange(InputPartition):
    """``[start, end)`` of one Kafka partition; one Spark task."""

    topic: str
    partition: int
    start: int
    end: int


def plan_ranges(
    topic: str, start: Mapping[int, int], end: Mapping[int, int], max_records_per_split: int
) -> list[KafkaRange]:
    ranges: list[KafkaRange] = []
    for p in sorted(end):
        lo, hi = start.get(p, 0), end[p]
        if hi <= lo:
            continue
        pieces = -(-(hi - lo) // max_records_per_split)
        # Equal-sized pieces rather than full pieces plus a runt, so tasks finish together.
        step = -(-(hi - lo) // pieces)
        ranges.extend(
            KafkaRange(topic, p, s, min(s + step, hi)) for s in range(lo, hi, step)
        )
    return ranges


# --------------------------------------------------------------------------------------------
# executor side: reading one range


# One consumer per (worker process, configuration): Python workers are reused across tasks and
# a new consumer costs ~50 ms. It is only ever assigned while a range is being read; an
# assigned consumer fetches continuously, which against an idle broker burns a core.
_WORKER_CONSUMERS: dict[tuple[tuple[str, str], ...], Consumer] = {}
_WORKER_PID = os.getpid()


def close_worker_consumers() -> None:
    """Close this process's cached read consumers (tests; also run at interpreter exit)."""
    while _WORKER_CONSUMERS:
        _, consumer = _WORKER_CONSUMERS.popitem()
        with contextlib.suppress(Exception):  # best effort at interpreter exit
            consumer.close()


atexit.register(close_worker_consumers)


def _worker_consumer(conf: dict[str, Any]) -> Consumer:
    global _WORKER_PID
    if os.getpid() != _WORKER_PID:
        # librdkafka threads do not survive fork(); a consumer inherited from the parent is dead.
        _WORKER_CONSUMERS.clear()
        _WORKER_PID = os.getpid()
    key = tuple(sorted((k, str(v)) for k, v in conf.items()))
    consumer = _WORKER_CONSUMERS.get(key)
    if consumer is None:
        consumer = _WORKER_CONSUMERS[key] = Consumer(conf)
    return consumer


def _to_batch(
    topic: str, partition: int, msgs: list[Message], offsets: list[int]
) -> pa.RecordBatch:
    n = len(msgs)
    # One comprehension per column over the kept Message objects: the read loop got about
    # twice as fast as when it appended field by field while filtering.
    keys = [m.key() for m in msgs]
    key_arr = pa.array(keys, pa.binary())
    try:
        key_arr = key_arr.cast(pa.string())
    except pa.ArrowInvalid:
        # Keys are declared string; a key that is not UTF-8 is kept readable, not fatal.
        key_arr = pa.array(
            [None if k is None else k.decode("utf-8", "replace") for k in keys], pa.string()
        )
    # librdkafka reports -1 when a message has no timestamp.
    ts_ms = pa.array([m.timestamp()[1] for m in msgs], pa.int64())
    ts_ms = pc.if_else(pc.less(ts_ms, 0), pa.scalar(None, pa.int64()), ts_ms)
    ts = pc.multiply(ts_ms, 1000).cast(pa.timestamp("us", tz="UTC"))
    return pa.RecordBatch.from_arrays(
        [
            key_arr,
            pa.array([m.value() for m in msgs], pa.binary()),
            pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.repeat(pa.scalar(partition, pa.int32()), n),
            pa.array(offsets, pa.int64()),
            ts,
        ],
        schema=ARROW_SCHEMA,
    )


def _raise_for_error(rng: KafkaRange, err: KafkaError) -> None:
    if err.code() == KafkaError._PARTITION_EOF:
        return
    if err.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
        raise KafkaRangeUnavailable(f"{_describe(rng)}: {err.str()}")
    if err.retriable() or err.code() in _TRANSIENT:
        # a broker restarting or a leader moving: keep polling; the stall timeout bounds it
        log.warning("%s: %s; still reading", _describe(rng), err.str())
        return
    raise KafkaException(err)


_TRANSIENT = {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
              KafkaError._UNKNOWN_PARTITION, KafkaError.UNKNOWN_TOPIC_OR_PART,
              KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE}


def _watermarks_retrying(consumer: Consumer, tp: TopicPartition,
                         timeout: float) -> tuple[int, int]:
    """A broker that is restarting answers "unknown partition" or nothing for a while: wait
    for it (up to ``timeout``) rather than fail the task, which a local master won't retry."""
    deadline = time.monotonic() + timeout
    delay = 0.1
    while True:
        try:
            return consumer.get_watermark_offsets(tp, timeout=METADATA_TIMEOUT_S, cached=False)
        except KafkaException as exc:
            if time.monotonic() + delay > deadline:
                raise
            log.warning("%s[%d]: %s; retrying", tp.topic, tp.partition, exc)
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


def read_range(
    opts: SourceOptions,
    rng: KafkaRange,
    *,
    batch_rows: int = BATCH_ROWS,
    stall_timeout: float = STALL_TIMEOUT_S,
) -> Iterator[pa.RecordBatch]:
    """Yield the records of ``rng`` as Arrow batches of at most ``batch_rows`` rows.

    Only offsets inside ``[start, end)`` are returned, in offset order, so replaying a range
    gives the same records. Raises KafkaRangeUnavailable if the range is no longer on the broker.
    """
    if rng.end <= rng.start:
        return
    consumer = _worker_consumer(opts.consumer_conf())
    tp = TopicPartition(rng.topic, rng.partition)
    low, high = _watermarks_retrying(consumer, tp, stall_timeout)
    # Checked up front so a lost range fails in milliseconds with a clear reason instead of
    # after a fetch error or a stall timeout.
    if rng.start < low:
        raise KafkaRangeUnavailable(
            f"{_describe(rng)}: offsets {rng.start}..{low - 1} were deleted from the broker "
            f"(earliest available is {low}); the batch cannot be replayed"
        )
    if rng.end > high:
        raise KafkaRangeUnavailable(
            f"{_describe(rng)}: the partition now ends at {high}, before the planned end "
            f"{rng.end} (was the topic deleted or recreated?)"
        )

    consumer.assign([TopicPartition(rng.topic, rng.partition, rng.start)])
    try:
        pending: list[Message] = []
        offsets: list[int] = []
        next_offset = rng.start
        last_progress = time.monotonic()
        while next_offset < rng.end:
            # Never ask for more than remains: consume() waits the whole timeout when fewer
            # than num_messages arrive.
            want = min(batch_rows - len(pending), rng.end - next_offset)
            msgs = consumer.consume(num_messages=want, timeout=POLL_TIMEOUT_S)
            if not msgs:
                if time.monotonic() - last_progress > stall_timeout:
                    raise KafkaRangeUnavailable(
                        f"{_describe(rng)}: no records for {stall_timeout:.0f}s at offset "
                        f"{next_offset}"
                    )
                continue
            last_progress = time.monotonic()
            for m in msgs:
                if (err := m.error()) is not None:
                    _raise_for_error(rng, err)
            offs: list[int] = [m.offset() or 0 for m in msgs]  # always set on a fetched record
            if offs == list(range(next_offset, next_offset + len(offs))):
                # The normal case: exactly the next offsets, and want kept them inside the range.
                pending.extend(msgs)
                offsets.extend(offs)
                next_offset += len(offs)
            else:
                for m, off in zip(msgs, offs, strict=True):
                    if m.error() is not None or off < next_offset:
                        continue  # EOF marker, or a stale record already emitted
                    if off >= rng.end:
                        # Past the range: anything missing before it was compacted away.
                        next_offset = rng.end
                        break
                    pending.append(m)
                    offsets.append(off)
                    next_offset = off + 1
            if len(pending) >= batch_rows:
                yield _to_batch(rng.topic, rng.partition, pending, offsets)
                pending, offsets = [], []
        if pending:
            yield _to_batch(rng.topic, rng.partition, pending, offsets)
    finally:
        # Also runs when Spark abandons the iterator half-way (task killed, limit reached).
        consumer.unassign()


def _describe(rng: KafkaRange) -> str:
    return f"{SOURCE_NAME} {rng.topic}[{rng.partition}] range [{rng.start}, {rng.end})"


# --------------------------------------------------------------------------------------------
# driver side


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches on the driver; ``read`` runs in executor Python workers.

    Spark pickles this object into each read task, so it holds no client until one is needed
    and drops it when pickled.
    """

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._consumer: Consumer | None = None
        # Set by Trigger.AvailableNow: the query must not read past what existed at its start.
        self._available_now: dict[int, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_consumer"] = None
        return state

    # -- metadata -------------------------------------------------------------------------

    def _metadata_consumer(self) -> Consumer:
        # A Consumer rather than an AdminClient: the admin client's metadata request
        # auto-creates a missing topic (with one partition) on brokers that allow it.
        # It is never assigned, so it does not fetch.
        if self._consumer is None:
            self._consumer = Consumer(self.opts.consumer_conf())
        return self._consumer

    def _watermarks(self, which: str) -> dict[int, int]:
        consumer = self._metadata_consumer()
        md = consumer.list_topics(self.opts.topic, timeout=METADATA_TIMEOUT_S)
        tmd = md.topics.get(self.opts.topic)
        if tmd is None or tmd.error is not None:
            if tmd is not None and tmd.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise KafkaException(tmd.error)
            return {}  # not created yet; its partitions will be read from 0 once it exists
        marks: dict[int, int] = {}
        for p in sorted(tmd.partitions):
            low, high = consumer.get_watermark_offsets(
                TopicPartition(self.opts.topic, p), timeout=METADATA_TIMEOUT_S, cached=False
            )
            marks[p] = low if which == "low" else high
        return marks

    # -- DataSourceStreamReader ------------------------------------------------------------

    def initialOffset(self) -> dict:
        which = "low" if self.opts.starting_offsets == "earliest" else "high"
        return _to_json_offsets(self._watermarks(which))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_rows_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.opts.max_rows_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = self._watermarks("high")

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = _as_offsets(start)
        latest = self._available_now
        if latest is None:
            try:
                latest = self._watermarks("high")
            except KafkaException as exc:
                # Broker down or restarting: no new data this trigger rather than a failed
                # query; the next trigger asks again.
                log.warning("%s: cannot read high watermarks (%s); no new data this trigger",
                            self.opts.topic, exc)
                return _to_json_offsets(begin)
        # Never move backwards: a partition that shrank (topic recreated) keeps its position and
        # the reader reports the problem if a range over it is ever planned.
        end = {p: max(begin.get(p, 0), latest.get(p, 0)) for p in sorted(set(begin) | set(latest))}
        if isinstance(limit, ReadMaxRows):
            end = cap_end_offsets(begin, end, limit.max_rows)
        # Other limits (ReadAllAvailable, or ones we do not offer) mean read everything.
        return _to_json_offsets(end)

    def reportLatestOffset(self) -> dict | None:
        return _to_json_offsets(self._watermarks("high"))

    def partitions(self, start: dict, end: dict) -> list[KafkaRange]:
        return plan_ranges(
            self.opts.topic, _as_offsets(start), _as_offsets(end), self.opts.max_records_per_split
        )

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaRange), partition
        return read_range(self.opts, partition)

    def commit(self, end: dict) -> None:
        # Progress lives in Spark's checkpoint; nothing to commit back to Kafka.
        pass

    def stop(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            consumer.close()


class KafkaDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return SCHEMA

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        return KafkaStreamReader(SourceOptions.parse(self.options))


def register(spark: SparkSession) -> None:
    spark.dataSource.register(KafkaDataSource)


def read_kafka(
    spark: SparkSession,
    bootstrap: str,
    topic: str,
    starting_offsets: str = "earliest",
    max_rows_per_trigger: int | None = None,
    max_records_per_split: int | None = None,
) -> DataFrame:
    """Streaming DataFrame over ``topic`` with the columns of ``SCHEMA``."""
    register(spark)
    reader = (
        spark.readStream.format(SOURCE_NAME)
        .option("bootstrap", bootstrap)
        .option("topic", topic)
        .option("startingOffsets", starting_offsets)
    )
    if max_rows_per_trigger is not None:
        reader = reader.option("maxRowsPerTrigger", str(max_rows_per_trigger))
    if max_records_per_split is not None:
        reader = reader.option("maxRecordsPerSplit", str(max_records_per_split))
    return reader.load()
