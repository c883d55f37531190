"""Prometheus metrics of a running job (driver side). No per-key labels: a job, an operator,
a topic, a reason or a stage at most.

Freshness is ``now - watermark`` and ``now - last commit``: exported as the timestamps
(``qstate_job_watermark_ms``, ``qstate_job_last_commit_timestamp_seconds``) and as gauges
computed when scraped.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge, Histogram

if TYPE_CHECKING:
    from qstate.jobs.runtime.reports import BatchReport

__all__ = ["BATCHES", "BATCH_SECONDS", "COMMIT_SECONDS", "DEAD_LETTERED",
           "EVENTS", "FRESHNESS", "JOB_UP", "LAG", "LAST_BATCH", "LAST_COMMIT", "PARTIAL_ROWS",
           "STAGE_SECONDS", "WATERMARK", "observe_batch"]

_SECONDS = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64)

BATCHES = Counter("qstate_job_batches_total", "Micro-batches committed", ["job"])
EVENTS = Counter("qstate_job_events_total", "Records read from the topic (good and "
                 "dead-lettered): its rate is the ingest rate", ["job"])
BATCH_SECONDS = Histogram("qstate_job_batch_seconds", "Time of a whole micro-batch", ["job"],
                          buckets=_SECONDS)
STAGE_SECONDS = Histogram("qstate_job_stage_seconds",
                          "Time of a micro-batch by stage: spark (source, parse, partial "
                          "aggregates, delta files), commit (on the shards)",
                          ["job", "operator", "stage"], buckets=_SECONDS)
COMMIT_SECONDS = Histogram("qstate_sink_commit_seconds", "Time to commit a batch on all shards",
                           ["job", "operator"], buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                         0.5, 1, 2, 5, 10, 30))
PARTIAL_ROWS = Counter("qstate_job_partial_rows_total", "Rows written to delta files",
                       ["job", "operator"])
LAST_BATCH = Gauge("qstate_job_last_batch", "Last batch committed", ["job", "operator"])
WATERMARK = Gauge("qstate_job_watermark_ms", "Watermark of the last committed batch, epoch ms",
                  ["job", "operator"])
LAST_COMMIT = Gauge("qstate_job_last_commit_timestamp_seconds",
                    "When the last batch was committed, epoch seconds", ["job", "operator"])
FRESHNESS = Gauge("qstate_job_freshness_seconds",
                  "How old the served state is: now - watermark (kind=watermark) and now - "
                  "last commit (kind=commit)", ["job", "operator", "kind"])
DEAD_LETTERED = Counter("qstate_job_dead_lettered_total", "Records sent to the dead-letter topic",
                        ["job", "topic", "reason"])
LAG = Gauge("qstate_job_lag_events", "Events in the topic not read yet", ["job", "topic"])
JOB_UP = Gauge("qstate_job_up", "1 while the job's queries run, 0 once one has failed "
               "(the other jobs of the process keep running)", ["job"])

_known: set[tuple[str, str]] = set()


def _freshness(job: str, operator: str) -> None:
    """Gauges computed at scrape time from the timestamps above."""
    if (job, operator) in _known:
        return
    _known.add((job, operator))
    wm, commit = WATERMARK.labels(job, operator), LAST_COMMIT.labels(job, operator)
    FRESHNESS.labels(job, operator, "watermark").set_function(
        lambda: time.time() - wm._value.get() / 1000)
    FRESHNESS.labels(job, operator, "commit").set_function(
        lambda: time.time() - commit._value.get())


def expect_dead_letters(job: str, topic: str | None, reasons: Iterable[str]) -> None:
    """The job's dead-letter series, one per reason, at 0 from the start: a dashboard shows
    0 where it would show "No data" until a first bad record."""
    for reason in reasons:
        DEAD_LETTERED.labels(job, topic or "", reason)


def observe_batch(job: str, topic: str | None, report: BatchReport) -> None:
    BATCHES.labels(job).inc()
    EVENTS.labels(job).inc(report.events)  # every record a task read, dead-lettered too
    BATCH_SECONDS.labels(job).observe(report.total_s)
    for reason, n in report.dead_lettered.items():
        DEAD_LETTERED.labels(job, topic or "", reason).inc(n)
    now = time.time()
    for op, r in report.operators.items():
        STAGE_SECONDS.labels(job, op, "spark").observe(report.spark_s + r.write_s)
        STAGE_SECONDS.labels(job, op, "commit").observe(r.commit_s)
        PARTIAL_ROWS.labels(job, op).inc(r.rows)
        LAST_BATCH.labels(job, op).set(report.batch)
        WATERMARK.labels(job, op).set(report.watermark_ms)
        LAST_COMMIT.labels(job, op).set(now)
        _freshness(job, op)


