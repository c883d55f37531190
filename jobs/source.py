"""Reading a Kafka topic as a stream: Spark's own Kafka connector (spark-sql-kafka-0-10),
whose jars `make setup` fetches and ``qstate.jobs.runtime.spark`` puts on ``spark.jars``.

Offsets live in Spark's checkpoint (the offset log fixes each batch's records, so a replayed
batch reads exactly the same records), batches are bounded by ``maxOffsetsPerTrigger`` (a
backlog drains in steps, and shows as lag rather than as one huge batch), and
``failOnDataLoss`` is on: if records the job has not read yet were deleted from Kafka
(retention, a recreated topic), the query stops with Spark's error instead of silently
skipping them, because counts that silently miss events are wrong answers. Set it off
(``fail_on_data_loss=False``) only where skipping is acceptable.

Columns: ``key`` and ``value`` (binary), ``topic``, ``partition``, ``offset``, ``timestamp``,
``timestampType`` (Spark's Kafka schema).
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import DataFrame, SparkSession

from qstate.core.transport.kafka import java_options, kafka_properties

__all__ = ["read_kafka"]


def read_kafka(spark: SparkSession, bootstrap: str, topic: str, *,
               starting_offsets: str = "earliest", max_offsets_per_trigger: int | None = None,
               fail_on_data_loss: bool = True,
               kafka_options: Mapping[str, str] | None = None) -> DataFrame:
    """A streaming DataFrame over ``topic``. ``starting_offsets`` applies to a fresh
    checkpoint only. The consumers get the deployment's Kafka properties
    (QSTATE_KAFKA_PROPERTIES, in Java's names), then ``kafka_options`` (Java's names;
    ``kafka.`` is prefixed), e.g. ``{"security.protocol": "SSL", ...}``."""
    reader = (spark.readStream.format("kafka")
              .option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic)
              .option("startingOffsets", starting_offsets)
              .option("failOnDataLoss", str(fail_on_data_loss).lower()))
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    for k, v in {**java_options(kafka_properties()), **(kafka_options or {})}.items():
        reader = reader.option(f"kafka.{k}", v)
    return reader.load()
