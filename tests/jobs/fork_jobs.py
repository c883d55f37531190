"""The two versions of a job that tests/jobs/test_fork_rollback.py forks and rolls back, in a
module of their own: ``qstate job tests.jobs.fork_jobs:build_v2`` imports it as it imports a
user's job module.

v1 is the tweets example (``per_tweet_1h`` tumbling, ``per_tweet_1m`` sliding, stored as
panes) with a session operator beside them (``visits``): one of each kind of window. v2
filters out a bot's tweets (ids ending in 7) in every operator, adds an aggregate to
``per_tweet_1h`` and adds an operator (all clicks per tweet, no window).
"""

from __future__ import annotations

from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F

from qstate.jobs import (
    JobContext,
    QueryableJob,
    count,
    dlq_topic,
    parse_events,
    read_kafka,
    session_window,
    window,
)
from qstate.jobs.examples import tweets

__all__ = ["GAP_MS", "build_v1", "build_v2", "v2_skips"]

GAP_MS = 10_000  # visits: a tweet's events less than 10 s apart are one session


def v2_skips(key: str) -> bool:
    """What v2's filter drops: a bot's tweets."""
    return key.endswith("7")


def build_v1(spark: SparkSession, ctx: JobContext) -> QueryableJob:
    job = tweets.build(spark, ctx)
    job.operator("visits").groupBy(session_window(GAP_MS), "tweet_id").agg(
        count().alias("events"))
    return job


def build_v2(spark: SparkSession, ctx: JobContext) -> QueryableJob:
    # the test's own topic: ``ctx.topic`` in process, ``--option topic=T`` on the command line
    topic = ctx.topic or ctx.options.get("topic") or tweets.TOPIC
    events = parse_events(
        read_kafka(spark, ctx.bootstrap, topic, starting_offsets=ctx.starting_offsets),
        tweets.FIELDS, keys=tweets.KEYS, dlq_topic=dlq_topic(topic), bootstrap=ctx.bootstrap,
        event_time="time")
    job = QueryableJob(ctx.job or "tweets_v2", events, event_time="time",
                       watermark=tweets.WATERMARK, topic=topic)

    def event(kind: str) -> Column:
        return F.col("event") == kind

    human = ~F.col("tweet_id").endswith("7")
    job.operator("per_tweet_1h").where(human).groupBy(window("1 hour"), "tweet_id").agg(
        count(when=event("impression")).alias("impressions"),
        count(when=event("url-click")).alias("clicks"),
        count().alias("events"))  # added: begins empty at the savepoint
    job.operator("per_tweet_1m").where(event("impression") & human).groupBy(
        window("1 minute", "10 seconds"), "tweet_id").agg(count().alias("impressions"))
    job.operator("visits").where(human).groupBy(session_window(GAP_MS), "tweet_id").agg(
        count().alias("events"))
    job.operator("clicks_total").where(event("url-click")).groupBy("tweet_id").agg(
        count().alias("clicks"))
    return job
