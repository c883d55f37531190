"""Prometheus metrics of a shard server. No per-key labels: a job, an operator, a state or a
status at most.

What the server holds (partitions by state, their size on disk, their watermark) is computed
when scraped (``HeldCollector``), so it is true between commits too: a partition that starts
restoring or moves away shows at the next scrape, not at the next batch.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping
from itertools import accumulate
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from qstate._engine import LOOKUP_BUCKETS
from qstate.core.errors import InvalidAddress, QStateError

if TYPE_CHECKING:
    from qstate.core.address import PartitionId
    from qstate.shard.held import Held
    from qstate.shard.memory import MemoryBudget

__all__ = ["APPLIED_ROWS", "APPLY_SECONDS", "CAUGHT_UP", "COMMITS", "COMMIT_SECONDS", "HELD",
           "LAST_SKIPPED", "LOOKUPS", "LOOKUP_SECONDS", "MEMORY", "READER", "STATES",
           "STATE_WRITES", "TOP_PARTITIONS", "TOP_SECONDS", "HeldCollector", "ReaderCollector",
           "refused_commit", "watch_memory"]

COMMITS = Counter("qstate_shard_commits_total",
                  "Partition commits by result: applied, skipped (this server already had the "
                  "batch), or the error class that refused the Commit (StaleEpoch, NotOwner, "
                  "Unavailable, DeltaMismatch, ...)", ["job", "operator", "result"])
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
CAUGHT_UP = Counter("qstate_shard_caught_up_batches_total",
                    "Batches replayed from checkpoint storage, per partition: bringing a "
                    "partition up (after a restart or a move) or a gap a commit found",
                    ["job", "operator"])
LOOKUPS = Counter("qstate_shard_lookup_keys_total", "Keys looked up", ["status"])
# the bounds of the reader's qstate_shard_reader_seconds too: one panel sums the two
LOOKUP_SECONDS = Histogram("qstate_shard_lookup_seconds",
                           "Time per MultiGet call answered by the server's Python (savepoint "
                           "reads; every read with QSTATE_SHARD_READER=false)",
                           buckets=tuple(LOOKUP_BUCKETS))
TOP_PARTITIONS = Counter("qstate_shard_top_partitions_total",
                         "Partitions a Top call answered, by how: read (from the rank index "
                         "or the panes) or cached (the same top-N at the same batch)", ["how"])
for _how in ("read", "cached"):
    TOP_PARTITIONS.labels(_how)
TOP_SECONDS = Histogram("qstate_shard_top_seconds", "Time per Top call (all its partitions)",
                        buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5))
# with qstate_shard_commits_total{result="skipped"} (how many partitions): which batch a
# restarted driver re-ran (or a committer re-sent) that this server already had
LAST_SKIPPED = Gauge("qstate_shard_last_skipped_batch",
                     "Newest batch a Commit found already applied on some of its partitions "
                     "(a re-run or re-sent batch)", ["job", "operator"])

MEMORY = Gauge("qstate_shard_rocksdb_memory_bytes",
               "RocksDB memory of every partition held, by kind: cache (blocks and the "
               "memtables charged to it), memtables (their part of it), pinned (blocks in use "
               "by a read or pinned), budget (QSTATE_SHARD_MEMORY_MB)", ["kind"])


def watch_memory(memory: MemoryBudget) -> None:
    """Report ``memory`` at each scrape."""
    def reader(kind: str) -> Callable[[], float]:
        return lambda: memory.usage()[kind]

    for kind in ("cache", "memtables", "pinned"):
        MEMORY.labels(kind).set_function(reader(kind))
    MEMORY.labels("budget").set(memory.budget)


def refused_commit(job: str, operator: str, exc: QStateError, partitions: int) -> None:
    """A Commit refused with ``exc``: counted under its class (a fixed set, the error tree)
    for each partition it asked for. Names that failed validation are no label."""
    if isinstance(exc, InvalidAddress):
        job = operator = ""
    COMMITS.labels(job, operator, type(exc).__name__).inc(max(1, partitions))


STATES = ("serving", "restoring", "retired")
# RocksDB's table files and write-ahead logs: the data, not its info logs or manifests
_DATA_SUFFIXES = (".sst", ".log")


def _data_bytes(folder: Path) -> int:
    total = 0
    try:
        with os.scandir(folder) as it:
            for e in it:
                if e.name.endswith(_DATA_SUFFIXES) and e.is_file(follow_symlinks=False):
                    total += e.stat(follow_symlinks=False).st_size
    except FileNotFoundError:  # being replaced by a restore, or never written
        pass
    return total


def _partition_folders(server_dir: Path) -> dict[tuple[str, str, int], Path]:
    """(job, operator, partition) -> folder, for every partition folder on this disk
    (``qstate.partition.files`` layout: ``{job}/{operator}/p{partition:05d}``)."""
    out = {}
    for job in _dirs(server_dir):
        if job.name.startswith("."):  # .scratch: snapshots being taken
            continue
        for op in _dirs(job):
            for part in _dirs(op):
                if part.name.startswith("p") and part.name[1:].isdigit():
                    out[(job.name, op.name, int(part.name[1:]))] = part
    return out


def _dirs(folder: Path) -> list[Path]:
    try:
        return [Path(e.path) for e in os.scandir(folder) if e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return []


class HeldCollector(Collector):
    """``qstate_shard_partitions{job,operator,state}``: partitions held and serving reads,
    held and restoring (reads answer RESTORING), and retired (moved away; the folder is
    still on this disk); ``qstate_shard_rocksdb_bytes{job,operator}``: SST and WAL bytes of
    the held partitions; ``qstate_shard_last_batch`` and ``qstate_shard_watermark_ms``
    ``{job,operator}``: the lowest last batch and watermark of the serving ones (after a
    restart too, before any commit). The folder scan runs at most every ``disk_every_s``."""

    def __init__(self, disk_every_s: float = 10.0) -> None:
        self.disk_every_s = disk_every_s
        self._held: Callable[[], Mapping[PartitionId, Held]] | None = None
        self._server_dir: Path | None = None
        self._disk: dict[tuple[str, str, int], int] = {}  # folder -> data bytes
        self._disk_at = float("-inf")

    def watch(self, server_dir: Path, held: Callable[[], Mapping[PartitionId, Held]]) -> None:
        """Report on ``held()`` (must not block: it runs in the scrape) and ``server_dir``."""
        self._server_dir, self._held = server_dir, held
        self._disk_at = float("-inf")

    def _families(self) -> tuple[GaugeMetricFamily, ...]:
        return (
            GaugeMetricFamily("qstate_shard_partitions",
                              "Partitions on this server by state: serving, restoring (held, "
                              "reads answer RESTORING), retired (moved away, folder still on "
                              "disk)", labels=["job", "operator", "state"]),
            GaugeMetricFamily("qstate_shard_rocksdb_bytes",
                              "SST and WAL bytes on disk of the partitions held (refreshed at "
                              "most every 10 s)", labels=["job", "operator"]),
            GaugeMetricFamily("qstate_shard_last_batch",
                              "Lowest last batch of the serving partitions held",
                              labels=["job", "operator"]),
            GaugeMetricFamily("qstate_shard_watermark_ms",
                              "Lowest watermark of the serving partitions held, epoch ms",
                              labels=["job", "operator"]),
        )

    def describe(self) -> Iterator[Metric]:
        return iter(self._families())

    def _scan(self) -> dict[tuple[str, str, int], int]:
        now = time.monotonic()
        if self._server_dir is not None and now - self._disk_at >= self.disk_every_s:
            self._disk = {k: _data_bytes(p)
                          for k, p in _partition_folders(self._server_dir).items()}
            self._disk_at = now
        return self._disk

    def collect(self) -> Iterator[Metric]:
        families = parts, size, batches, marks = self._families()
        if self._held is None:
            return iter(families)
        held = self._held()
        disk = self._scan()
        counts: dict[tuple[str, str], dict[str, int]] = {}
        nbytes: dict[tuple[str, str], int] = {}
        low: dict[tuple[str, str], tuple[int, int]] = {}  # lowest (batch, watermark)
        for pid, h in held.items():
            op = (pid.job, pid.operator)
            state = "serving" if h.ready.is_set() else "restoring"
            counts.setdefault(op, dict.fromkeys(STATES, 0))[state] += 1
            nbytes[op] = nbytes.get(op, 0) + disk.get((pid.job, pid.operator, pid.partition), 0)
            if state == "serving":
                meta = h.store.meta
                b, wm = low.get(op, (meta.last_batch, meta.watermark_ms))
                low[op] = (min(b, meta.last_batch), min(wm, meta.watermark_ms))
        mine = {(p.job, p.operator, p.partition) for p in held}
        for job, operator, p in disk:
            if (job, operator, p) not in mine:
                counts.setdefault((job, operator), dict.fromkeys(STATES, 0))["retired"] += 1
        for (job, operator), by_state in sorted(counts.items()):
            for state, n in by_state.items():
                parts.add_metric([job, operator, state], n)
        for (job, operator), n in sorted(nbytes.items()):
            size.add_metric([job, operator], n)
        for (job, operator), (b, wm) in sorted(low.items()):
            batches.add_metric([job, operator], b)
            marks.add_metric([job, operator], wm)
        return iter(families)


HELD = HeldCollector()
REGISTRY.register(HELD)


# keys by status, calls, panics, and the calls' latency: each bucket's count (not
# cumulative, +Inf last, on LOOKUP_BUCKETS) and their sum (``Engine.reader_counts``)
ReaderCounts = tuple[list[tuple[str, int]], int, int, tuple[list[int], float]]


class ReaderCollector(Collector):
    """``qstate_shard_reader_keys_total{status}``, ``qstate_shard_reader_calls_total`` and
    ``qstate_shard_reader_seconds``: what the server's reader (the read engine on its own
    port, which other hosts' routers ask for live reads: ``qstate.shard.reader``) answered,
    read from the engine at each scrape, so a read is counted by the time its answer is sent."""

    STATUSES = ("FOUND", "ABSENT", "NOT_OWNED", "RESTORING")

    def __init__(self) -> None:
        self._counts: Callable[[], ReaderCounts] | None = None

    def watch(self, counts: Callable[[], ReaderCounts]) -> None:
        self._counts = counts

    def _families(self) -> tuple[CounterMetricFamily, CounterMetricFamily,
                                 CounterMetricFamily, HistogramMetricFamily]:
        return (CounterMetricFamily("qstate_shard_reader_keys",
                                    "Keys the server's reader (the read engine on its own port: "
                                    "other hosts' routers' live reads) answered, by status",
                                    labels=["status"]),
                CounterMetricFamily("qstate_shard_reader_calls",
                                    "MultiGet calls the server's reader answered (refusals "
                                    "included)"),
                CounterMetricFamily("qstate_shard_reader_panics",
                                    "Calls of the server's reader a panic in the engine ended "
                                    "(answered INTERNAL; the port goes on): a bug to report"),
                HistogramMetricFamily("qstate_shard_reader_seconds",
                                      "Time per MultiGet call answered by the server's reader "
                                      "(on the bounds of qstate_shard_lookup_seconds)"))

    def describe(self) -> Iterator[Metric]:
        return iter(self._families())

    def collect(self) -> Iterator[Metric]:
        families = keys, calls, panics, latency = self._families()
        got, n, p, (buckets, total) = self._counts() if self._counts is not None else (
            [], 0, 0, ([0] * (len(LOOKUP_BUCKETS) + 1), 0.0))
        by = dict(got)
        for status in self.STATUSES:
            keys.add_metric([status], by.get(status, 0))
        calls.add_metric([], n)
        panics.add_metric([], p)
        # each bound written as the Python histogram writes its own: the panel adds them by le
        bounds = [*map(floatToGoString, LOOKUP_BUCKETS), "+Inf"]
        latency.add_metric([], list(zip(bounds, accumulate(buckets), strict=True)), total)
        return iter(families)


READER = ReaderCollector()
REGISTRY.register(READER)
