"""Run an example job: Kafka source -> JSON parse (+DLQ) -> aggregations -> queryable sink."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from jobs import ads, metrics, tweets
from jobs.coordinator import release
from jobs.kafka_source import read_kafka
from jobs.operators import QueryableOperator
from jobs.parse import parse_json
from jobs.sink import SinkStats, serve
from service.kafka import ensure_topic

log = logging.getLogger("qstate.job")
JOBS = {"tweets": tweets, "ads": ads}


@dataclass
class JobConfig:
    name: str  # which example: tweets | ads
    bootstrap: str
    checkpoint: Path
    storage: str
    topic: str = ""
    job: str = ""  # the served job name; default the example's (tweets, ads)
    shards: list[str] | None = None
    partitions: int = 64
    trigger_interval: str = "1 second"
    max_rows_per_trigger: int | None = None
    starting_offsets: str = "earliest"
    mapping: Path | None = None
    retention_ms: int | None = None

    def __post_init__(self) -> None:
        if self.name not in JOBS:
            raise ValueError(f"unknown job {self.name!r}: choose one of {sorted(JOBS)}")
        self.topic = self.topic or JOBS[self.name].TOPIC
        self.job = self.job or JOBS[self.name].JOB


@dataclass
class RunningJob:
    config: JobConfig
    queries: dict[str, StreamingQuery]
    stats: dict[str, SinkStats]
    _seen: dict[str, int] = field(default_factory=dict)

    def stop(self) -> None:
        for q in self.queries.values():
            if q.isActive:
                q.stop()
        release(self.config.storage, self.config.job)

    def process_all_available(self) -> None:
        for q in self.queries.values():
            q.processAllAvailable()

    def check(self) -> None:
        """Raise the failure of any query that died."""
        for name, q in self.queries.items():
            if not q.isActive and q.exception() is not None:
                raise RuntimeError(f"query {name} failed: {q.exception()}")

    def export_metrics(self) -> None:
        """Copy new StreamingQueryProgress into the Prometheus metrics (the sink exports its
        own commit metrics as it goes)."""
        job = self.config.job
        for name, q in self.queries.items():
            for p in q.recentProgress:
                if p.batchId <= self._seen.get(name, -1):
                    continue
                self._seen[name] = p.batchId
                metrics.INPUT_RATE.labels(job, name).set(p.inputRowsPerSecond or 0.0)
                metrics.PROCESSED_RATE.labels(job, name).set(p.processedRowsPerSecond or 0.0)
                metrics.BATCH_SECONDS.labels(job, name).observe(
                    p.durationMs.get("triggerExecution", 0) / 1000)
                obs = (p.observedMetrics or {}).get("qstate_parse")
                if obs is not None:
                    metrics.DEAD_LETTERED.labels(job, self.config.topic).inc(
                        obs["dead_lettered"] or 0)


def build_operators(spark: SparkSession, cfg: JobConfig, dlq: bool) -> list[QueryableOperator]:
    module = JOBS[cfg.name]
    raw = read_kafka(spark, cfg.bootstrap, cfg.topic, starting_offsets=cfg.starting_offsets,
                     max_rows_per_trigger=cfg.max_rows_per_trigger)
    events = parse_json(raw, module.FIELDS, dlq_topic=f"{cfg.topic}.dlq" if dlq else None,
                        bootstrap=cfg.bootstrap)
    if cfg.name == "ads":
        mapping = ads.load_mapping(cfg.mapping or Path(".qstate/ads-campaigns.json"))
        return ads.operators(events, mapping)
    return tweets.operators(events)


def start_job(spark: SparkSession, cfg: JobConfig) -> RunningJob:
    ensure_topic(cfg.bootstrap, cfg.topic)
    queries: dict[str, StreamingQuery] = {}
    stats: dict[str, SinkStats] = {}
    # Each operator is its own streaming query over the topic; only the first one sends
    # bad records to the dead-letter topic, so each lands there once.
    ops = build_operators(spark, cfg, dlq=True)
    if len(ops) > 1:
        ops = ops[:1] + build_operators(spark, cfg, dlq=False)[1:]
    for op in ops:
        stats[op.name] = SinkStats()
        queries[op.name] = serve(
            op.frame, job=cfg.job, operator=op.name, key=op.key, states=op.states,
            window=op.window, partitions=cfg.partitions, checkpoint=str(cfg.checkpoint / op.name),
            storage=cfg.storage, shards=cfg.shards, retention_ms=cfg.retention_ms,
            trigger_interval=cfg.trigger_interval, stats=stats[op.name])
    return RunningJob(cfg, queries, stats)


def wait_until_stopped(job: RunningJob, should_stop, poll_s: float = 1.0) -> None:
    while not should_stop():
        job.check()
        job.export_metrics()
        time.sleep(poll_s)
