"""JSON parsing of Kafka values with a dead-letter topic, so one bad record never stops a job.

``parse_events(read_kafka(...), {"user": "string", "time": "long"}, keys=["user"], ...)``
turns each Kafka value (a JSON object) into typed columns and keeps every record: a record
that does not fit gets a reason in ``_error`` and a short word in ``_error_kind``, and is
produced to the dead-letter topic (``qstate.jobs.dlq``) before its batch goes downstream.

The rules, exact and the same on both paths below: the value is strict JSON (RFC 8259) in
valid UTF-8, an object of at most ``max_value_bytes``, nested at most 1024 deep, with no
``NaN``/``Infinity``; every declared field must be present and non-null; a string is a JSON
string, a long a JSON integer in the signed 64-bit range (not ``1.0`` nor ``"1"``), a double
any finite JSON number, a boolean ``true``/``false``; a key field (``keys``) must also be a
non-empty string of at most 1 KiB (docs/architecture.md §2). Given ``event_time``, that long
field must be a time Spark's timestamps hold and at most ``max_future_ms`` ahead of the Kafka
record's own timestamp (docs/architecture.md §3): one producer's clock gone wrong must not move
the watermark and turn every later event late.

Speed: a batch is parsed by pyarrow's JSON reader in one go (about 3x ``json.loads``,
docs/architecture.md §8). The reader is more lenient than the rules (it takes invalid UTF-8
inside strings, NaN and Infinity, any depth), so it only takes a batch in which none of those
can occur and every row then passes the typed checks; any other batch is parsed record by
record with orjson, which decides and names each bad record's reason. A record's verdict
therefore never depends on its neighbours.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
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

from qstate.core.address import MAX_KEY_BYTES
from qstate.core.config import settings
from qstate.core.errors import BadRecord, InvalidRequest
from qstate.core.transport.kafka import kafka_properties
from qstate.jobs.dlq import DeadLetterWriter, ensure_dlq

__all__ = ["ARROW_TYPES", "ERROR_COLUMN", "ERROR_KIND", "KINDS", "MAX_EVENT_MS", "PASSTHROUGH",
           "SPARK_TYPES", "EventTime", "check_fields", "parse_batches", "parse_events",
           "parse_json", "parse_value"]

ERROR_COLUMN = "_error"
ERROR_KIND = "_error_kind"
# Kafka's columns: the dead letters' coordinates come from them; a job may keep any of them
# (``keep``), e.g. the record timestamp as its event time. Not kept, they cost nothing after
# the parse.
PASSTHROUGH = ("topic", "partition", "offset", "timestamp")
# The reasons a record is dead-lettered, as metric labels (a fixed, small set).
KINDS = ("null_value", "too_large", "invalid_json", "bad_encoding", "bad_number", "too_deep",
         "not_object", "missing_field", "wrong_type", "out_of_range", "bad_key", "bad_time",
         "future_time")

SPARK_TYPES: dict[str, DataType] = {
    "string": StringType(), "long": LongType(), "double": DoubleType(),
    "boolean": BooleanType()}
ARROW_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(), "long": pa.int64(), "double": pa.float64(), "boolean": pa.bool_()}
# Filler for the typed columns of a bad row (it is kept, marked, and never aggregated).
_FILLER: dict[str, Any] = {"string": "", "long": 0, "double": 0.0, "boolean": False}
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# Spark holds a timestamp as int64 microseconds: epoch ms beyond this overflow
# timestamp_millis (and would fail the batch on every replay)
MAX_EVENT_MS = _INT64_MAX // 1000
# orjson refuses nesting deeper than 1024; the fast path leaves a batch with this many
# brackets in one record to the record-by-record path, which decides
_DEEP = 1000
# a NaN or Infinity token (pyarrow's reader takes them, strict JSON does not): after ':', '['
# or ',' and optional spaces. Inside a string this only sends the batch to the slow path.
_NON_FINITE = r"[:,\[]\s*-?(?:NaN|Inf)"


# ------------------------------------------------------------------------ per-record rules


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
    # JSON has one number type; 3 is as good a double as 3.0. orjson gives no inf or nan
    # (it refuses 1e400), but a huge integer must not become one either.
    if type(v) is float:
        return v
    if type(v) is int and math.isfinite(f := float(v)):
        return f
    raise TypeError


def _as_boolean(v: Any) -> bool:
    if type(v) is bool:
        return v
    raise TypeError


_CONVERTERS: dict[str, Callable[[Any], Any]] = {
    "string": _as_string, "long": _as_long, "double": _as_double, "boolean": _as_boolean}


def check_fields(fields: Mapping[str, str], keys: Sequence[str] = ()) -> None:
    if not fields:
        raise InvalidRequest("parse: no fields given")
    for name, kind in fields.items():
        if kind not in _CONVERTERS:
            raise InvalidRequest(f"parse: field {name!r} has type {kind!r}; supported: "
                                 f"{', '.join(sorted(_CONVERTERS))}")
        if name in (*PASSTHROUGH, ERROR_COLUMN, ERROR_KIND, "key", "value"):
            raise InvalidRequest(f"parse: field name {name!r} clashes with an output column")
    for k in keys:
        if fields.get(k) != "string":
            raise InvalidRequest(f"parse: key field {k!r} must be a declared string field")


def _check_key(name: str, v: str) -> None:
    if not v:
        raise BadRecord(f"field '{name}': an empty key", "bad_key")
    size = len(v.encode("utf-8"))
    if size > MAX_KEY_BYTES:
        raise BadRecord(f"field '{name}': a key of {size} bytes, more than {MAX_KEY_BYTES}",
                        "bad_key")


@dataclass(frozen=True)
class EventTime:
    """The bounds on a record's event time (a declared long field, epoch ms): one a
    Spark timestamp holds, and at most ``max_future_ms`` ahead of the record's Kafka timestamp
    (stamped by the producer's client or the broker, and the same on every replay, unlike the
    job's wall clock; a record without one is not bounded ahead)."""

    field: str
    max_future_ms: int

    def check(self, t: int, record_ms: int | None) -> None:
        if not -MAX_EVENT_MS <= t <= MAX_EVENT_MS:
            raise BadRecord(f"field '{self.field}': {t} ms is outside the times Spark holds "
                            f"(±{MAX_EVENT_MS})", "bad_time")
        if record_ms is not None and t > record_ms + self.max_future_ms:
            raise BadRecord(f"field '{self.field}': {t} is {t - record_ms} ms ahead of its "
                            f"record's timestamp {record_ms}, more than max_future_ms "
                            f"{self.max_future_ms}", "future_time")

    def any_outside(self, times: pa.Array, record_ms: pa.Array) -> bool:
        """Whether any row breaks a bound (then the record-by-record path names which)."""
        # not abs(): it wraps at -2**63; Kleene or: a record without a timestamp (null) still
        # breaks the first bound
        out = pc.or_kleene(pc.or_(pc.greater(times, MAX_EVENT_MS),
                                  pc.less(times, -MAX_EVENT_MS)),
                           pc.greater(times, pc.add(record_ms, self.max_future_ms)))
        return bool(pc.any(out).as_py())


def _json_error_kind(value: bytes, message: str) -> str:
    """The metric word for a value orjson refused: the reasons a careless producer hits."""
    if "depth" in message:
        return "too_deep"
    if "UTF-8" in message or "surrogate" in message or "BOM" in message:
        return "bad_encoding"
    if "infinity" in message:  # 1e400
        return "bad_number"
    non_finite = False

    def constant(_: str) -> None:
        nonlocal non_finite
        non_finite = True

    # the stdlib reader takes NaN/Infinity and says so; orjson only says "unexpected"
    with contextlib.suppress(ValueError, RecursionError):
        json.loads(value, parse_constant=constant)
    return "bad_number" if non_finite else "invalid_json"


def parse_value(value: bytes | None, fields: Mapping[str, str], keys: Sequence[str] = (),
                max_value_bytes: int = 1_048_576, event_time: EventTime | None = None,
                record_ms: int | None = None) -> tuple[Any, ...]:
    """The declared fields of one Kafka value, in ``fields`` order; raises BadRecord.
    ``record_ms`` is the record's Kafka timestamp (epoch ms), for ``event_time``'s bound."""
    if value is None:
        raise BadRecord("value is null (tombstone)", "null_value")
    if len(value) > max_value_bytes:
        raise BadRecord(f"value is {len(value)} bytes, larger than the {max_value_bytes} limit",
                        "too_large")
    try:
        obj = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise BadRecord(f"invalid JSON: {exc}", _json_error_kind(value, str(exc))) from None
    if type(obj) is not dict:
        raise BadRecord(f"value is a JSON {_json_type(obj)}, not an object", "not_object")
    out = []
    for name, kind in fields.items():
        try:
            v = obj[name]
        except KeyError:
            raise BadRecord(f"field '{name}': missing", "missing_field") from None
        try:
            out.append(_CONVERTERS[kind](v))
        except TypeError:
            # orjson reads an integer beyond 64 bits as a double: 1e30 is out of range too
            if kind == "long" and (type(v) is int or (type(v) is float and v.is_integer()
                                                      and abs(v) >= 2**63)):
                raise BadRecord(f"field '{name}': {v} is out of range for a long",
                                "out_of_range") from None
            if type(v) is int and kind == "double":  # an integer too large for one
                raise BadRecord(f"field '{name}': {v} is out of range for a double",
                                "bad_number") from None
            if v is None and name in keys:  # a key that is null is a bad key, not a gap
                raise BadRecord(f"field '{name}': a null key", "bad_key") from None
            kind_word = "missing_field" if v is None else "wrong_type"
            raise BadRecord(f"field '{name}': expected {kind}, got {_json_type(v)}",
                            kind_word) from None
    for k in keys:
        _check_key(k, out[list(fields).index(k)])
    if event_time is not None:
        event_time.check(out[list(fields).index(event_time.field)], record_ms)
    return tuple(out)


# ------------------------------------------------------------------------ whole batches


def _parse_fast(values: pa.Array, schema: pa.Schema, max_value_bytes: int) -> pa.Table | None:
    """pyarrow's reader over the batch as JSON lines; None when any record is not plainly
    good (then the record-by-record path decides, and says why)."""
    if values.null_count or len(values) == 0:
        return None
    lengths = pc.binary_length(values)
    if pc.max(lengths).as_py() > max_value_bytes:
        return None
    # a newline inside a value (JSON allows one between tokens) would split its line
    if pc.any(pc.match_substring(values, "\n")).as_py():
        return None
    # what the reader takes and the rules refuse (module docstring): invalid UTF-8 anywhere,
    # NaN/Infinity, deep nesting
    try:
        values.cast(pa.string())
    except pa.ArrowInvalid:
        return None
    if pc.any(pc.match_substring_regex(values, _NON_FINITE)).as_py():
        return None
    if pc.any(pc.starts_with(values, "\ufeff")).as_py():  # a BOM the reader skips
        return None
    brackets = pc.add(pc.count_substring(values, "["), pc.count_substring(values, "{"))
    if pc.max(brackets).as_py() >= _DEEP:
        return None
    lines = pc.binary_join(pa.ListArray.from_arrays([0, len(values)], values), b"\n")[0]
    try:
        table = pj.read_json(pa.BufferReader(lines.as_buffer()), parse_options=pj.ParseOptions(
            explicit_schema=schema, unexpected_field_behavior="ignore"))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if table.num_rows != len(values) or any(c.null_count for c in table.columns):
        return None
    for c, t in zip(table.columns, schema.types, strict=True):
        if t == pa.float64() and not pc.all(pc.is_finite(c)).as_py():
            return None
    return table.select(schema.names)


def _bad_keys(column: pa.ChunkedArray) -> bool:
    """Any key empty or longer than a key may be (then the slow path names which)."""
    size = pc.binary_length(column)
    return bool(pc.any(pc.or_(pc.equal(size, 0), pc.greater(size, MAX_KEY_BYTES))).as_py())


def _record_ms(batch: pa.RecordBatch) -> pa.Array:
    """Each record's Kafka timestamp, epoch ms (null where it has none)."""
    ts = batch.column("timestamp")
    return pc.divide(ts.cast(pa.timestamp("us")).cast(pa.int64()), 1000)


def parse_batches(batches: Iterator[pa.RecordBatch], fields: Mapping[str, str],
                  keys: Sequence[str], dlq_topic: str | None, bootstrap: str,
                  max_value_bytes: int, keep: Sequence[str] = PASSTHROUGH,
                  event_time: EventTime | None = None,
                  properties: Mapping[str, str] | None = None
                  ) -> Iterator[pa.RecordBatch]:
    """The mapInArrow body: every input row out, typed, with ``_error`` and ``_error_kind``
    set on the bad ones (which also went to the dead-letter topic, written with the Kafka
    client ``properties`` the driver read)."""
    fields = dict(fields)
    kinds = list(fields.values())
    schema = pa.schema([(n, ARROW_TYPES[k]) for n, k in fields.items()])
    filler = tuple(_FILLER[k] for k in kinds)
    names = [*fields, *keep, ERROR_COLUMN, ERROR_KIND]
    writer: DeadLetterWriter | None = None
    for batch in batches:
        n = batch.num_rows
        values = batch.column("value")
        fast = _parse_fast(values, schema, max_value_bytes)
        if fast is not None and any(_bad_keys(fast.column(k)) for k in keys):
            fast = None
        if fast is not None and event_time is not None and event_time.any_outside(
                fast.column(event_time.field).combine_chunks(), _record_ms(batch)):
            fast = None
        if fast is not None:
            none = pa.nulls(n, pa.string())
            arrays = [*fast.columns, *(batch.column(c) for c in keep), none, none]
            yield pa.RecordBatch.from_arrays([a.combine_chunks() if isinstance(
                a, pa.ChunkedArray) else a for a in arrays], names=names)
            continue
        raw = values.to_pylist()
        stamps = _record_ms(batch).to_pylist()
        rows: list[tuple[Any, ...]] = []
        errors: list[str | None] = [None] * n
        why: list[str | None] = [None] * n
        bad: list[int] = []
        for i, value in enumerate(raw):
            try:
                rows.append(parse_value(value, fields, keys, max_value_bytes, event_time,
                                        stamps[i]))
            except BadRecord as exc:
                rows.append(filler)
                errors[i], why[i] = exc.reason, exc.kind
                bad.append(i)
        if bad and dlq_topic is not None:
            writer = writer or DeadLetterWriter(bootstrap, dlq_topic, properties)
            _dead_letter(writer, batch, raw, stamps, bad, errors, why)
        columns = list(zip(*rows, strict=True)) if rows else [() for _ in kinds]
        arrays = [pa.array(col, ARROW_TYPES[k]) for col, k in zip(columns, kinds, strict=True)]
        arrays += [batch.column(c) for c in keep]
        arrays += [pa.array(errors, pa.string()), pa.array(why, pa.string())]
        yield pa.RecordBatch.from_arrays(arrays, names=names)


def _dead_letter(writer: DeadLetterWriter, batch: pa.RecordBatch, values: list[Any],
                 stamps: list[int | None], bad: list[int], errors: list[str | None],
                 why: list[str | None]) -> None:
    keys = batch.column("key").to_pylist()
    topics = batch.column("topic").to_pylist()
    partitions = batch.column("partition").to_pylist()
    offsets = batch.column("offset").to_pylist()
    for i in bad:
        headers = [("qstate.error", str(errors[i]).encode()),
                   ("qstate.kind", str(why[i]).encode()),
                   ("qstate.topic", str(topics[i]).encode()),
                   ("qstate.partition", str(partitions[i]).encode()),
                   ("qstate.offset", str(offsets[i]).encode())]
        if stamps[i] is not None:
            headers.append(("qstate.timestamp", str(stamps[i]).encode()))
        key = keys[i].encode() if isinstance(keys[i], str) else keys[i]
        writer.send(key, values[i], headers)
    # Before the batch goes downstream: once Spark commits it, these must be durable.
    writer.flush()


# ------------------------------------------------------------------------ the Spark side


def _output_schema(fields: Mapping[str, str], input_schema: StructType, keep: Sequence[str]
                   ) -> StructType:
    return StructType(
        [StructField(name, SPARK_TYPES[kind], nullable=False) for name, kind in fields.items()]
        + [input_schema[name] for name in keep]
        + [StructField(ERROR_COLUMN, StringType(), nullable=True),
           StructField(ERROR_KIND, StringType(), nullable=True)])


def parse_events(df: DataFrame, fields: Mapping[str, str], *, keys: Sequence[str] = (),
                 dlq_topic: str | None, bootstrap: str, max_value_bytes: int = 1_048_576,
                 create_dlq: bool = True, keep: Sequence[str] = (),
                 event_time: str | None = None, max_future_ms: int | None = None
                 ) -> DataFrame:
    """Every record of ``df`` (a ``read_kafka`` DataFrame): the declared ``fields`` typed, the
    Kafka columns named in ``keep`` (of topic, partition, offset, timestamp), and
    ``_error``/``_error_kind`` set on the records that do not fit (which go to ``dlq_topic``
    with their reason and coordinates). ``event_time`` names the long field (epoch ms) the
    job's windows and watermark use: bounded as the module says, ``max_future_ms`` ahead of
    the record's timestamp at most (default: the ``max_future_ms`` setting)."""
    check_fields(fields, keys)
    bound = None
    if event_time is not None:
        if fields.get(event_time) != "long":
            raise InvalidRequest(f"parse: event_time {event_time!r} must be a declared long "
                                 "field (epoch milliseconds)")
        bound = EventTime(event_time, settings().max_future_ms if max_future_ms is None
                          else max_future_ms)
    if set(keep) - set(PASSTHROUGH):
        raise InvalidRequest(f"parse: keep takes some of {PASSTHROUGH}, not {list(keep)}")
    missing = [c for c in ("key", "value", *PASSTHROUGH) if c not in df.columns]
    if missing:
        raise InvalidRequest(f"parse: input lacks columns {missing}; expected read_kafka output")
    # read here, on the driver, and carried to the executors in the task: their Python
    # workers need not have the driver's environment (QSTATE_KAFKA_PROPERTIES)
    props = kafka_properties()
    if create_dlq and dlq_topic is not None:
        ensure_dlq(bootstrap, dlq_topic, properties=props)
    fields = dict(fields)
    keys, keep = list(keys), list(keep)

    def parse(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return parse_batches(batches, fields, keys, dlq_topic, bootstrap, max_value_bytes, keep,
                             bound, props)

    return df.select("key", "value", *PASSTHROUGH).mapInArrow(
        parse, _output_schema(fields, df.schema, keep))


def parse_json(df: DataFrame, fields: Mapping[str, str], *, keys: Sequence[str] = (),
               dlq_topic: str | None, bootstrap: str, max_value_bytes: int = 1_048_576,
               create_dlq: bool = True, keep: Sequence[str] = (),
               event_time: str | None = None, max_future_ms: int | None = None) -> DataFrame:
    """``parse_events`` without the bad records: only the good ones, without the error
    columns (for a plain Spark aggregation, e.g. in spark-state mode)."""
    return parse_events(df, fields, keys=keys, dlq_topic=dlq_topic, bootstrap=bootstrap,
                        max_value_bytes=max_value_bytes, create_dlq=create_dlq, keep=keep,
                        event_time=event_time, max_future_ms=max_future_ms) \
        .where(F.col(ERROR_KIND).isNull()).drop(ERROR_COLUMN, ERROR_KIND)
