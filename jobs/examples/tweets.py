"""Tweet impressions (the seed workload): per-tweet counts per hour and per sliding minute.

Events on ``tweet-events``: ``{"tweet_id": str, "event": "impression"|"url-click",
"time": epoch ms}``. Watermark 10 s.

Merge mode (the default): one pass over the topic, both operators from it, the 1-minute
window stored as 10 s panes. ``--option mode=spark-state`` builds the same operators as
Spark stateful aggregations instead (for comparison: same answers, Spark keeps the state).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from qstate.core.records.operator import WindowSpec
from qstate.jobs import JobContext, QueryableJob, dlq_topic, parse_events, read_kafka, window
from qstate.jobs import aggregates as A
from qstate.jobs.parse import parse_json  # mode=spark-state, the comparison: not the face
from qstate.jobs.queryable import SparkStateOperator

__all__ = ["FIELDS", "JOB", "KEYS", "TOPIC", "WATERMARK", "build", "spark_state_operators"]

JOB = "tweets"
TOPIC = "tweet-events"
FIELDS = {"tweet_id": "string", "event": "string", "time": "long"}
KEYS = ["tweet_id"]
WATERMARK = "10 seconds"


def _is(event: str) -> Column:
    return F.col("event") == event


def spark_state_operators(events: DataFrame) -> list[SparkStateOperator]:
    """The same two operators as Spark stateful aggregations (update mode)."""
    ev = events.withColumn("ts", F.timestamp_millis("time")).withWatermark("ts", WATERMARK)
    hourly = ev.groupBy(F.window("ts", "1 hour"), F.col("tweet_id")).agg(
        F.count(F.when(_is("impression"), 1)).alias("impressions"),
        F.count(F.when(_is("url-click"), 1)).alias("clicks"))
    minute = (ev.where(_is("impression"))
              .groupBy(F.window("ts", "1 minute", "10 seconds"), F.col("tweet_id"))
              .agg(F.count(F.lit(1)).alias("impressions")))
    return [
        SparkStateOperator("per_tweet_1h", hourly, "tweet_id", ["impressions", "clicks"],
                           WindowSpec("tumbling", 3_600_000)),
        SparkStateOperator("per_tweet_1m", minute, "tweet_id", ["impressions"],
                           WindowSpec("sliding", 60_000, 10_000)),
    ]


def build(spark: SparkSession, ctx: JobContext) -> QueryableJob:
    topic = ctx.topic or TOPIC

    def read() -> DataFrame:
        return read_kafka(spark, ctx.bootstrap, topic, starting_offsets=ctx.starting_offsets,
                          max_offsets_per_trigger=ctx.max_rows_per_trigger)

    events = parse_events(read(), FIELDS, keys=KEYS, dlq_topic=dlq_topic(topic),
                          bootstrap=ctx.bootstrap, event_time="time")
    job = QueryableJob(ctx.job or JOB, events, event_time="time", watermark=WATERMARK,
                       topic=topic)
    if ctx.options.get("mode") == "spark-state":
        # each stateful operator is its own query over the topic; the first dead-letters
        for i in range(2):
            stream = parse_json(read(), FIELDS, keys=KEYS, bootstrap=ctx.bootstrap,
                                dlq_topic=dlq_topic(topic) if i == 0 else None,
                                event_time="time")
            job.serve_spark_state(spark_state_operators(stream)[i])
        return job
    job.operator("per_tweet_1h").groupBy(window("1 hour"), "tweet_id").agg(
        A.count(when=_is("impression")).alias("impressions"),
        A.count(when=_is("url-click")).alias("clicks"))
    job.operator("per_tweet_1m").where(_is("impression")).groupBy(
        window("1 minute", "10 seconds"), "tweet_id").agg(A.count().alias("impressions"))
    return job
