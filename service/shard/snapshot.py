"""Partition snapshots on checkpoint storage: a RocksDB checkpoint, uploaded incrementally.

Where the files go is ``qstate.core.records.paths`` (snapshots_dir): SST files are
content-addressed, immutable, shared by snapshots and uploaded once; the small mutable
files go under the snapshot's batch; the snapshot's JSON is written last, so a snapshot is
whole or absent. Restore = the latest snapshot + the batch manifests after it
(docs/architecture.md §4).
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import threading
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

import orjson
from rocksdict import Checkpoint

from qstate.core.address import PartitionId
from qstate.core.errors import CorruptState
from qstate.core.records import paths
from qstate.core.records.catalog import delta_files, snapshot_batches
from qstate.core.records.savepoint import pins
from qstate.core.records.storage import Storage
from qstate.shard.held import Held
from qstate.shard.store import PartitionStore

__all__ = ["SnapshotInfo", "Snapshotter", "read_snapshot", "restore"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SnapshotInfo:
    batch: int
    watermark_ms: int
    files: dict[str, str]  # local file name -> storage path relative to snapshots_dir


def read_snapshot(storage: Storage, pid: PartitionId, batch: int) -> SnapshotInfo:
    """The snapshot's record; CorruptState naming it if any file it lists would land outside
    the restored folder or be read or deleted outside the partition's snapshots."""
    path = paths.snapshot(pid, batch)
    raw = orjson.loads(storage.read_bytes(path))
    files = raw["files"]
    if not isinstance(files, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise CorruptState(f"snapshot {path}: its file list is not names to paths")
    for name, rel in files.items():
        paths.plain_name(name, f"snapshot {path}: local file name")
        paths.plain_path(rel, f"snapshot {path}: stored file")
    return SnapshotInfo(raw["batch"], raw["watermark_ms"], files)


def _sha(path: Path) -> str:
    h = hashlib.sha1()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


class Snapshotter:
    """Takes, schedules and prunes snapshots of one server's partitions; remembers what it
    uploaded."""

    def __init__(self, storage: Storage, scratch: Path, every: int, keep: int,
                 pool: Executor) -> None:
        self.storage = storage
        self.scratch = scratch
        self.every = every
        self.keep = keep
        self._pool = pool
        self._uploaded: set[str] = set()  # storage paths of SSTs known to exist
        self._running: set[PartitionId] = set()
        self._lock = threading.Lock()

    def after_commit(self, pid: PartitionId, held: Held) -> None:
        """Snapshot in the background once ``every`` batches passed since the last one."""
        if held.store.meta.last_batch - held.snapshot_batch < self.every:
            return
        with self._lock:
            if pid in self._running:
                return
            self._running.add(pid)
        held.snapshot_batch = held.store.meta.last_batch
        self._pool.submit(self._take_and_prune, pid, held)

    def _take_and_prune(self, pid: PartitionId, held: Held) -> None:
        try:
            self.take(held.store, pid)
            self.prune(pid)
        except Exception as exc:  # the store moved away meanwhile, or storage failed
            log.warning("snapshot of %s failed: %s", pid, exc)
        finally:
            with self._lock:
                self._running.discard(pid)

    def take(self, store: PartitionStore, pid: PartitionId) -> int:
        """Snapshot ``store`` as of its last batch; returns that batch. Files already on
        storage (same content) are not sent again."""
        local = self.scratch / f"{pid.job}.{pid.operator}.{pid.partition}.ckpt"
        shutil.rmtree(local, ignore_errors=True)
        local.parent.mkdir(parents=True, exist_ok=True)
        with store.lock:  # a consistent cut: no batch is being applied
            Checkpoint(store.db).create_checkpoint(str(local))
            batch, watermark = store.meta.last_batch, store.meta.watermark_ms
        base = paths.snapshots_dir(pid)
        files: dict[str, str] = {}
        sent = 0
        for f in sorted(local.iterdir()):
            if f.suffix == ".sst":
                rel = paths.sst_member(_sha(f))
                with self._lock:
                    known = f"{base}/{rel}" in self._uploaded
                if not known and not self.storage.exists(f"{base}/{rel}"):
                    self.storage.write_bytes(f"{base}/{rel}", f.read_bytes())
                    sent += 1
                with self._lock:
                    self._uploaded.add(f"{base}/{rel}")
            else:
                rel = paths.snapshot_member(batch, f.name)
                self.storage.write_bytes(f"{base}/{rel}", f.read_bytes())
            files[f.name] = rel
        self.storage.write_bytes(paths.snapshot(pid, batch), orjson.dumps(
            {"batch": batch, "watermark_ms": watermark, "files": files}))
        shutil.rmtree(local, ignore_errors=True)
        log.info("snapshot %s at batch %d: %d files, %d new SSTs", pid, batch, len(files), sent)
        return batch

    def prune(self, pid: PartitionId) -> int | None:
        """Keep the newest ``keep`` snapshots and those a savepoint names; delete older ones,
        SSTs no kept snapshot uses, and (once there are ``keep``) delta files at or before
        the oldest of the newest ``keep`` that no savepoint needs (docs/architecture.md §4,
        savepoints). Returns that snapshot's batch."""
        snaps = snapshot_batches(self.storage, pid)
        if not snaps:
            return None
        pinned = pins(self.storage, pid.job, pid.operator)
        newest = snaps[-self.keep:]
        old = [b for b in snaps[:-self.keep] if not pinned.keeps_snapshot(pid.partition, b)]
        kept = [b for b in snaps if b not in old]
        base = paths.snapshots_dir(pid)
        used = set()
        for b in kept:
            used |= set(read_snapshot(self.storage, pid, b).files.values())
        for b in old:
            info = read_snapshot(self.storage, pid, b)
            self.storage.delete(paths.snapshot(pid, b))
            for rel in info.files.values():
                if rel not in used:
                    self.storage.delete(f"{base}/{rel}")
                    with self._lock:
                        self._uploaded.discard(f"{base}/{rel}")
        # deltas only once ``keep`` snapshots exist: until then the batches before the first
        # one stay replayable, so a follower a few batches behind it (one just made the owner,
        # docs/architecture.md §3, planned moves) replays them while it serves, where a
        # restore from the snapshot would answer RESTORING meanwhile
        if len(newest) >= self.keep:
            for b, path in delta_files(self.storage, pid):
                if b <= newest[0] and not pinned.keeps_batch(pid.partition, b):
                    self.storage.delete(path)
        return newest[0]


def restore(storage: Storage, pid: PartitionId, dest: Path,
            batch: int | None = None) -> SnapshotInfo | None:
    """Download the latest snapshot (or the newest at or before ``batch``) into ``dest``;
    None if there is none."""
    snaps = snapshot_batches(storage, pid)
    if batch is not None:
        snaps = [b for b in snaps if b <= batch]
    if not snaps:
        return None
    info = read_snapshot(storage, pid, snaps[-1])
    base = paths.snapshots_dir(pid)
    tmp = dest.with_name(dest.name + ".restoring")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name, rel in info.files.items():
        (tmp / name).write_bytes(storage.read_bytes(f"{base}/{rel}"))
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return info
