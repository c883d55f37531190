"""Reading Kafka with Spark's own connector (the jars `make setup` fetched), against the
session's Apache Kafka broker: every record once, bounded batches, where a fresh query starts,
and a clear error when the jars are missing."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Producer
from pyspark.sql import DataFrame
from pyspark.sql.streaming import StreamingQuery

from qstate.core.errors import InvalidRequest
from qstate.core.transport.kafka import ensure_topic
from qstate.jobs.runtime.spark import connector_jars
from qstate.jobs.source import read_kafka


def produce(bootstrap: str, topic: str, n: int, partitions: int, first: int = 0) -> None:
    """Messages first..first+n-1, message i to partition i % partitions, key k<i>, value v<i>."""
    # idempotent: a retried send (the topic is new, its leaders just elected) keeps its place
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                         "enable.idempotence": True})
    for i in range(first, first + n):
        producer.produce(topic, key=f"k{i}", value=f"v{i}".encode(), partition=i % partitions)
        if i % 5000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0


def run_to_completion(df: DataFrame, tmp_path: Path, name: str
                      ) -> tuple[list, StreamingQuery]:
    """availableNow into a memory table; returns (rows, query)."""
    query = (df.writeStream.format("memory").queryName(name)
             .option("checkpointLocation", str(tmp_path / f"ckpt-{name}"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert not query.isActive, "availableNow query did not finish"
    assert query.exception() is None, query.exception()
    return df.sparkSession.table(name).collect(), query


def test_missing_connector_jars_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match="make setup") as err:
        connector_jars(str(tmp_path))
    assert "QSTATE_SPARK_JARS" in err.value.message


def test_stream_reads_every_record_exactly_once(spark, broker, topic, tmp_path) -> None:
    n = 30_000
    ensure_topic(broker.bootstrap, topic, partitions=3)
    produce(broker.bootstrap, topic, n, partitions=3)
    df = read_kafka(spark, broker.bootstrap, topic, max_offsets_per_trigger=7_000)
    assert [f.simpleString() for f in df.schema.fields][:6] == [
        "key:binary", "value:binary", "topic:string", "partition:int", "offset:bigint",
        "timestamp:timestamp"]
    rows, query = run_to_completion(df, tmp_path, f"all_{topic.replace('-', '_')}")
    seen = Counter((r.partition, r.offset) for r in rows)
    assert len(rows) == n
    assert all(c == 1 for c in seen.values())
    assert set(seen) == {(p, o) for p in range(3) for o in range(n // 3)}
    for r in rows:
        i = int(r.key[1:])
        assert r.value == f"v{i}".encode()
        assert (r.partition, r.offset) == (i % 3, i // 3)
        assert r.topic == topic and r.timestamp is not None
    # bounded batches: maxOffsetsPerTrigger splits the backlog (a partition's share is
    # rounded up, so a batch may pass the cap by less than one record per partition)
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes) == n and len(sizes) >= n // 7_000
    assert max(sizes) <= 7_000 + 3


def test_starting_offsets_latest_skips_existing_data(spark, broker, topic, tmp_path) -> None:
    ensure_topic(broker.bootstrap, topic, partitions=2)
    produce(broker.bootstrap, topic, 100, partitions=2)
    name = f"latest_{topic.replace('-', '_')}"
    df = read_kafka(spark, broker.bootstrap, topic, starting_offsets="latest")
    query = (df.writeStream.format("memory").queryName(name)
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    try:
        query.processAllAvailable()  # pins the initial offset at the current end
        produce(broker.bootstrap, topic, 30, partitions=2, first=100)
        query.processAllAvailable()
    finally:
        query.stop()
    keys = sorted(int(r.key[1:]) for r in spark.table(name).collect())
    assert keys == list(range(100, 130))
