"""Which batches checkpoint storage holds, per operator and partition: manifests, delta
files, snapshots (their paths are ``qstate.core.records.paths``)."""

from __future__ import annotations

from qstate.core.address import PartitionId
from qstate.core.records import paths
from qstate.core.records.storage import Storage

__all__ = ["delta_batches", "delta_files", "manifest_batches", "snapshot_batches"]


def manifest_batches(storage: Storage, job: str, operator: str) -> list[int]:
    return paths.batches(storage.list_names(paths.manifests_dir(job, operator)), paths.JSON)


def delta_batches(storage: Storage, pid: PartitionId) -> list[int]:
    """Batches with delta fragments for ``pid``, each once."""
    return sorted(set(paths.batches(storage.list_names(paths.deltas_dir(pid)), paths.ARROW)))


def delta_files(storage: Storage, pid: PartitionId) -> list[tuple[int, str]]:
    """(batch, path) of every delta fragment of ``pid``."""
    d = paths.deltas_dir(pid)
    return [(b, f"{d}/{n}") for n in storage.list_names(d)
            if n.endswith(paths.ARROW) and (b := paths.batch_of(n)) is not None]


def snapshot_batches(storage: Storage, pid: PartitionId) -> list[int]:
    return paths.batches(storage.list_names(paths.snapshots_dir(pid)), paths.JSON)
