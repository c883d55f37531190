"""The Yahoo Streaming Benchmark: views per campaign per 10 s tumbling window.

Events on ``ad-events``: ``{"user_id","page_id","ad_id","ad_type","event_type",
"event_time","ip_address"}`` (event_time epoch ms). Only ``view`` events count; ``ad_id``
maps to ``campaign_id`` through the mapping generated with the data. Watermark 10 s.
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from qstate.core.records.operator import WindowSpec
from qstate.jobs import JobContext, QueryableJob, dlq_topic, parse_events, read_kafka, window
from qstate.jobs import aggregates as A
from qstate.jobs.examples.workloads import default_mapping_path, load_mapping
from qstate.jobs.parse import parse_json  # mode=spark-state, the comparison: not the face
from qstate.jobs.queryable import SparkStateOperator

__all__ = ["FIELDS", "JOB", "KEYS", "TOPIC", "WATERMARK", "build", "mapping_path",
           "spark_state_operators"]

JOB = "ads"
TOPIC = "ad-events"
FIELDS = {"user_id": "string", "page_id": "string", "ad_id": "string", "ad_type": "string",
          "event_type": "string", "event_time": "long", "ip_address": "string"}
KEYS = ["ad_id"]
WATERMARK = "10 seconds"


def mapping_path(ctx: JobContext) -> Path:
    """``--option mapping=PATH``, else where `qstate generate ads` writes it by default."""
    given = ctx.options.get("mapping")
    return Path(given) if given else default_mapping_path()


def _with_campaigns(events: DataFrame, mapping: dict[str, str], how: str) -> DataFrame:
    campaigns = events.sparkSession.createDataFrame(sorted(mapping.items()),
                                                    "ad_id string, campaign_id string")
    return events.join(F.broadcast(campaigns), "ad_id", how)


def spark_state_operators(events: DataFrame, mapping: dict[str, str]
                          ) -> list[SparkStateOperator]:
    views = (_with_campaigns(events.where(F.col("event_type") == "view"), mapping, "inner")
             .withColumn("ts", F.timestamp_millis("event_time")).withWatermark("ts", WATERMARK))
    counts = views.groupBy(F.window("ts", "10 seconds"), F.col("campaign_id")).agg(
        F.count(F.lit(1)).alias("views"))
    return [SparkStateOperator("campaign_views_10s", counts, "campaign_id", ["views"],
                               WindowSpec("tumbling", 10_000))]


def build(spark: SparkSession, ctx: JobContext) -> QueryableJob:
    """Views and unique users per campaign per 10 s. An ad missing from the mapping has no
    campaign and counts nowhere, as YSB's join drops it."""
    topic = ctx.topic or TOPIC
    mapping = load_mapping(mapping_path(ctx))
    raw = read_kafka(spark, ctx.bootstrap, topic, starting_offsets=ctx.starting_offsets,
                     max_offsets_per_trigger=ctx.max_rows_per_trigger)
    if ctx.options.get("mode") == "spark-state":
        events = parse_json(raw, FIELDS, keys=KEYS, dlq_topic=dlq_topic(topic),
                            bootstrap=ctx.bootstrap, event_time="event_time")
        job = QueryableJob(ctx.job or JOB, events, event_time="event_time",
                           watermark=WATERMARK, topic=topic)
        for op in spark_state_operators(events, mapping):
            job.serve_spark_state(op)
        return job
    events = parse_events(raw, FIELDS, keys=KEYS, dlq_topic=dlq_topic(topic),
                          bootstrap=ctx.bootstrap, event_time="event_time")
    # a left join keeps every record (dead letters are counted from the same stream)
    job = QueryableJob(ctx.job or JOB, _with_campaigns(events, mapping, "left"),
                       event_time="event_time", watermark=WATERMARK, topic=topic)
    job.operator("campaign_views_10s").where(F.col("event_type") == "view").groupBy(
        window("10 seconds"), "campaign_id").agg(
            A.count().alias("views"), A.approx_count_distinct("user_id").alias("users"))
    return job
