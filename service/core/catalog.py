"""Which batches checkpoint storage holds, per operator and partition: manifests, delta
files, snapshots (their paths are ``service.core.paths``)."""

from __future__ import annotations

from service.core import paths
from service.core.address import PartitionId
from service.core.storage import Storage

__all__ = ["delta_batches", "manifest_batches", "snapshot_batches"]


def manifest_batches(storage: Storage, job: str, operator: str) -> list[int]:
    return paths.batches(storage.list_names(paths.manifests_dir(job, operator)), paths.JSON)


def delta_batches(storage: Storage, pid: PartitionId) -> list[int]:
    return paths.batches(storage.list_names(paths.deltas_dir(pid)), paths.ARROW)


def snapshot_batches(storage: Storage, pid: PartitionId) -> list[int]:
    return paths.batches(storage.list_names(paths.snapshots_dir(pid)), paths.JSON)
