"""Reading savepoints on a shard server (docs/architecture.md §4, savepoints).

A savepoint partition is opened on the first read that names it: built in the background
in ``<server dir>/.savepoints`` from checkpoint storage (the snapshot the savepoint names,
then its deltas up to the savepoint's batch, as a restore does), reads answering RESTORING
meanwhile (a 503 with Retry-After, as a partition being restored), then read like a live
partition, as of that batch. The live partition is not touched. One idle for ``idle_s`` is
closed and its folder deleted at the next read of any savepoint; the shard deletes the
folder whole when it starts.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from qstate.core.address import PartitionId
from qstate.core.errors import InvalidRequest, NotFound
from qstate.core.records.operator import OperatorSpec
from qstate.core.records.savepoint import NO_SNAPSHOT, Savepoint, read_savepoint
from qstate.core.records.storage import Storage
from qstate.shard import snapshot
from qstate.shard.memory import MemoryBudget
from qstate.shard.recovery import replay
from qstate.shard.store import PartitionStore

__all__ = ["IDLE_S", "SavepointReads"]

log = logging.getLogger(__name__)

IDLE_S = 300.0
FOLDER = ".savepoints"  # a dot: not a job's folder (the shard's metrics scan skips it)


class SavepointReads:
    """The savepoint partitions this server has open, or is building."""

    def __init__(self, storage: Storage, server_dir: Path,
                 spec: Callable[[str, str], OperatorSpec], memory: MemoryBudget,
                 idle_s: float = IDLE_S) -> None:
        self.storage = storage
        self.root = server_dir / FOLDER
        self.spec = spec
        self.memory = memory
        self.idle_s = idle_s
        self._open: dict[tuple[str, PartitionId], tuple[PartitionStore, float]] = {}
        self._building: dict[tuple[str, PartitionId], Future[PartitionStore]] = {}
        self._lock = threading.Lock()
        # one build at a time, beside the reads and commits (a build is a restore)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="savepoint")
        shutil.rmtree(self.root, ignore_errors=True)  # left by a previous run

    def store(self, pid: PartitionId, name: str) -> PartitionStore | None:
        """The partition as of savepoint ``name`` of its job; None while it is being built
        (the read answers RESTORING: 503 and Retry-After). NotFound, Unavailable (an
        incomplete savepoint) or InvalidRequest naming why it cannot be read."""
        self.close_idle()
        key = (name, pid)
        with self._lock:
            hit = self._open.get(key)
            if hit is not None:
                self._open[key] = (hit[0], time.monotonic())
                return hit[0]
            building = self._building.get(key)
            if building is None:
                # a savepoint that cannot be read fails this read
                sp, spec = self._check(pid, name)
                self._building[key] = self._pool.submit(self._build, pid, sp, spec)
                return None
            if not building.done():
                return None
            del self._building[key]
        store = building.result()  # the build's error, once, to the read that finds it
        with self._lock:
            self._open[key] = (store, time.monotonic())
        return store

    def _check(self, pid: PartitionId, name: str) -> tuple[Savepoint, OperatorSpec]:
        sp = read_savepoint(self.storage, pid.job, name)
        cut = sp.operators.get(pid.operator)
        if cut is None:
            raise NotFound(f"savepoint {pid.job}@{name} has no operator {pid.operator!r} (it "
                           f"has {', '.join(sorted(sp.operators))})")
        spec = self.spec(pid.job, pid.operator)
        if cut.partitions != spec.partitions:
            raise InvalidRequest(
                f"savepoint {pid.job}@{name} has {cut.partitions} partitions of "
                f"{pid.operator} and the operator now {spec.partitions} (rescaled since): "
                "its keys are not where this read looks")
        return sp, cut.spec  # what its rows meant then

    def _build(self, pid: PartitionId, sp: Savepoint, spec: OperatorSpec) -> PartitionStore:
        t0 = time.perf_counter()
        dest = self.root / pid.job / sp.name / pid.operator / f"p{pid.partition:05d}"
        shutil.rmtree(dest, ignore_errors=True)
        start = sp.operators[pid.operator].snapshots.get(pid.partition, NO_SNAPSHOT)
        if start != NO_SNAPSHOT:
            snapshot.restore(self.storage, pid, dest, start)
        store = PartitionStore(dest, spec, memory=self.memory)
        try:
            replay(self.storage, pid, spec, store, range(store.meta.last_batch + 1,
                                                         sp.batch + 1), store.meta.epoch)
        except BaseException:
            store.close()
            raise
        log.info("savepoint %s@%s: %s opened at batch %d in %.2fs", pid.job, sp.name, pid,
                 sp.batch, time.perf_counter() - t0)
        return store

    def close_idle(self, now: float | None = None) -> int:
        """Close the savepoint partitions no read asked for in ``idle_s``; how many."""
        now = time.monotonic() if now is None else now
        with self._lock:
            idle = [k for k, (_, used) in self._open.items() if now - used > self.idle_s]
            stores = [self._open.pop(k)[0] for k in idle]
        for store in stores:
            with store.lock:
                store.close()
            shutil.rmtree(store.path, ignore_errors=True)
        return len(idle)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        for fut in self._building.values():
            if fut.done() and fut.exception() is None:
                fut.result().close()
        self.close_idle(float("inf"))
        shutil.rmtree(self.root, ignore_errors=True)
