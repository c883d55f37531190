"""Tweet impressions (the seed workload): per-tweet counts per hour and per sliding minute.

Events on ``tweet-events``: ``{"tweet_id": str, "event": "impression"|"url-click",
"time": epoch ms}``. Watermark 10 s.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.job import JobContext, JobDefinition, QueryableOperator
from jobs.parse import parse_json
from jobs.source import read_kafka
from service.core.operator import WindowSpec

__all__ = ["FIELDS", "JOB", "TOPIC", "build", "operators"]

JOB = "tweets"
TOPIC = "tweet-events"
FIELDS = {"tweet_id": "string", "event": "string", "time": "long"}
WATERMARK = "10 seconds"


def _is(event: str) -> F.Column:
    return F.when(F.col("event") == event, 1).otherwise(0)


def operators(events: DataFrame) -> list[QueryableOperator]:
    ev = events.withColumn("ts", F.timestamp_millis("time")).withWatermark("ts", WATERMARK)
    hourly = ev.groupBy(F.window("ts", "1 hour"), F.col("tweet_id")).agg(
        F.sum(_is("impression")).alias("impressions"), F.sum(_is("url-click")).alias("clicks"))
    minute = (ev.where(F.col("event") == "impression")
              .groupBy(F.window("ts", "1 minute", "10 seconds"), F.col("tweet_id"))
              .agg(F.count(F.lit(1)).alias("impressions")))
    return [
        QueryableOperator("per_tweet_1h", hourly, "tweet_id", ["impressions", "clicks"],
                          WindowSpec("tumbling", 3_600_000)),
        QueryableOperator("per_tweet_1m", minute, "tweet_id", ["impressions"],
                          WindowSpec("sliding", 60_000, 10_000)),
    ]


def build(spark: SparkSession, ctx: JobContext) -> JobDefinition:
    topic = ctx.topic or TOPIC
    raw = read_kafka(spark, ctx.bootstrap, topic, starting_offsets=ctx.starting_offsets,
                     max_rows_per_trigger=ctx.max_rows_per_trigger)
    events = parse_json(raw, FIELDS, dlq_topic=ctx.dlq_topic(topic), bootstrap=ctx.bootstrap)
    return JobDefinition(ctx.job or JOB, topic, operators(events))
