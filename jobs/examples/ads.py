"""The Yahoo Streaming Benchmark: views per campaign per 10 s tumbling window.

Events on ``ad-events``: ``{"user_id","page_id","ad_id","ad_type","event_type",
"event_time","ip_address"}`` (event_time epoch ms). Only ``view`` events count; ``ad_id``
maps to ``campaign_id`` through the mapping generated with the data. Watermark 10 s.
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.examples.workloads import default_mapping_path, load_mapping
from jobs.job import JobContext, JobDefinition, QueryableOperator
from jobs.parse import parse_json
from jobs.source import read_kafka
from service.core.operator import WindowSpec

__all__ = ["FIELDS", "JOB", "TOPIC", "build", "mapping_path", "operators"]

JOB = "ads"
TOPIC = "ad-events"
FIELDS = {"user_id": "string", "page_id": "string", "ad_id": "string", "ad_type": "string",
          "event_type": "string", "event_time": "long", "ip_address": "string"}
WATERMARK = "10 seconds"


def operators(events: DataFrame, mapping: dict[str, str]) -> list[QueryableOperator]:
    spark = events.sparkSession
    campaigns = spark.createDataFrame(sorted(mapping.items()), "ad_id string, campaign_id string")
    views = (events.where(F.col("event_type") == "view")
             .withColumn("ts", F.timestamp_millis("event_time"))
             .withWatermark("ts", WATERMARK)
             .join(F.broadcast(campaigns), "ad_id"))
    counts = views.groupBy(F.window("ts", "10 seconds"), F.col("campaign_id")).agg(
        F.count(F.lit(1)).alias("views"))
    return [QueryableOperator("campaign_views_10s", counts, "campaign_id", ["views"],
                              WindowSpec("tumbling", 10_000))]


def mapping_path(ctx: JobContext) -> Path:
    """``--option mapping=PATH``, else where `qstate generate ads` writes it by default."""
    given = ctx.options.get("mapping")
    return Path(given) if given else default_mapping_path()


def build(spark: SparkSession, ctx: JobContext) -> JobDefinition:
    topic = ctx.topic or TOPIC
    raw = read_kafka(spark, ctx.bootstrap, topic, starting_offsets=ctx.starting_offsets,
                     max_rows_per_trigger=ctx.max_rows_per_trigger)
    events = parse_json(raw, FIELDS, dlq_topic=ctx.dlq_topic(topic), bootstrap=ctx.bootstrap)
    return JobDefinition(ctx.job or JOB, topic, operators(events, load_mapping(mapping_path(ctx))))
