from __future__ import annotations

from pathlib import Path

import pytest

from qstate.core.address import PartitionId
from qstate.core.records import paths
from qstate.core.records.catalog import (
    delta_batches,
    delta_files,
    manifest_batches,
    snapshot_batches,
)
from qstate.core.records.storage import Storage

P3 = PartitionId("j", "op", 3)


@pytest.fixture
def storage(tmp_path: Path) -> Storage:
    return Storage(str(tmp_path))


def test_empty_storage_has_no_batches(storage: Storage) -> None:
    assert manifest_batches(storage, "j", "op") == []
    assert delta_batches(storage, P3) == []
    assert snapshot_batches(storage, P3) == []


def test_manifest_batches_numeric_order_and_only_manifests(storage: Storage) -> None:
    for b in (100, 10, 9):
        storage.write_bytes(paths.manifest("j", "op", b), b"{}")
    d = paths.manifests_dir("j", "op")
    storage.write_bytes(f"{d}/notes.json", b"{}")
    storage.write_bytes(f"{d}/{paths.batch_name(5, '.arrow')}", b"")
    storage.write_bytes(f"{d}/.{paths.batch_name(6, paths.JSON)}", b"")  # hidden
    assert manifest_batches(storage, "j", "op") == [9, 10, 100]


def test_delta_batches_are_per_partition(storage: Storage) -> None:
    others = [PartitionId("j", "op", 4), PartitionId("j", "op2", 3), PartitionId("j2", "op", 3)]
    for b in (100, 9, 10):
        for fragment in (0, 3):  # two tasks wrote for the partition: one batch
            storage.write_bytes(paths.delta(P3, b, fragment), b"")
    for i, pid in enumerate(others):
        storage.write_bytes(paths.delta(pid, 50 + i, 0), b"")
    storage.write_bytes(f"{paths.deltas_dir(P3)}/{paths.batch_name(7, paths.JSON)}", b"")
    assert delta_batches(storage, P3) == [9, 10, 100]
    assert [delta_batches(storage, pid) for pid in others] == [[50], [51], [52]]
    assert sorted(delta_files(storage, P3)) == sorted(
        (b, paths.delta(P3, b, f)) for b in (9, 10, 100) for f in (0, 3))


def test_snapshot_batches_count_only_finished_snapshots(storage: Storage) -> None:
    # a snapshot's member files and shared SSTs come first, its .json last: without the
    # .json a snapshot is not there yet
    for b in (10, 9, 20):
        storage.write_bytes(f"{paths.snapshots_dir(P3)}/{paths.snapshot_member(b, 'CURRENT')}",
                            b"")
        storage.write_bytes(f"{paths.snapshots_dir(P3)}/{paths.sst_member('ab' * 20)}", b"")
    for b in (10, 9):
        storage.write_bytes(paths.snapshot(P3, b), b"{}")
    assert snapshot_batches(storage, P3) == [9, 10]
    assert snapshot_batches(storage, PartitionId("j", "op", 2)) == []
