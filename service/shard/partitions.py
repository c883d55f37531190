"""The partitions a shard server owns: acquired from the assignment, brought up to date,
committed batch by batch, snapshotted, dropped when they move away (DESIGN §3-4)."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from service import delta as deltas
from service.assignment import Assignment, load_assignment
from service.batches import manifest_batches, read_manifest
from service.operator import OperatorSpec, load_spec
from service.shard import snapshot
from service.shard.store import PartitionStore, StaleEpoch
from service.storage import Storage

log = logging.getLogger("qstate.shard")
Key = tuple[str, str, int]  # job, operator, partition


class UnknownOperator(LookupError):
    pass


class NotOwner(RuntimeError):
    """The committer thinks this server owns a partition the assignment gives elsewhere."""


class DeltaMismatch(RuntimeError):
    """A delta file or batch manifest is missing or does not match what was announced."""


@dataclass(frozen=True)
class PartitionCommit:
    partition: int
    has_delta: bool
    rows: int


@dataclass
class CommitResult:
    applied: list[int]
    skipped: list[int]
    caught_up: int


@dataclass
class Held:
    store: PartitionStore
    ready: threading.Event
    snapshot_batch: int = -1  # batch of the last snapshot this server took or restored


class Partitions:
    def __init__(self, data_dir: Path, storage: Storage, server_id: str,
                 snapshot_every: int = 10, workers: int = 4,
                 restore_timeout_s: float = 120.0) -> None:
        self.data_dir = data_dir
        self.storage = storage
        self.server_id = server_id
        self.snapshot_every = snapshot_every
        self.restore_timeout_s = restore_timeout_s
        self._held: dict[Key, Held] = {}
        self._specs: dict[tuple[str, str], OperatorSpec] = {}
        self.epochs: dict[str, int] = {}
        self._lock = threading.RLock()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="commit")
        self._bg = ThreadPoolExecutor(2, thread_name_prefix="restore")
        self._snapshots = snapshot.Snapshotter(storage, data_dir / ".scratch")
        self._snapshotting: set[Key] = set()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._bg.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            for h in self._held.values():
                h.store.close()
            self._held.clear()

    def spec(self, job: str, operator: str) -> OperatorSpec:
        spec = self._specs.get((job, operator))
        if spec is None:
            spec = load_spec(self.storage, job, operator)
            if spec is None:
                raise UnknownOperator(f"operator {job}/{operator} is not known to storage")
            self._specs[(job, operator)] = spec
        return spec

    def _path(self, k: Key) -> Path:
        return self.data_dir / k[0] / k[1] / f"p{k[2]:05d}"

    # ---- ownership --------------------------------------------------------------
    def sync(self, job: str | None = None) -> None:
        """Adopt newer assignments from storage: acquire what is ours, drop what is not."""
        jobs = [job] if job else self.storage.list_dirs(self.storage.path("jobs"))
        for j in jobs:
            a = load_assignment(self.storage, j)
            if a.epoch > self.epochs.get(j, 0):
                self._adopt(a)

    def _adopt(self, a: Assignment) -> None:
        with self._lock:
            if a.epoch <= self.epochs.get(a.job, 0):
                return
            mine = {(a.job, op, p) for op, p in a.owned_by(self.server_id)}
            current = {k for k in self._held if k[0] == a.job}
            self.epochs[a.job] = a.epoch  # before acquiring: catch-up writes at this epoch
            for k in current - mine:
                self._drop(k)
            for k in sorted(mine - current):
                self._acquire(k)
            log.warning("epoch %d of %s: %d partitions here (+%d -%d)", a.epoch, a.job,
                        len(mine), len(mine - current), len(current - mine))

    def _acquire(self, k: Key) -> None:
        spec = self.spec(k[0], k[1])
        held = Held(PartitionStore(self._path(k), spec.state_names), threading.Event())
        self._held[k] = held
        self._bg.submit(self._bring_up, k, held)

    def _drop(self, k: Key) -> None:
        held = self._held.pop(k)
        with held.store.lock:  # after any batch being applied
            held.store.retire()
            held.store.close()

    def _bring_up(self, k: Key, held: Held) -> None:
        """Catch up to the newest batch in storage, then serve (restore on a new server).
        Retried until it works or the partition moves away."""
        while self._held.get(k) is held:
            try:
                batches = manifest_batches(self.storage, k[0], k[1])
                if batches:
                    self._catch_up(k, held, batches[-1], batches)
                held.ready.set()
                return
            except Exception:
                log.exception("bringing up %s failed; retrying", k)
                time.sleep(1.0)

    def _catch_up(self, k: Key, held: Held, upto: int, batches: list[int] | None = None) -> int:
        """Apply batches ``last_batch+1 .. upto`` from storage, starting from the newest
        snapshot when we are behind it (or the manifests we need are gone). Returns the
        number of batches replayed."""
        store = held.store
        if store.meta.last_batch >= upto:
            return 0
        spec = self.spec(k[0], k[1])
        have = set(batches if batches is not None else manifest_batches(self.storage, k[0], k[1]))
        snaps = snapshot.list_snapshots(self.storage, k[0], k[1], k[2])
        needed = range(store.meta.last_batch + 1, upto + 1)
        # Behind the newest snapshot: the deltas before it may be pruned, so start from it
        # (also the cheaper way: one download instead of many batches).
        if (snaps and snaps[-1] > store.meta.last_batch and snaps[-1] <= upto) or \
                not all(b in have for b in needed):
            t0 = time.perf_counter()
            was_ready = held.ready.is_set()
            held.ready.clear()  # readers get RESTORING, never a half-restored partition
            with store.lock:
                store.close()
                try:
                    snapshot.restore(self.storage, k[0], k[1], k[2], self._path(k),
                                     max((b for b in snaps if b <= upto), default=None))
                finally:
                    store.reopen()
            if was_ready:  # in a commit: serve the restored state; bring-up sets it when done
                held.ready.set()
            held.snapshot_batch = store.meta.last_batch
            log.warning("%s restored from snapshot at batch %d in %.2fs", k,
                        store.meta.last_batch, time.perf_counter() - t0)
            needed = range(store.meta.last_batch + 1, upto + 1)
            missing = [b for b in needed if b not in have]
            if missing:
                raise DeltaMismatch(f"{k}: batch manifests {missing[:5]} are gone from storage")
        retention = spec.retention_ms if spec.windowed else None
        epoch = self.epochs.get(k[0], 0)
        for b in needed:
            m = read_manifest(self.storage, k[0], k[1], b)
            table = (deltas.read_delta(self.storage, k[0], k[1], k[2], b)
                     if k[2] in m.deltas else None)
            store.apply(b, m.watermark_ms, epoch, table, retention)
        return len(needed)

    # ---- commit -----------------------------------------------------------------
    def commit(self, job: str, operator: str, batch: int, watermark_ms: int, epoch: int,
               parts: list[PartitionCommit]) -> CommitResult:
        spec = self.spec(job, operator)
        if epoch > self.epochs.get(job, 0):
            self.sync(job)
        known = self.epochs.get(job, 0)
        if epoch < known:
            raise StaleEpoch(f"stale epoch {epoch} < {known} for {job}: a newer coordinator "
                             f"owns the assignment")
        held = []
        for pc in parts:
            h = self._held.get((job, operator, pc.partition))
            if h is None:
                raise NotOwner(f"partition {pc.partition} of {job}/{operator} is not owned by "
                               f"{self.server_id} at epoch {known}")
            held.append(h)
        futures = [self._pool.submit(self._commit_one, spec, h, batch, watermark_ms, epoch, pc)
                   for h, pc in zip(held, parts, strict=True)]
        result = CommitResult([], [], 0)
        for pc, fut in zip(parts, futures, strict=True):
            applied, caught_up = fut.result()
            (result.applied if applied else result.skipped).append(pc.partition)
            result.caught_up += caught_up
        return result

    def _commit_one(self, spec: OperatorSpec, held: Held, batch: int, watermark_ms: int,
                    epoch: int, pc: PartitionCommit) -> tuple[bool, int]:
        k = (spec.job, spec.operator, pc.partition)
        if not held.ready.wait(self.restore_timeout_s):
            raise DeltaMismatch(f"{k} is still restoring")
        caught_up = self._catch_up(k, held, batch - 1)
        table = None
        if pc.has_delta:
            try:
                table = deltas.read_delta(self.storage, spec.job, spec.operator, pc.partition,
                                          batch)
            except FileNotFoundError as exc:
                raise DeltaMismatch(f"delta for partition {pc.partition} batch {batch} "
                                    f"is missing from storage") from exc
            if table.num_rows != pc.rows:
                raise DeltaMismatch(f"delta for partition {pc.partition} batch {batch} has "
                                    f"{table.num_rows} rows, committer announced {pc.rows}")
        retention = spec.retention_ms if spec.windowed else None
        applied = held.store.apply(batch, watermark_ms, epoch, table, retention)
        if applied and batch - held.snapshot_batch >= self.snapshot_every:
            self._schedule_snapshot(k, held)
        return applied, caught_up

    # ---- snapshots --------------------------------------------------------------
    def _schedule_snapshot(self, k: Key, held: Held) -> None:
        with self._lock:
            if k in self._snapshotting:
                return
            self._snapshotting.add(k)
        held.snapshot_batch = held.store.meta.last_batch
        self._bg.submit(self._snapshot, k, held)

    def _snapshot(self, k: Key, held: Held) -> None:
        try:
            self._snapshots.take(held.store, *k)
            self._snapshots.prune(*k)
        except Exception as exc:  # the store moved away meanwhile, or storage failed
            log.warning("snapshot of %s failed: %s", k, exc)
        finally:
            with self._lock:
                self._snapshotting.discard(k)

    # ---- reads ------------------------------------------------------------------
    def lookup(self, job: str, operator: str, partition: int) -> Held | None:
        return self._held.get((job, operator, partition))

    def held(self) -> list[tuple[Key, Held]]:
        with self._lock:
            return sorted(self._held.items())
