"""The qstate-kafka streaming source against the real dev broker (and Spark where it matters)."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from jobs.source import (
    ARROW_SCHEMA,
    KafkaRange,
    KafkaRangeUnavailable,
    KafkaStreamReader,
    SourceOptions,
    cap_end_offsets,
    close_worker_consumers,
    plan_ranges,
    read_kafka,
)
from service.core.kafka import ensure_topic


def produce(bootstrap: str, topic: str, n: int, partitions: int, first: int = 0) -> None:
    """Messages first..first+n-1, message i to partition i % partitions, key k<i>, value v<i>."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(first, first + n):
        producer.produce(topic, key=f"k{i}", value=f"v{i}".encode(), partition=i % partitions)
        if i % 5000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0


@pytest.fixture(autouse=True)
def _close_cached_consumers():
    """read() called in the test process caches a consumer here; close it before the broker goes."""
    yield
    close_worker_consumers()


def reader_for(bootstrap: str, topic: str, **extra: str) -> KafkaStreamReader:
    return KafkaStreamReader(SourceOptions.parse({"bootstrap": bootstrap, "topic": topic, **extra}))


def read_all(reader: KafkaStreamReader, start: dict, end: dict) -> pa.Table:
    batches = [b for part in reader.partitions(start, end) for b in reader.read(part)]
    return pa.Table.from_batches(batches, schema=ARROW_SCHEMA)


def run_to_completion(df, tmp_path: Path, name: str):
    """availableNow into a memory table; returns (rows, query)."""
    query = (
        df.writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / f"ckpt-{name}"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert not query.isActive, "availableNow query did not finish"
    assert query.exception() is None, query.exception()
    rows = df.sparkSession.table(name).collect()
    return rows, query


# ---------------------------------------------------------------------------- pure planning


def test_cap_end_offsets_is_proportional_exact_and_deterministic() -> None:
    start = {0: 100, 1: 0, 2: 50}
    latest = {0: 1100, 1: 2000, 2: 50, 3: 7}  # partition 3 is new: starts at 0
    end = cap_end_offsets(start, latest, 1000)
    taken = {p: end[p] - start.get(p, 0) for p in end}
    assert sum(taken.values()) == 1000
    assert all(0 <= taken[p] <= latest[p] - start.get(p, 0) for p in taken)
    assert taken[2] == 0
    assert taken[1] > taken[0] > taken[3]
    shuffled = dict(reversed(start.items())), dict(reversed(latest.items()))
    assert cap_end_offsets(*shuffled, 1000) == end
    # small limits still make progress
    assert sum(v - start.get(p, 0) for p, v in cap_end_offsets(start, latest, 1).items()) == 1
    # enough budget: everything
    assert cap_end_offsets(start, latest, 10**9) == {0: 1100, 1: 2000, 2: 50, 3: 7}


def test_plan_ranges_splits_evenly_and_covers_exactly() -> None:
    ranges = plan_ranges("t", {0: 10, 1: 5}, {0: 1010, 1: 5, 2: 3}, max_records_per_split=300)
    by_p: dict[int, list[KafkaRange]] = {}
    for r in ranges:
        by_p.setdefault(r.partition, []).append(r)
    assert set(by_p) == {0, 2}
    p0 = by_p[0]
    assert len(p0) == 4 and all(r.end - r.start <= 300 for r in p0)
    assert p0[0].start == 10 and p0[-1].end == 1010
    assert all(a.end == b.start for a, b in itertools.pairwise(p0))
    assert by_p[2] == [KafkaRange("t", 2, 0, 3)]


def test_options_are_validated() -> None:
    with pytest.raises(ValueError, match="bootstrap"):
        SourceOptions.parse({"topic": "t"})
    with pytest.raises(ValueError, match="startingOffsets"):
        SourceOptions.parse({"bootstrap": "b", "topic": "t", "startingOffsets": "middle"})
    with pytest.raises(ValueError, match="maxRowsPerTrigger"):
        SourceOptions.parse({"bootstrap": "b", "topic": "t", "maxRowsPerTrigger": "0"})
    opts = SourceOptions.parse(
        {"bootstrap": "b", "topic": "t", "maxrowspertrigger": "7", "kafka.client.id": "x"}
    )
    assert opts.max_rows_per_trigger == 7
    assert opts.consumer_conf()["client.id"] == "x"


# ----------------------------------------------------------------- reader against the broker


def test_replaying_a_range_returns_identical_records(broker, topic) -> None:
    ensure_topic(broker.bootstrap, topic, partitions=3)
    produce(broker.bootstrap, topic, 3000, partitions=3)
    reader = reader_for(broker.bootstrap, topic, maxRecordsPerSplit="400")
    try:
        start = reader.initialOffset()
        assert start == {"0": 0, "1": 0, "2": 0}
        end = reader.latestOffset(start, ReadAllAvailable())
        assert end == {"0": 1000, "1": 1000, "2": 1000}
        assert len(reader.partitions(start, end)) == 9

        first = read_all(reader, start, end)
        produce(broker.bootstrap, topic, 300, partitions=3, first=3000)  # must not leak in
        second = read_all(reader, start, end)
        assert first.num_rows == 3000
        assert first.equals(second)
        assert first.schema.equals(ARROW_SCHEMA)
        coords = zip(first["partition"].to_pylist(), first["offset"].to_pylist(), strict=True)
        assert sorted(coords) == [(p, o) for p in range(3) for o in range(1000)]
        for key, value in zip(first["key"].to_pylist(), first["value"].to_pylist(), strict=True):
            assert value == b"v" + key[1:].encode()
        assert first["timestamp"].null_count == 0

        # a range in the middle of a partition: exactly those offsets
        mid = pa.Table.from_batches(list(reader.read(KafkaRange(topic, 1, 10, 25))))
        assert mid["offset"].to_pylist() == list(range(10, 25))
        assert mid["key"].to_pylist() == [f"k{3 * o + 1}" for o in range(10, 25)]

        # maxRowsPerTrigger through latestOffset
        capped = reader.latestOffset(end, ReadMaxRows(100))
        assert sum(capped[p] - end[p] for p in end) == 100
    finally:
        reader.stop()


def test_reading_a_lost_range_fails_clearly(broker, topic) -> None:
    ensure_topic(broker.bootstrap, topic, partitions=1)
    produce(broker.bootstrap, topic, 100, partitions=1)
    reader = reader_for(broker.bootstrap, topic)
    # read() is executor code; called here it uses this process's cached consumer
    with pytest.raises(KafkaRangeUnavailable, match="before the planned end"):
        list(reader.read(KafkaRange(topic, 0, 50, 150)))
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for fut in admin.delete_records([TopicPartition(topic, 0, 40)], request_timeout=10).values():
        fut.result()
    with pytest.raises(KafkaRangeUnavailable, match="deleted"):
        list(reader.read(KafkaRange(topic, 0, 10, 60)))
    # what is still there still reads
    assert sum(b.num_rows for b in reader.read(KafkaRange(topic, 0, 40, 60))) == 20


# ------------------------------------------------------------------------------- with Spark


@pytest.mark.spark
def test_stream_reads_every_record_exactly_once(spark, broker, topic, tmp_path) -> None:
    n = 30_000
    ensure_topic(broker.bootstrap, topic, partitions=3)
    produce(broker.bootstrap, topic, n, partitions=3)
    # small splits so one micro-batch is several tasks per Kafka partition
    df = read_kafka(spark, broker.bootstrap, topic, max_records_per_split=4000)
    assert [f.simpleString() for f in df.schema.fields] == [
        "key:string", "value:binary", "topic:string", "partition:int", "offset:bigint",
        "timestamp:timestamp",
    ]
    rows, _ = run_to_completion(df, tmp_path, f"all_{topic.replace('-', '_')}")

    seen = Counter((r.partition, r.offset) for r in rows)
    assert len(rows) == n
    assert all(c == 1 for c in seen.values())
    assert set(seen) == {(p, o) for p in range(3) for o in range(n // 3)}
    for r in rows:
        i = int(r.key[1:])
        assert r.value == f"v{i}".encode()
        assert (r.partition, r.offset) == (i % 3, i // 3)
        assert r.topic == topic
        assert r.timestamp is not None


@pytest.mark.spark
def test_max_rows_per_trigger_bounds_each_batch(spark, broker, topic, tmp_path) -> None:
    n, limit = 5_000, 1_200
    ensure_topic(broker.bootstrap, topic, partitions=3)
    produce(broker.bootstrap, topic, n, partitions=3)
    df = read_kafka(spark, broker.bootstrap, topic, max_rows_per_trigger=limit)
    rows, query = run_to_completion(df, tmp_path, f"capped_{topic.replace('-', '_')}")

    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes and max(sizes) <= limit
    assert sum(sizes) == n
    assert len(sizes) >= -(-n // limit)
    assert len({(r.partition, r.offset) for r in rows}) == len(rows) == n


@pytest.mark.spark
def test_starting_offsets_latest_skips_existing_data(spark, broker, topic, tmp_path) -> None:
    ensure_topic(broker.bootstrap, topic, partitions=2)
    produce(broker.bootstrap, topic, 100, partitions=2)
    name = f"latest_{topic.replace('-', '_')}"
    df = read_kafka(spark, broker.bootstrap, topic, starting_offsets="latest")
    query = (
        df.writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .start()
    )
    try:
        query.processAllAvailable()  # pins the initial offset at the current end
        produce(broker.bootstrap, topic, 30, partitions=2, first=100)
        query.processAllAvailable()
    finally:
        query.stop()
    keys = sorted(int(r.key[1:]) for r in spark.table(name).collect())
    assert keys == list(range(100, 130))
