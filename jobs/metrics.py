"""Prometheus metrics of a running job (driver side)."""

from prometheus_client import Counter, Gauge, Histogram

__all__ = ["BATCH_SECONDS", "COMMIT_SECONDS", "DEAD_LETTERED", "INPUT_RATE", "LAST_BATCH",
           "PROCESSED_RATE", "WATERMARK"]

INPUT_RATE = Gauge("qstate_job_input_rows_per_second", "Rows/s arriving, last batch",
                   ["job", "operator"])
PROCESSED_RATE = Gauge("qstate_job_processed_rows_per_second", "Rows/s processed, last batch",
                       ["job", "operator"])
BATCH_SECONDS = Histogram("qstate_job_batch_seconds", "Trigger execution time", ["job", "operator"],
                          buckets=(0.25, 0.5, 1, 2, 4, 8, 16, 32, 64))
COMMIT_SECONDS = Histogram("qstate_sink_commit_seconds", "Time to commit a batch on all shards",
                           ["job", "operator"],
                           buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5))
LAST_BATCH = Gauge("qstate_job_last_batch", "Last batch the sink committed", ["job", "operator"])
WATERMARK = Gauge("qstate_job_watermark_ms", "Watermark of the last committed batch",
                  ["job", "operator"])
DEAD_LETTERED = Counter("qstate_job_dead_lettered_total", "Records sent to the dead-letter topic",
                        ["job", "topic"])
