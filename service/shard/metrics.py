"""Prometheus metrics of a shard server."""

from prometheus_client import Counter, Gauge, Histogram

__all__ = ["APPLIED_ROWS", "APPLY_SECONDS", "CAUGHT_UP", "COMMITS", "COMMIT_SECONDS",
           "LAST_BATCH", "LOOKUPS", "LOOKUP_SECONDS", "PARTITIONS", "STATE_WRITES"]

COMMITS = Counter("qstate_shard_commits_total", "Partition commits", ["job", "operator", "result"])
COMMIT_SECONDS = Histogram(
    "qstate_shard_commit_seconds", "Time to apply one batch on this server", ["job", "operator"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
APPLY_SECONDS = Counter("qstate_shard_apply_seconds_total",
                        "Time spent applying deltas to partitions (merge + write)",
                        ["job", "operator"])
APPLIED_ROWS = Counter("qstate_shard_applied_rows_total", "Delta rows applied",
                       ["job", "operator"])
STATE_WRITES = Counter("qstate_shard_state_writes_total",
                       "RocksDB puts and deletes of state (not the index or meta)",
                       ["job", "operator"])
CAUGHT_UP = Counter("qstate_shard_caught_up_batches_total", "Deltas replayed to close a gap",
                    ["job", "operator"])
LOOKUPS = Counter("qstate_shard_lookup_keys_total", "Keys looked up", ["status"])
LOOKUP_SECONDS = Histogram("qstate_shard_lookup_seconds", "Time per MultiGet call",
                           buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05))
LAST_BATCH = Gauge("qstate_shard_last_batch", "Last applied batch", ["job", "operator"])
PARTITIONS = Gauge("qstate_shard_partitions", "Partitions held")
