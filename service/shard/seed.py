"""A job's state begun from a savepoint: a fork's, or a rolled-back job's
(docs/architecture.md §4, forks and rollbacks).

Each partition of each operator of the job is built as of the savepoint, as a savepoint
read builds it (the snapshot the savepoint names, then its deltas up to its batch), or
empty for an operator the savepoint does not have, relabelled as batch ``batch`` of the
job, and uploaded as the job's snapshot at that batch. No manifest names ``batch``: a shard
that holds the partition at any earlier batch cannot replay across it and restores that
snapshot instead, so whatever a shard held before is replaced, never added to.

A rollback (the savepoint is the job's own) then deletes the abandoned batches, those after
the savepoint's and before ``batch``: their manifests, deltas and snapshots.
"""

from __future__ import annotations

import logging
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from qstate.core.address import PartitionId
from qstate.core.records import paths
from qstate.core.records.catalog import delta_files, manifest_batches, snapshot_batches
from qstate.core.records.operator import OperatorSpec
from qstate.core.records.savepoint import NO_SNAPSHOT, Savepoint
from qstate.core.records.storage import Storage
from qstate.shard import snapshot
from qstate.shard.memory import process_budget
from qstate.shard.recovery import replay
from qstate.shard.store import PartitionStore

__all__ = ["abandon", "seed"]

log = logging.getLogger(__name__)


def seed(storage: Storage, sp: Savepoint, job: str, specs: list[OperatorSpec], batch: int,
         scratch: Path) -> None:
    """Write ``job``'s snapshot at ``batch`` of every partition of ``specs``: the state of
    savepoint ``sp`` (of this job or another), empty for an operator it does not have; for
    a rollback (``sp`` is ``job``'s), then delete the batches between them.
    ``scratch`` is a local folder for the build, emptied afterwards. Run again after an
    interruption, it does the same."""
    shutil.rmtree(scratch, ignore_errors=True)
    with ThreadPoolExecutor(1) as unused:  # takes run here, not in a pool
        snaps = snapshot.Snapshotter(storage, scratch / ".upload", 1, 1, unused)
        for spec in specs:
            t0 = time.perf_counter()
            cut = sp.operators.get(spec.operator)
            for p in range(spec.partitions):
                dest = scratch / f"{spec.operator}.{p:05d}"
                src = PartitionId(sp.job, spec.operator, p)
                if cut is not None:
                    start = cut.snapshots.get(p, NO_SNAPSHOT)
                    if start != NO_SNAPSHOT:
                        snapshot.restore(storage, src, dest, start)
                store = PartitionStore(dest, cut.spec if cut else spec,
                                       memory=process_budget())
                try:
                    if cut is not None:
                        replay(storage, src, cut.spec, store,
                               range(store.meta.last_batch + 1, sp.batch + 1),
                               store.meta.epoch)
                    store.relabel(batch, sp.watermark_ms)
                    snaps.take(store, PartitionId(job, spec.operator, p))
                finally:
                    store.close()
                shutil.rmtree(dest, ignore_errors=True)
            log.warning("%s/%s: %d partitions %s at batch %d in %.1fs", job, spec.operator,
                        spec.partitions,
                        f"from {sp.job}@{sp.name}" if cut else "empty", batch,
                        time.perf_counter() - t0)
    shutil.rmtree(scratch, ignore_errors=True)
    if sp.job == job:
        for spec in specs:
            abandon(storage, spec, sp.batch, batch)


def abandon(storage: Storage, spec: OperatorSpec, after: int, before: int) -> None:
    """Delete what ``spec``'s operator recorded for the batches after ``after`` and before
    ``before``: manifests first (no shard replays them from then on), then deltas, then
    snapshots (each record before its files) and the SSTs no kept snapshot uses."""
    def gone(b: int) -> bool:
        return after < b < before

    for b in manifest_batches(storage, spec.job, spec.operator):
        if gone(b):
            storage.delete(paths.manifest(spec.job, spec.operator, b))
    for p in range(spec.partitions):
        pid = PartitionId(spec.job, spec.operator, p)
        for b, path in delta_files(storage, pid):
            if gone(b):
                storage.delete(path)
        snaps = snapshot_batches(storage, pid)
        infos = {b: snapshot.read_snapshot(storage, pid, b) for b in snaps}
        used = {rel for b, info in infos.items() if not gone(b) for rel in info.files.values()}
        base = paths.snapshots_dir(pid)
        for b in filter(gone, snaps):
            storage.delete(paths.snapshot(pid, b))
            for rel in set(infos[b].files.values()) - used:
                storage.delete(f"{base}/{rel}")
