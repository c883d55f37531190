"""Parsing events: typed output, exact rules on both paths (pyarrow for whole batches,
orjson record by record), dead letters with their reasons and source coordinates."""

from __future__ import annotations

import math
import os
import time
from collections import Counter

import orjson
import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from hypothesis import given, settings
from hypothesis import strategies as st

from qstate.core.errors import BadRecord, InvalidRequest
from qstate.jobs.dlq import DeadLetterWriter, close_dlq_producers
from qstate.jobs.parse import (
    ERROR_KIND,
    KINDS,
    MAX_EVENT_MS,
    EventTime,
    check_fields,
    parse_batches,
    parse_events,
    parse_value,
)
from qstate.jobs.source import read_kafka

FIELDS = {"user": "string", "time": "long", "amount": "double", "ok": "boolean"}


@pytest.fixture(autouse=True)
def _close_cached_producers():
    """DeadLetterWriter used in the test process caches a producer; close it before the broker."""
    yield
    close_dlq_producers()


def reason(value: bytes | None, max_value_bytes: int = 1_048_576,
           keys: tuple[str, ...] = ()) -> str:
    with pytest.raises(BadRecord) as info:
        parse_value(value, FIELDS, keys, max_value_bytes)
    return info.value.reason


# ------------------------------------------------------------------------ pure (no JVM)


def test_good_values_are_typed_in_field_order() -> None:
    value = b'{"ok": true, "amount": 2.5, "time": 17, "user": "ann", "extra": [1]}'
    assert parse_value(value, FIELDS) == ("ann", 17, 2.5, True)
    # a JSON integer is a fine double, and comes out as a float
    got = parse_value(b'{"user": "b", "time": -1, "amount": 3, "ok": false}', FIELDS)
    assert got == ("b", -1, 3.0, False) and type(got[2]) is float
    assert parse_value(b'{"n": 9223372036854775807}', {"n": "long"}) == (2**63 - 1,)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (b'{"user": "a", "time": "12", "amount": 1.0, "ok": true}',
         "field 'time': expected long, got string"),
        (b'{"user": "a", "time": true, "amount": 1.0, "ok": true}',
         "field 'time': expected long, got boolean"),
        (b'{"user": "a", "time": 1.5, "amount": 1.0, "ok": true}',
         "field 'time': expected long, got double"),
        (b'{"user": "a", "time": 1, "amount": "1", "ok": true}',
         "field 'amount': expected double, got string"),
        (b'{"user": "a", "time": 1, "amount": false, "ok": true}',
         "field 'amount': expected double, got boolean"),
        (b'{"user": "a", "time": 1, "amount": 1, "ok": 1}',
         "field 'ok': expected boolean, got long"),
        (b'{"user": 7, "time": 1, "amount": 1, "ok": true}',
         "field 'user': expected string, got long"),
        (b'{"user": null, "time": 1, "amount": 1, "ok": true}',
         "field 'user': expected string, got null"),
        (b'{"user": "a", "amount": 1, "ok": true}', "field 'time': missing"),
        (b'{"user": "a", "time": 18446744073709551615, "amount": 1, "ok": true}',
         "field 'time': 18446744073709551615 is out of range for a long"),
        (b"[1, 2]", "value is a JSON array, not an object"),
        (b'"text"', "value is a JSON string, not an object"),
        (None, "value is null (tombstone)"),
    ],
)
def test_bad_values_name_the_problem(value: bytes | None, expected: str) -> None:
    assert reason(value) == expected


def test_invalid_json_and_size_limit() -> None:
    assert reason(b'{"user": "a", ').startswith("invalid JSON: ")
    assert reason(b"\xff\xfe").startswith("invalid JSON: ")
    good = orjson.dumps({"user": "x" * 100, "time": 1, "amount": 1, "ok": True})
    assert parse_value(good, FIELDS, max_value_bytes=len(good))
    assert reason(b'{"user": "", "time": 1, "amount": 1, "ok": true}', keys=("user",)) == \
        "field 'user': an empty key"
    assert reason(b'{"user": null, "time": 1, "amount": 1, "ok": true}', keys=("user",)) == \
        "field 'user': a null key"
    long_key = orjson.dumps({"user": "é" * 513, "time": 1, "amount": 1, "ok": True})
    assert reason(long_key, keys=("user",)) == "field 'user': a key of 1026 bytes, more than 1024"
    assert reason(good, max_value_bytes=len(good) - 1) == (
        f"value is {len(good)} bytes, larger than the {len(good) - 1} limit"
    )


def test_field_declarations_are_checked() -> None:
    with pytest.raises(InvalidRequest, match="supported"):
        check_fields({"x": "int"})
    with pytest.raises(InvalidRequest, match="clashes"):
        check_fields({"offset": "long"})
    with pytest.raises(InvalidRequest, match="no fields"):
        check_fields({})
    with pytest.raises(InvalidRequest, match="must be a declared string field"):
        check_fields({"time": "long"}, keys=["time"])


VALUES = [
    b'{"user": "a", "time": 1, "amount": 2.5, "ok": true}',
    b'{"user": "b", "time": -3, "amount": 7, "ok": false, "extra": {"x": [1, 2]}}',
    b'{"user": "c", "time": "12", "amount": 1, "ok": true}',
    b'{"user": 5, "time": 1, "amount": 1, "ok": true}',
    b'{"user": "d", "time": 1.0, "amount": 1, "ok": true}',
    b'{"user": "e", "time": 1e3, "amount": 1, "ok": true}',
    b'{"user": "f", "amount": 1, "ok": true}',
    b'{"user": null, "time": 1, "amount": 1, "ok": true}',
    b'{"user": "", "time": 1, "amount": 1, "ok": true}',
    b'{"user": "g",\n "time": 1, "amount": 1, "ok": true}',
    b'{"user": "h", "time": 99999999999999999999, "amount": 1, "ok": true}',
    b'{"user": "i", "time": 1, "time": 2, "amount": 1, "ok": true}',
    b"[1]", b"7", b"{bad", None,
    # what a careless producer sends (issue 25): each one verdict, whatever its neighbours
    b'{"user": "j\xff\xfe", "time": 1, "amount": 1, "ok": true}',
    b'{"user": "k", "time": 1, "amount": 1, "ok": true, "x": "\xc3"}',
    b'{"user": "l", "time": 1, "amount": NaN, "ok": true}',
    b'{"user": "m", "time": 1, "amount": 1, "ok": true, "x": -Infinity}',
    b'{"user": "n", "time": 1, "amount": 1, "ok": true, "x": ' + b"[" * 5000 + b"]" * 5000
    + b"}",
    b'{"user": "o", "time": 1, "amount": 1e400, "ok": true}',
    b'{"user": "p", "time": 1, "amount": 123456789012345678901234567890, "ok": true}',
    b'{"user": "q", "time": 123456789012345678901234567890, "amount": 1, "ok": true}',
    b'\xef\xbb\xbf{"user": "r", "time": 1, "amount": 1, "ok": true}',
    b'{"user": "s\\ud800", "time": 1, "amount": 1, "ok": true}',
    b"{}",
    b'{"user": "t", "time": 1, "amount": 1, "ok": true, "pad": "' + b"x" * 2_000_000 + b'"}',
]


def batch_of(values: list[bytes | None], stamps_ms: list[int | None] | None = None
             ) -> pa.RecordBatch:
    n = len(values)
    stamps = [None if t is None else t * 1000 for t in (stamps_ms or [None] * n)]
    return pa.RecordBatch.from_arrays(
        [pa.array([b"k"] * n, pa.binary()), pa.array(values, pa.binary()),
         pa.array(["t"] * n), pa.array([0] * n, pa.int32()), pa.array(range(n), pa.int64()),
         pa.array(stamps, pa.timestamp("us", tz="UTC"))],
        ["key", "value", "topic", "partition", "offset", "timestamp"])


def parsed(values: list[bytes | None], event_time: EventTime | None = None,
           stamps: list[int | None] | None = None) -> list[dict]:
    batch = batch_of(values, stamps)
    [out] = list(parse_batches(iter([batch]), FIELDS, ["user"], None, "-", 1 << 20,
                               event_time=event_time))
    out.validate(full=True)  # what the shard's delta check does: valid UTF-8, sane buffers
    return out.to_pylist()


def verdict(row: dict) -> tuple:
    """A row's verdict: its typed fields, or its dead-letter reason and kind."""
    if row[ERROR_KIND] is None:
        return tuple(row[f] for f in FIELDS)
    return row["_error"], row[ERROR_KIND]


@pytest.mark.parametrize("value", VALUES)
def test_a_batch_and_each_record_alone_are_judged_alike(value: bytes | None) -> None:
    """The whole-batch pyarrow path (all good) and the record-by-record path (any bad) give
    the same verdict on every record, whatever its neighbours."""
    good = VALUES[0]
    alone = parsed([value])[0]
    among_good = parsed([good, value, good])[1]
    try:
        want = parse_value(value, FIELDS, ["user"])
    except BadRecord as exc:
        assert (alone["_error"], alone[ERROR_KIND]) == (exc.reason, exc.kind)
        assert (among_good["_error"], among_good[ERROR_KIND]) == (exc.reason, exc.kind)
    else:
        for row in (alone, among_good):
            assert tuple(row[f] for f in FIELDS) == want and row["_error"] is None


# JSON a careless producer writes: every kind of number, deep nesting, odd strings, duplicate
# and missing fields, sometimes the declared ones
_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-0", "1E2", "0.5e-400"]))


def _fragment(v: object) -> bytes:
    if isinstance(v, str) and v in ("NaN", "Infinity", "-Infinity", "1e400", "-0", "1E2",
                                     "0.5e-400"):
        return v.encode()  # a bare token, not a string
    return orjson.dumps(v, option=orjson.OPT_NON_STR_KEYS) if not isinstance(v, int) \
        else str(v).encode()


@st.composite
def _records(draw: st.DrawFn) -> bytes:
    names = draw(st.lists(st.sampled_from([*FIELDS, "x", "user"]), max_size=7))
    parts = [orjson.dumps(n) + b": " + _fragment(draw(_SCALARS)) for n in names]
    if draw(st.booleans()):  # the declared ones, often right
        parts += [b'"user": ' + orjson.dumps(draw(st.text(min_size=0, max_size=4))),
                  b'"time": ' + str(draw(st.integers(-(2**64), 2**64))).encode(),
                  b'"amount": ' + _fragment(draw(_SCALARS)), b'"ok": true']
    depth = draw(st.sampled_from([0, 0, 3, 1023, 1025]))
    if depth:
        parts.append(b'"deep": ' + b"[" * depth + b"]" * depth)
    body = b"{" + b", ".join(draw(st.permutations(parts))) + b"}"
    prefix = draw(st.sampled_from([b"", b"", b" ", b"\xef\xbb\xbf", b"\xff"]))
    return prefix + body


_VALUES = st.one_of(st.binary(max_size=64), _records(), st.sampled_from(VALUES[:24]))


@settings(max_examples=300, deadline=None)
@given(st.lists(_VALUES, min_size=1, max_size=6))
def test_any_bytes_get_one_verdict_whatever_their_neighbours(values: list[bytes | None]
                                                            ) -> None:
    """Arbitrary bytes and crafted JSON (invalid UTF-8, NaN, Infinity, huge numbers, deep
    nesting, duplicate fields, BOMs): a record's verdict in a batch is its verdict alone and
    the per-record rule's; what passes is what a shard takes (valid UTF-8, finite doubles)."""
    among = parsed(values)
    for value, row in zip(values, among, strict=True):
        assert verdict(row) == verdict(parsed([value])[0])
        try:
            want: tuple = parse_value(value, FIELDS, ["user"])
        except BadRecord as exc:
            want = (exc.reason, exc.kind)
            assert exc.kind in KINDS
        assert verdict(row) == want
        if row[ERROR_KIND] is None:
            assert math.isfinite(row["amount"])


def test_the_dead_letter_reasons_a_careless_producer_meets() -> None:
    def kind(value: bytes) -> str | None:
        return parsed([VALUES[0], value, VALUES[0]])[1][ERROR_KIND]

    assert kind(b'{"user": "a\xff", "time": 1, "amount": 1, "ok": true}') == "bad_encoding"
    assert kind(b'\xef\xbb\xbf{"user": "a", "time": 1, "amount": 1, "ok": true}') == \
        "bad_encoding"
    assert kind(b'{"user": "a", "time": 1, "amount": NaN, "ok": true}') == "bad_number"
    assert kind(b'{"user": "a", "time": 1, "amount": 1, "ok": true, "x": Infinity}') == \
        "bad_number"
    assert kind(b'{"user": "a", "time": 1, "amount": 1e400, "ok": true}') == "bad_number"
    assert kind(b'{"user": "a", "time": 1, "amount": 1, "ok": true, "x": '
                + b"[" * 5000 + b"]" * 5000 + b"}") == "too_deep"
    assert kind(b'{"user": "a", "time": 123456789012345678901234567890, "amount": 1, '
                b'"ok": true}') == "out_of_range"
    assert kind(b'{"user": "a", "time": 1, "amount": 1, "ok": true, "pad": "'
                + b"x" * 2_000_000 + b'"}') == "too_large"


def test_event_time_beyond_its_bounds_is_a_dead_letter() -> None:
    """A time far ahead of its record's Kafka timestamp is future_time (it would move the
    watermark and turn every later event late); one Spark's timestamps cannot hold is bad_time;
    without a record timestamp only the second bound applies. Same verdict on both paths."""
    bound = EventTime("time", max_future_ms=60_000)
    now = 1_700_000_000_000

    def row(t: int, stamp: int | None = now) -> dict:
        v = orjson.dumps({"user": "u", "time": t, "amount": 1, "ok": True})
        rows = parsed([VALUES[0], v], bound, [now, stamp])
        assert verdict(rows[1]) == verdict(parsed([v], bound, [stamp])[0])
        return rows[1]

    assert row(now + 60_000)[ERROR_KIND] is None  # a minute ahead: a clock a little fast
    assert row(now - 10 * 365 * 86_400_000)[ERROR_KIND] is None  # long ago: late, not bad
    future = row(now + 10 * 365 * 86_400_000)
    assert future[ERROR_KIND] == "future_time" and "more than max_future_ms 60000" in \
        future["_error"]
    assert row(now + 60_001)[ERROR_KIND] == "future_time"
    assert row(2**63 - 1)[ERROR_KIND] == "bad_time"
    assert row(-(2**63))[ERROR_KIND] == "bad_time"
    assert row(MAX_EVENT_MS, stamp=None)[ERROR_KIND] is None
    assert row(MAX_EVENT_MS + 1, stamp=None)[ERROR_KIND] == "bad_time"


def test_an_all_good_batch_takes_the_fast_path_with_the_same_answer() -> None:
    values: list[bytes | None] = [orjson.dumps(
        {"user": f"u{i}", "time": i, "amount": i / 2, "ok": i % 2 == 0, "extra": "x"})
        for i in range(500)]
    rows = parsed(values)
    assert [tuple(r[f] for f in FIELDS) for r in rows] == [
        parse_value(v, FIELDS) for v in values]
    assert all(r["_error"] is None for r in rows)
    assert [r["offset"] for r in rows] == list(range(500))  # source coordinates kept in order


# ------------------------------------------------------------------------ Spark + broker


def create_topic(bootstrap: str, topic: str, partitions: int, max_message_bytes: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = NewTopic(topic, partitions, 1, config={"max.message.bytes": str(max_message_bytes)})
    for fut in admin.create_topics([new]).values():
        fut.result(15)


def read_topic(bootstrap: str, topic: str, expected: int, timeout: float = 30.0) -> list:
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": "test-dlq-reader",
        "enable.auto.commit": False, "auto.offset.reset": "earliest",
    })
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        got: list = []
        deadline = time.monotonic() + timeout
        while len(got) < expected and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=expected - len(got), timeout=1):
                assert m.error() is None, m.error()
                got.append(m)
        # anything beyond what we expect would be a duplicate or a stray
        got += consumer.consume(num_messages=10, timeout=1)
        return got
    finally:
        consumer.close()


def test_parse_events_stream_with_dead_letters(spark, broker, topic, tmp_path) -> None:
    bootstrap = broker.bootstrap
    dlq = f"{topic}-dlq"
    create_topic(bootstrap, topic, partitions=2, max_message_bytes=8 * 1024 * 1024)

    good = {
        f"g{i}": {"user": f"u{i}", "time": 1_700_000_000_000 + i,
                  "amount": i if i % 2 else i + 0.25, "ok": i % 3 == 0, "extra": {"x": i}}
        for i in range(400)
    }
    huge = orjson.dumps(
        {"user": "big", "time": 1, "amount": 1.0, "ok": True, "pad": "x" * 2_000_000}
    )
    bad = {
        "bad-json": (b'{"user": "a", "time": ', "invalid JSON: ", "invalid_json"),
        "missing": (b'{"user": "a", "amount": 1.0, "ok": true}', "field 'time': missing",
                    "missing_field"),
        "wrong-type": (b'{"user": "a", "time": "soon", "amount": 1.0, "ok": true}',
                       "field 'time': expected long, got string", "wrong_type"),
        "bool-long": (b'{"user": "a", "time": false, "amount": 1.0, "ok": true}',
                      "field 'time': expected long, got boolean", "wrong_type"),
        "array": (b"[1]", "value is a JSON array, not an object", "not_object"),
        "empty-key": (b'{"user": "", "time": 1, "amount": 1.0, "ok": true}',
                      "field 'user': an empty key", "bad_key"),
        "null-key": (b'{"user": null, "time": 1, "amount": 1.0, "ok": true}',
                     "field 'user': a null key", "bad_key"),
        "long-key": (orjson.dumps({"user": "k" * 1025, "time": 1, "amount": 1.0, "ok": True}),
                     "field 'user': a key of 1025 bytes, more than 1024", "bad_key"),
        "huge": (huge, f"value is {len(huge)} bytes, larger than the 1048576 limit",
                 "too_large"),
    }
    producer = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 16 * 1024 * 1024})
    sent: dict[str, tuple[int, int]] = {}

    def remember(key: str):
        def cb(err, msg) -> None:
            assert err is None, err
            sent[key] = (msg.partition(), msg.offset())
        return cb

    items = [(k, orjson.dumps(v)) for k, v in good.items()] + [
        (k, v) for k, (v, _, _) in bad.items()]
    for n, (key, value) in enumerate(items):
        # bad ones sprinkled between good ones, in both partitions
        producer.produce(topic, key=key, value=value, partition=n % 2, on_delivery=remember(key))
    assert producer.flush(30) == 0

    source = read_kafka(spark, bootstrap, topic)
    events = parse_events(source, FIELDS, keys=["user"], dlq_topic=dlq, bootstrap=bootstrap,
                          keep=["topic", "partition", "offset", "timestamp"])
    assert [(f.name, f.dataType.simpleString(), f.nullable) for f in events.schema.fields][:4] == [
        ("user", "string", False), ("time", "bigint", False),
        ("amount", "double", False), ("ok", "boolean", False),
    ]
    assert events.columns[4:] == ["topic", "partition", "offset", "timestamp", "_error",
                                  ERROR_KIND]

    name = f"parsed_{topic.replace('-', '_')}"
    query = (
        events.writeStream.format("memory").queryName(name)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .start()
    )
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert query.exception() is None

    everything = spark.table(name).collect()
    assert len(everything) == len(good) + len(bad)  # every record kept, the bad ones marked
    assert Counter(r[ERROR_KIND] for r in everything if r[ERROR_KIND]) == Counter(
        kind for _, _, kind in bad.values())
    rows = [r for r in everything if r[ERROR_KIND] is None]
    assert len(rows) == len(good)
    by_user = {r.user: r for r in rows}
    for key, event in good.items():
        r = by_user[event["user"]]
        amount = event["amount"]
        assert isinstance(amount, int | float)
        assert (r.time, r.amount, r.ok) == (event["time"], float(amount), event["ok"])
        assert type(r.amount) is float
        assert (r.topic, r.partition, r.offset) == (topic, *sent[key])
        assert r.timestamp is not None

    letters = read_topic(bootstrap, dlq, expected=len(bad))
    assert len(letters) == len(bad)
    for m in letters:
        key = m.key().decode()
        value, why, kind = bad[key]
        headers = {k: v.decode() for k, v in m.headers()}
        assert m.value() == value
        assert headers["qstate.error"].startswith(why) and headers["qstate.kind"] == kind
        assert headers["qstate.topic"] == topic
        assert (int(headers["qstate.partition"]), int(headers["qstate.offset"])) == sent[key]
        assert int(headers["qstate.timestamp"]) > 1_600_000_000_000


def test_dead_letter_too_big_for_the_dlq_keeps_the_job_alive(broker, topic) -> None:
    """A DLQ left at the broker default (~1 MB) still takes the record, minus its value."""
    bootstrap = broker.bootstrap
    create_topic(bootstrap, topic, partitions=1, max_message_bytes=1_048_588)
    writer = DeadLetterWriter(bootstrap, topic)
    headers = [("qstate.error", b"too big"), ("qstate.offset", b"7")]
    writer.send(b"k1", os.urandom(1_500_000), headers)  # random: lz4 cannot shrink it
    writer.send(b"k2", b"small", headers)
    writer.flush()
    letters = {m.key(): m for m in read_topic(bootstrap, topic, expected=2)}
    assert set(letters) == {b"k1", b"k2"}
    assert letters[b"k2"].value() == b"small"
    assert letters[b"k1"].value() is None
    dropped = dict(letters[b"k1"].headers())
    assert dropped["qstate.offset"] == b"7"
    assert dropped["qstate.value_dropped"].startswith(b"1500000 bytes, dropped: ")
