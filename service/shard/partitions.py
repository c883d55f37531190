"""The partitions a shard server holds: taken from the assignment, committed batch by batch
where it owns them, followed from storage where it holds a copy (``follow``), dropped when
they move away (docs/architecture.md §3-4). Bringing one up to date is ``recovery``; snapshots are
``snapshot``.

A partition that changes from follower to owner keeps its store: a planned move hands over
a copy that is already caught up (qstate.control.placement)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from rocksdict import DbClosedError

from qstate.core.address import PartitionId
from qstate.core.config import DEFAULTS
from qstate.core.errors import DeltaMismatch, NotOwner, StaleEpoch, Unavailable, UnknownOperator
from qstate.core.records import delta as deltas
from qstate.core.records import paths
from qstate.core.records.assignment import Assignment, load_assignment
from qstate.core.records.catalog import manifest_batches
from qstate.core.records.operator import OperatorSpec, load_spec
from qstate.core.records.storage import Storage
from qstate.partition.files import partition_dir
from qstate.shard import metrics
from qstate.shard.held import Held, Ready
from qstate.shard.memory import MemoryBudget, process_budget
from qstate.shard.recovery import Recovery
from qstate.shard.snapshot import Snapshotter
from qstate.shard.store import PartitionStore

__all__ = ["CommitResult", "PartitionCommit", "Partitions"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartitionCommit:
    partition: int
    fragments: tuple[int, ...]  # none: the batch had no rows for the partition
    rows: int


@dataclass
class CommitResult:
    applied: list[int]
    skipped: list[int]
    caught_up: int


class Partitions:
    def __init__(self, server_dir: Path, storage: Storage, server_id: str,
                 snapshot_every: int = DEFAULTS.snapshot_every,
                 snapshots_kept: int = DEFAULTS.snapshots_kept,
                 workers: int = DEFAULTS.commit_workers,
                 restore_timeout_s: float = DEFAULTS.restore_timeout_s,
                 restore_retry_s: float = DEFAULTS.restore_retry_s,
                 rank_index: bool = DEFAULTS.rank_index,
                 memory: MemoryBudget | None = None) -> None:
        self.server_dir = server_dir
        self.memory = memory or process_budget()
        self.rank_index = rank_index
        self.storage = storage
        self.server_id = server_id
        self.restore_timeout_s = restore_timeout_s
        self._held: dict[PartitionId, Held] = {}
        self._specs: dict[tuple[str, str], OperatorSpec] = {}
        self.epochs: dict[str, int] = {}
        self._lock = threading.RLock()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="commit")
        self._bg = ThreadPoolExecutor(2, thread_name_prefix="restore")
        self.snapshots = Snapshotter(storage, server_dir / ".scratch", snapshot_every,
                                     snapshots_kept, self._bg)
        # told each time what is held, ready or restoring changes (``qstate.shard.reader``)
        self.on_change: Callable[[], None] = lambda: None
        self.recovery = Recovery(storage, server_dir, self.spec,
                                 lambda job: self.epochs.get(job, 0), restore_retry_s)

    def close(self) -> None:
        with self._lock:  # first: a bring-up that keeps failing stops retrying
            held = list(self._held.values())
            self._held.clear()
        self._pool.shutdown(wait=True)
        self._bg.shutdown(wait=True, cancel_futures=True)
        for h in held:
            with h.store.lock:
                h.store.close()

    def spec(self, job: str, operator: str, fresh: bool = False) -> OperatorSpec:
        """The operator's spec, read once (``fresh``: again, e.g. after a rescale)."""
        spec = None if fresh else self._specs.get((job, operator))
        if spec is None:
            spec = load_spec(self.storage, job, operator)
            if spec is None:
                raise UnknownOperator(f"operator {job}/{operator} is not known to storage")
            self._specs[(job, operator)] = spec
        return spec

    # ---- ownership --------------------------------------------------------------
    def sync(self, job: str | None = None) -> None:
        """Adopt newer assignments from storage: acquire what is ours, drop what is not."""
        jobs = [job] if job else self.storage.list_dirs(paths.jobs_dir())
        for j in jobs:
            a = load_assignment(self.storage, j)
            if a.epoch > self.epochs.get(j, 0):
                self._adopt(a)

    def _adopt(self, a: Assignment) -> None:
        with self._lock:
            if a.epoch <= self.epochs.get(a.job, 0):
                return
            owned = a.owned_by(self.server_id)
            mine = owned | a.followed_by(self.server_id)
            current = {pid for pid in self._held if pid.job == a.job}
            self.epochs[a.job] = a.epoch  # before acquiring: catch-up writes at this epoch
            self._respec(a.job)
            for pid in current - mine:
                self._drop(pid)
            for pid in current & mine:
                self._held[pid].owner = pid in owned
            for pid in sorted(mine - current):
                self._acquire(pid, pid in owned)
            self.on_change()
            log.warning("epoch %d of %s: %d partitions here, %d of them followed (+%d -%d)",
                        a.epoch, a.job, len(mine), len(mine - owned), len(mine - current),
                        len(current - mine))

    def _respec(self, job: str) -> None:
        """A new epoch is a job (re)started, maybe with changed code: its operators' specs are
        read again, before any batch of that run is applied (docs/upgrading.md)."""
        for op in {pid.operator for pid in self._held if pid.job == job}:
            spec = self.spec(job, op, fresh=True)
            for pid, held in self._held.items():
                if (pid.job, pid.operator) == (job, op) and held.store.spec != spec:
                    held.store.respec(spec)

    def _acquire(self, pid: PartitionId, owner: bool) -> None:
        spec = self.spec(pid.job, pid.operator)
        held = Held(PartitionStore(partition_dir(self.server_dir, pid), spec,
                                   self.rank_index, self.memory), owner=owner,
                    ready=Ready(lambda: self.on_change()))
        self._held[pid] = held
        self._bg.submit(self.recovery.bring_up, pid, held, lambda: self._held.get(pid) is held)

    def _drop(self, pid: PartitionId) -> None:
        held = self._held.pop(pid)
        with held.store.lock:  # after any batch being applied
            held.store.retire()
            held.store.close()

    # ---- commit -----------------------------------------------------------------
    def commit(self, job: str, operator: str, batch: int, watermark_ms: int, epoch: int,
               parts: list[PartitionCommit]) -> CommitResult:
        if epoch > self.epochs.get(job, 0):
            self.sync(job)  # a new run: its specs too (_respec)
        spec = self.spec(job, operator)
        known = self.epochs.get(job, 0)
        if epoch < known:
            raise StaleEpoch(f"stale epoch {epoch} < {known} for {job}: a newer coordinator "
                             f"owns the assignment")
        work = []
        for pc in parts:
            pid = PartitionId(job, operator, pc.partition)
            h = self._held.get(pid)
            if h is None or not h.owner:
                raise NotOwner(f"partition {pid} is not owned by {self.server_id} at epoch "
                               f"{known}")
            work.append((pid, h, pc))
        futures = [self._pool.submit(self._commit_one, spec, pid, h, batch, watermark_ms,
                                     epoch, pc) for pid, h, pc in work]
        result = CommitResult([], [], 0)
        for pc, fut in zip(parts, futures, strict=True):
            applied, caught_up = fut.result()
            (result.applied if applied else result.skipped).append(pc.partition)
            result.caught_up += caught_up
        return result

    def _commit_one(self, spec: OperatorSpec, pid: PartitionId, held: Held, batch: int,
                    watermark_ms: int, epoch: int, pc: PartitionCommit) -> tuple[bool, int]:
        if not held.ready.wait(self.restore_timeout_s):
            # retryable: the committer backs off and asks again (a slow restore is not a
            # failure of the batch)
            raise Unavailable(f"{pid} is still restoring on {self.server_id}")
        try:
            caught_up = self.recovery.catch_up(pid, held, batch - 1)
            table = None
            if pc.fragments:
                table = deltas.read_deltas(self.storage, pid, batch, pc.fragments, spec)
                if table.num_rows != pc.rows:
                    raise DeltaMismatch(f"delta for {pid} batch {batch} has {table.num_rows} rows, "
                                        f"committer announced {pc.rows}")
            retention = spec.retention_ms if spec.windowed else None
            t0 = time.perf_counter()
            applied = held.store.apply(batch, watermark_ms, epoch, table, retention)
            if applied:
                labels = (spec.job, spec.operator)
                metrics.APPLY_SECONDS.labels(*labels).inc(time.perf_counter() - t0)
                metrics.APPLIED_ROWS.labels(*labels).inc(held.store.last_apply.rows)
                metrics.STATE_WRITES.labels(*labels).inc(held.store.last_apply.writes)
                self.snapshots.after_commit(pid, held)
        except DbClosedError as exc:
            # handed off meanwhile (a drain, or a newer assignment dropped it here): the
            # committer asks the owner it names now, which catches this batch up from its
            # manifest; applying it twice is refused by batch number (docs/architecture.md §3)
            raise NotOwner(f"{pid} left {self.server_id} while batch {batch} was "
                           f"committing") from exc
        return applied, caught_up

    # ---- followers --------------------------------------------------------------
    def follow(self) -> int:
        """Bring every followed partition that serves up to the newest batch recorded in
        storage (each batch's manifest is written before its commit). Returns how many
        batches were applied."""
        with self._lock:
            followed = [(pid, h) for pid, h in self._held.items()
                        if not h.owner and h.ready.is_set()]
        newest: dict[tuple[str, str], list[int]] = {}
        applied = 0
        for pid, held in followed:
            batches = newest.get((pid.job, pid.operator))
            if batches is None:
                batches = newest[(pid.job, pid.operator)] = manifest_batches(
                    self.storage, pid.job, pid.operator)
                # a run's epoch is written before its first batch: adopted now, the run's
                # specs are read before its batches listed here are applied (once per
                # listing, not per job: one listed after this sync could hold a newer run's)
                self.sync(pid.job)
            if not batches or self._held.get(pid) is not held:
                continue
            try:
                applied += self.recovery.catch_up(pid, held, batches[-1], batches)
            except Exception as exc:
                if self._held.get(pid) is held:  # else: dropped under us, nothing to do
                    log.warning("following %s failed (next round again): %s", pid, exc)
        return applied

    # ---- reads ------------------------------------------------------------------
    def lookup(self, pid: PartitionId) -> Held | None:
        return self._held.get(pid)

    def held(self) -> list[tuple[PartitionId, Held]]:
        with self._lock:
            return sorted(self._held.items())

    def held_now(self) -> dict[PartitionId, Held]:
        """A copy without the lock, which an assignment change holds while it waits for a
        batch being applied: a metrics scrape must never wait for that. A change in another
        thread during the copy makes it raise: copy again."""
        for _ in range(100):
            try:
                return dict(self._held)
            except RuntimeError:  # "dictionary changed size during iteration"
                continue
        with self._lock:
            return dict(self._held)
