"""Partition snapshots on checkpoint storage: a RocksDB checkpoint, uploaded incrementally.

``jobs/{job}/{op}/snapshots/{p}/sst/{sha}.sst``   SST files, content-addressed: immutable,
                                                  shared by snapshots, uploaded once
``jobs/{job}/{op}/snapshots/{p}/{N}/<name>``       the small mutable files (MANIFEST, ...)
``jobs/{job}/{op}/snapshots/{p}/{N}.json``         the snapshot: batch, watermark, file map;
                                                  written last, so a snapshot is whole or absent
Restore = the latest snapshot + the batch manifests after it (DESIGN §4).
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

import orjson
from rocksdict import Checkpoint

from service.shard.store import PartitionStore
from service.storage import Storage

log = logging.getLogger("qstate.snapshot")


@dataclass(frozen=True)
class SnapshotInfo:
    batch: int
    watermark_ms: int
    files: dict[str, str]  # local file name -> storage path relative to the partition dir


def snap_dir(storage: Storage, job: str, operator: str, partition: int) -> str:
    return storage.path("jobs", job, operator, "snapshots", f"{partition:05d}")


def list_snapshots(storage: Storage, job: str, operator: str, partition: int) -> list[int]:
    return [int(n.split(".", 1)[0]) for n in storage.list_names(
        snap_dir(storage, job, operator, partition)) if n.endswith(".json")]


def read_snapshot(storage: Storage, job: str, operator: str, partition: int,
                  batch: int) -> SnapshotInfo:
    raw = orjson.loads(storage.read_bytes(
        f"{snap_dir(storage, job, operator, partition)}/{batch:020d}.json"))
    return SnapshotInfo(raw["batch"], raw["watermark_ms"], raw["files"])


def _sha(path: Path) -> str:
    h = hashlib.sha1()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


class Snapshotter:
    """Takes and prunes snapshots of one server's partitions; remembers what it uploaded."""

    def __init__(self, storage: Storage, scratch: Path, keep: int = 2) -> None:
        self.storage = storage
        self.scratch = scratch
        self.keep = keep
        self._uploaded: set[str] = set()  # storage paths of SSTs known to exist
        self._lock = threading.Lock()

    def take(self, store: PartitionStore, job: str, operator: str, partition: int) -> int:
        """Snapshot ``store`` as of its last batch; returns that batch. Files already on
        storage (same content) are not sent again."""
        local = self.scratch / f"{job}.{operator}.{partition}.ckpt"
        shutil.rmtree(local, ignore_errors=True)
        local.parent.mkdir(parents=True, exist_ok=True)
        with store.lock:  # a consistent cut: no batch is being applied
            Checkpoint(store.db).create_checkpoint(str(local))
            batch, watermark = store.meta.last_batch, store.meta.watermark_ms
        base = snap_dir(self.storage, job, operator, partition)
        files: dict[str, str] = {}
        sent = 0
        for f in sorted(local.iterdir()):
            if f.suffix == ".sst":
                rel = f"sst/{_sha(f)}.sst"
                with self._lock:
                    known = f"{base}/{rel}" in self._uploaded
                if not known and not self.storage.exists(f"{base}/{rel}"):
                    self.storage.write_bytes(f"{base}/{rel}", f.read_bytes())
                    sent += 1
                with self._lock:
                    self._uploaded.add(f"{base}/{rel}")
            else:
                rel = f"{batch:020d}/{f.name}"
                self.storage.write_bytes(f"{base}/{rel}", f.read_bytes())
            files[f.name] = rel
        self.storage.write_bytes(f"{base}/{batch:020d}.json", orjson.dumps(
            {"batch": batch, "watermark_ms": watermark, "files": files}))
        shutil.rmtree(local, ignore_errors=True)
        log.info("snapshot %s/%s/%d at batch %d: %d files, %d new SSTs", job, operator,
                 partition, batch, len(files), sent)
        return batch

    def prune(self, job: str, operator: str, partition: int) -> int | None:
        """Keep the newest ``keep`` snapshots; delete older ones, SSTs no kept snapshot uses,
        and delta files at or before the oldest kept snapshot. Returns that snapshot's batch."""
        from service import delta as deltas

        snaps = list_snapshots(self.storage, job, operator, partition)
        if not snaps:
            return None
        kept, old = snaps[-self.keep:], snaps[:-self.keep]
        base = snap_dir(self.storage, job, operator, partition)
        used = set()
        for b in kept:
            used |= set(read_snapshot(self.storage, job, operator, partition, b).files.values())
        for b in old:
            info = read_snapshot(self.storage, job, operator, partition, b)
            self.storage.delete(f"{base}/{b:020d}.json")
            for rel in info.files.values():
                if rel not in used:
                    self.storage.delete(f"{base}/{rel}")
                    with self._lock:
                        self._uploaded.discard(f"{base}/{rel}")
        for b in deltas.delta_batches(self.storage, job, operator, partition):
            if b <= kept[0]:
                self.storage.delete(f"{deltas.delta_dir(self.storage, job, operator, partition)}"
                                    f"/{deltas.delta_name(b)}")
        return kept[0]


def restore(storage: Storage, job: str, operator: str, partition: int, dest: Path,
            batch: int | None = None) -> SnapshotInfo | None:
    """Download the latest snapshot (or the one at ``batch``) into ``dest``; None if none."""
    snaps = list_snapshots(storage, job, operator, partition)
    if batch is not None:
        snaps = [b for b in snaps if b <= batch]
    if not snaps:
        return None
    info = read_snapshot(storage, job, operator, partition, snaps[-1])
    base = snap_dir(storage, job, operator, partition)
    tmp = dest.with_name(dest.name + ".restoring")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name, rel in info.files.items():
        (tmp / name).write_bytes(storage.read_bytes(f"{base}/{rel}"))
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return info
