"""JSON parsing of Kafka values with a dead-letter topic, so one bad record never stops a job.

``parse_json(read_kafka(...), {"user": "string", "time": "long"}, dlq_topic=..., bootstrap=...)``
turns each Kafka value (a JSON object) into typed, non-null columns. A record that cannot be
parsed is produced to the dead-letter topic instead:

* key and value: the original bytes (the key as the source decoded it; qstate-kafka keys are
  strings, so a key that was not valid UTF-8 arrives with replacement characters)
* headers ``qstate.error`` (why, naming the field), ``qstate.topic``, ``qstate.partition``,
  ``qstate.offset`` and ``qstate.timestamp`` (epoch ms; absent when the record had none)

Delivery is at-least-once. The DLQ is flushed before each output batch is handed to Spark, so a
committed micro-batch never loses a dead letter; but when a micro-batch is replayed (task retry,
restart after a crash) its bad records are produced again. Duplicates carry identical
``qstate.topic``/``qstate.partition``/``qstate.offset`` headers, which is the key to drop them by.

Counts land in the streaming progress as observed metrics (``observedMetrics["qstate_parse"]``:
``rows`` seen and ``dead_lettered``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DataType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from service.core.errors import BadRecord

__all__ = [
    "ARROW_TYPES",
    "DLQ_FLUSH_TIMEOUT_S",
    "DLQ_MAX_MESSAGE_BYTES",
    "ERROR_COLUMN",
    "METRICS_NAME",
    "PASSTHROUGH",
    "SPARK_TYPES",
    "DeadLetterWriter",
    "check_fields",
    "close_dlq_producers",
    "ensure_dlq",
    "parse_batches",
    "parse_json",
    "parse_value",
]

ERROR_COLUMN = "_error"
PASSTHROUGH = ("topic", "partition", "offset", "timestamp")
METRICS_NAME = "qstate_parse"

SPARK_TYPES: dict[str, DataType] = {
    "string": StringType(),
    "long": LongType(),
    "double": DoubleType(),
    "boolean": BooleanType(),
}
ARROW_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "long": pa.int64(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
}
# Filler for the typed columns of a bad row: the columns are declared non-null, and the row is
# filtered out right after the metrics have counted it.
_FILLER: dict[str, Any] = {"string": "", "long": 0, "double": 0.0, "boolean": False}

# The DLQ must take whatever the source topic took, plus our headers. Brokers default to ~1 MB
# per record (noida-db and Kafka alike: max.message.bytes=1048588), so ensure_dlq raises it on
# the topic and the producer allows as much.
DLQ_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
DLQ_FLUSH_TIMEOUT_S = 120.0
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


# ------------------------------------------------------------------------ per-record parsing


def _json_type(v: Any) -> str:
    # Named like the declared kinds so "expected long, got double" reads naturally.
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "long"
    if isinstance(v, float):
        return "double"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return type(v).__name__


def _as_string(v: Any) -> str:
    if type(v) is str:
        return v
    raise TypeError


def _as_long(v: Any) -> int:
    # type() rather than isinstance(): bool is an int subclass, and true is not a long.
    if type(v) is int and _INT64_MIN <= v <= _INT64_MAX:
        return v
    raise TypeError


def _as_double(v: Any) -> float:
    # JSON has one number type; 3 is as good a double as 3.0.
    if type(v) is float:
        return v
    if type(v) is int:
        return float(v)
    raise TypeError


def _as_boolean(v: Any) -> bool:
    if type(v) is bool:
        return v
    raise TypeError


_CONVERTERS: dict[str, Callable[[Any], Any]] = {
    "string": _as_string,
    "long": _as_long,
    "double": _as_double,
    "boolean": _as_boolean,
}


def check_fields(fields: Mapping[str, str]) -> None:
    if not fields:
        raise ValueError("parse_json: no fields given")
    for name, kind in fields.items():
        if kind not in _CONVERTERS:
            raise ValueError(
                f"parse_json: field {name!r} has type {kind!r}; "
                f"supported: {', '.join(sorted(_CONVERTERS))}"
            )
        if name in (*PASSTHROUGH, ERROR_COLUMN):
            raise ValueError(f"parse_json: field name {name!r} clashes with an output column")


def parse_value(
    value: bytes | None, fields: Mapping[str, str], max_value_bytes: int = 1_048_576
) -> tuple[Any, ...]:
    """The declared fields of one Kafka value, in ``fields`` order; raises BadRecord."""
    if value is None:
        raise BadRecord("value is null (tombstone)")
    if len(value) > max_value_bytes:
        raise BadRecord(f"value is {len(value)} bytes, larger than the {max_value_bytes} limit")
    try:
        obj = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise BadRecord(f"invalid JSON: {exc}") from None
    if type(obj) is not dict:
        raise BadRecord(f"value is a JSON {_json_type(obj)}, not an object")
    out = []
    for name, kind in fields.items():
        try:
            v = obj[name]
        except KeyError:
            raise BadRecord(f"field '{name}': missing") from None
        try:
            out.append(_CONVERTERS[kind](v))
        except TypeError:
            if type(v) is int and kind == "long":
                raise BadRecord(f"field '{name}': {v} is out of range for a long") from None
            raise BadRecord(f"field '{name}': expected {kind}, got {_json_type(v)}") from None
    return tuple(out)


# ------------------------------------------------------------------------ dead-letter topic


def ensure_dlq(
    bootstrap: str,
    topic: str,
    partitions: int = 1,
    max_message_bytes: int = DLQ_MAX_MESSAGE_BYTES,
    timeout: float = 15.0,
) -> None:
    """Create the DLQ topic if missing, sized for large records.

    Not service.kafka.ensure_topic: that cannot set topic configs, and a DLQ created with the
    broker default of ~1 MB per record would reject exactly the oversized values it is for.
    An existing topic is left as it is.
    """
    admin = AdminClient({"bootstrap.servers": bootstrap, "log.connection.close": False})
    # list_topics() without a topic name: asking for one topic auto-creates it on brokers
    # that allow that, with default configs.
    if topic in admin.list_topics(timeout=timeout).topics:
        return
    new = NewTopic(
        topic,
        num_partitions=partitions,
        replication_factor=1,
        config={"max.message.bytes": str(max_message_bytes + 64 * 1024)},
    )
    for fut in admin.create_topics([new], request_timeout=timeout).values():
        try:
            fut.result(timeout)
        except KafkaException as exc:  # created concurrently by someone else is fine
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise


# One producer per worker process: Python workers are reused across tasks. An idle producer
# sends nothing, so unlike a consumer it is fine to keep around.
_PRODUCERS: dict[str, Producer] = {}
_PRODUCERS_PID = os.getpid()


def close_dlq_producers(timeout: float = 10.0) -> None:
    """Flush and close this process's cached DLQ producers (tests; also at interpreter exit)."""
    while _PRODUCERS:
        _, producer = _PRODUCERS.popitem()
        with contextlib.suppress(Exception):
            producer.flush(timeout)
            producer.close()


atexit.register(close_dlq_producers)


def _producer(bootstrap: str) -> Producer:
    global _PRODUCERS_PID
    if os.getpid() != _PRODUCERS_PID:
        _PRODUCERS.clear()  # librdkafka handles do not survive fork()
        _PRODUCERS_PID = os.getpid()
    producer = _PRODUCERS.get(bootstrap)
    if producer is None:
        producer = _PRODUCERS[bootstrap] = Producer({
            "bootstrap.servers": bootstrap,
            "message.max.bytes": DLQ_MAX_MESSAGE_BYTES,
            "compression.type": "lz4",
            "linger.ms": 20,
            "acks": "all",
            # Delivery must resolve (either way) well within the flush timeout.
            "message.timeout.ms": int(DLQ_FLUSH_TIMEOUT_S * 1000 / 2),
            "log.connection.close": False,
        })
    return producer


class DeadLetterWriter:
    """Produces bad records for one output batch and waits until the broker has them all."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.producer = _producer(bootstrap)
        self._failed: list[tuple[KafkaError, bytes | None, bytes | None, list]] = []

    def _delivery(self, key: bytes | None, value: bytes | None, headers: list) -> Callable:
        def on_delivery(err: KafkaError | None, _msg: Any) -> None:
            if err is not None:
                self._failed.append((err, key, value, headers))

        return on_delivery

    def send(
        self, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]
    ) -> None:
        try:
            self._produce(key, value, headers)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.MSG_SIZE_TOO_LARGE:
                raise
            self._produce_without_value(key, value, headers, exc.args[0])

    def _produce(self, key: bytes | None, value: bytes | None, headers: list) -> None:
        while True:
            try:
                self.producer.produce(
                    self.topic, value=value, key=key, headers=headers,
                    on_delivery=self._delivery(key, value, headers),
                )
                return
            except BufferError:
                self.producer.poll(0.1)  # local queue full: let deliveries drain

    def _produce_without_value(
        self, key: bytes | None, value: bytes | None, headers: list, err: KafkaError
    ) -> None:
        # Bigger than the DLQ accepts even though the source topic took it. Keeping the job
        # alive beats keeping the bytes: the coordinates headers still point at the original.
        size = 0 if value is None else len(value)
        note = f"{size} bytes, dropped: {err.str()}".encode()
        self._produce(key, None, [*headers, ("qstate.value_dropped", note)])

    def flush(self) -> None:
        remaining = self.producer.flush(DLQ_FLUSH_TIMEOUT_S)
        failed, self._failed = self._failed, []
        retried = False
        for err, key, value, headers in failed:
            if err.code() != KafkaError.MSG_SIZE_TOO_LARGE:
                # Failing the task is the only way not to lose it: Spark retries the batch.
                raise KafkaException(err)
            self._produce_without_value(key, value, headers, err)
            retried = True
        if retried:
            remaining = self.producer.flush(DLQ_FLUSH_TIMEOUT_S)
            if self._failed:
                raise KafkaException(self._failed[0][0])
        if remaining:
            raise RuntimeError(f"dead-letter topic {self.topic}: {remaining} records undelivered")


# ------------------------------------------------------------------------ the Spark side


def _output_schema(fields: Mapping[str, str], input_schema: StructType) -> StructType:
    return StructType(
        [StructField(name, SPARK_TYPES[kind], nullable=False) for name, kind in fields.items()]
        + [input_schema[name] for name in PASSTHROUGH]
        + [StructField(ERROR_COLUMN, StringType(), nullable=True)]
    )


def _timestamps_ms(batch: pa.RecordBatch) -> list[int | None]:
    ts = batch.column("timestamp")
    return pc.divide(ts.cast(pa.timestamp("us")).cast(pa.int64()), 1000).to_pylist()


def parse_batches(
    batches: Iterator[pa.RecordBatch],
    fields: Mapping[str, str],
    dlq_topic: str | None,
    bootstrap: str,
    max_value_bytes: int,
) -> Iterator[pa.RecordBatch]:
    """The mapInArrow body: every input row out, typed, with ``_error`` set on the bad ones."""
    fields = dict(fields)
    kinds = list(fields.values())
    filler = tuple(_FILLER[k] for k in kinds)
    writer: DeadLetterWriter | None = None
    for batch in batches:
        values = batch.column("value").to_pylist()
        rows: list[tuple[Any, ...]] = []
        errors: list[str | None] = [None] * len(values)
        bad: list[int] = []
        for i, value in enumerate(values):
            try:
                rows.append(parse_value(value, fields, max_value_bytes))
            except BadRecord as exc:
                rows.append(filler)
                errors[i] = exc.reason
                bad.append(i)

        if bad and dlq_topic is not None:
            writer = writer or DeadLetterWriter(bootstrap, dlq_topic)
            keys = batch.column("key").to_pylist()
            topics = batch.column("topic").to_pylist()
            partitions = batch.column("partition").to_pylist()
            offsets = batch.column("offset").to_pylist()
            stamps = _timestamps_ms(batch)
            for i in bad:
                headers = [
                    ("qstate.error", errors[i].encode()),  # type: ignore[union-attr]
                    ("qstate.topic", str(topics[i]).encode()),
                    ("qstate.partition", str(partitions[i]).encode()),
                    ("qstate.offset", str(offsets[i]).encode()),
                ]
                if stamps[i] is not None:
                    headers.append(("qstate.timestamp", str(stamps[i]).encode()))
                key = None if keys[i] is None else keys[i].encode()
                writer.send(key, values[i], headers)
            # Before the batch goes downstream: once Spark commits it, these must be durable.
            writer.flush()

        columns = list(zip(*rows, strict=True)) if rows else [() for _ in kinds]
        arrays = [pa.array(col, ARROW_TYPES[k]) for col, k in zip(columns, kinds, strict=True)]
        arrays += [batch.column(name) for name in PASSTHROUGH]
        arrays.append(pa.array(errors, pa.string()))
        yield pa.RecordBatch.from_arrays(arrays, names=[*fields, *PASSTHROUGH, ERROR_COLUMN])


def parse_json(
    df: DataFrame,
    fields: dict[str, str],
    *,
    dlq_topic: str | None,
    bootstrap: str,
    max_value_bytes: int = 1_048_576,
    metrics_name: str = METRICS_NAME,
    create_dlq: bool = True,
) -> DataFrame:
    """Typed columns ``fields`` + topic, partition, offset, timestamp; bad records to the DLQ.

    ``fields`` maps name to "string" | "long" | "double" | "boolean". ``df`` is a read_kafka
    DataFrame. Observed metrics ``metrics_name`` (rows, dead_lettered) are attached; use a
    different name if one query parses twice. ``dlq_topic=None`` only counts and drops bad
    records: for a second query over the same topic, whose bad records the first one already
    dead-lettered.
    """
    check_fields(fields)
    missing = [c for c in ("key", "value", *PASSTHROUGH) if c not in df.columns]
    if missing:
        raise ValueError(f"parse_json: input lacks columns {missing}; expected read_kafka output")
    if create_dlq and dlq_topic is not None:
        ensure_dlq(bootstrap, dlq_topic)
    fields = dict(fields)
    schema = _output_schema(fields, df.schema)

    def parse(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return parse_batches(batches, fields, dlq_topic, bootstrap, max_value_bytes)

    parsed = df.select("key", "value", *PASSTHROUGH).mapInArrow(parse, schema)
    bad = F.col(ERROR_COLUMN).isNotNull()
    observed = parsed.observe(
        metrics_name,
        F.count(F.lit(1)).alias("rows"),
        F.sum(F.when(bad, 1).otherwise(0)).alias("dead_lettered"),
    )
    return observed.filter(~bad).drop(ERROR_COLUMN)
