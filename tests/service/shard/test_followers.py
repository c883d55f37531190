"""A follower copy on a shard server (qstate.shard.partitions, in-process): it brings itself
up to date from the batches recorded in storage, answers reads, takes no commits, and
becomes the owner without a restore; the owner it replaces drops its copy."""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pytest

from qstate.core.address import PartitionId
from qstate.core.errors import NotOwner
from qstate.core.records import delta as deltas
from qstate.core.records.assignment import Assignment, save_assignment
from qstate.core.records.catalog import delta_files, snapshot_batches
from qstate.core.records.manifest import BatchManifest, write_manifest
from qstate.core.records.operator import OperatorSpec, WindowSpec, save_spec
from qstate.core.records.storage import Storage
from qstate.shard.partitions import PartitionCommit, Partitions
from tests.helpers import wait_until

SPEC = OperatorSpec("f", "counts", "k", {"n": "long"}, partitions=1,
                    window=WindowSpec("tumbling", 60_000))
PID = PartitionId("f", "counts", 0)
KEYS = [f"key-{i}" for i in range(50)]


def record(storage: Storage, batch: int) -> None:
    """Batch ``batch`` written as a job's sink does: key i is i + batch in window 0 (a
    Spark-state value: each batch replaces it)."""
    t = pa.table({"key": KEYS, "start": [0] * len(KEYS), "end": [60_000] * len(KEYS),
                  "tag": pa.nulls(len(KEYS), pa.int64()),
                  "n": [i + batch for i in range(len(KEYS))]}).cast(deltas.delta_schema(SPEC))
    deltas.write_delta(storage, PID, batch, t, states=SPEC.states)  # as the job writes it
    write_manifest(storage, "f", "counts", BatchManifest(batch, batch, {0: {0: len(KEYS)}}))


def server(tmp_path: Path, storage: Storage, sid: str) -> Partitions:
    return Partitions(tmp_path / sid, storage, sid, snapshot_every=10**6)


def owner_and_follower(tmp_path: Path) -> tuple[Storage, Partitions, Partitions]:
    """Storage with the operator's spec and epoch 1: server a owns the partition, b
    follows it."""
    storage = Storage(str(tmp_path / "storage"))
    save_spec(storage, SPEC)
    save_assignment(storage, Assignment("f", 1, {"a": "h:1", "b": "h:2"}, {"counts": ["a"]},
                                        followers={"counts": [["b"]]}))
    return storage, server(tmp_path, storage, "a"), server(tmp_path, storage, "b")


def total(p: Partitions, key: str) -> int:
    held = p.lookup(PID)
    assert held is not None and held.ready.wait(30)
    _, [w] = held.store.read(key)
    [value] = w.values
    assert isinstance(value, int)
    return value


def test_a_follower_catches_up_takes_no_commit_and_is_promoted_without_restore(
        tmp_path: Path) -> None:
    storage, a, b = owner_and_follower(tmp_path)
    try:
        a.sync()
        b.sync()
        for batch in range(3):
            record(storage, batch)
            a.commit("f", "counts", batch, batch, 1, [PartitionCommit(0, (0,), len(KEYS))])
        follower = b.lookup(PID)
        assert follower is not None and not follower.owner
        with pytest.raises(NotOwner):  # a copy never takes a commit
            b.commit("f", "counts", 3, 3, 1, [PartitionCommit(0, (0,), len(KEYS))])
        follower.ready.wait(30)
        b.follow()  # the batches recorded since it came up
        assert follower.store.meta.last_batch == 2
        assert total(b, "key-7") == total(a, "key-7") == 7 + 2
        record(storage, 3)  # recorded; the owner has not committed it yet
        assert b.follow() == 1 and total(b, "key-7") == 7 + 3
        # hand-over: b owns it under epoch 2, a holds nothing
        save_assignment(storage, Assignment("f", 2, {"b": "h:2"}, {"counts": ["b"]}))
        a.sync()
        b.sync()
        assert a.lookup(PID) is None
        assert b.lookup(PID) is follower and follower.owner  # the same store: no restore
        record(storage, 4)
        res = b.commit("f", "counts", 4, 4, 2, [PartitionCommit(0, (0,), len(KEYS))])
        assert res.applied == [0] and res.caught_up == 0
        assert total(b, "key-7") == 7 + 4
    finally:
        a.close()
        b.close()


def test_a_commit_racing_the_hand_off_of_its_partition_is_retryable(tmp_path: Path) -> None:
    """The store of a partition being handed off closes while a Commit that found it owned
    is still applying: the answer is NotOwner (the committer asks the new owner), never an
    unexpected error that fails the job (seen in CI as DbClosedError during a drain)."""
    storage = Storage(str(tmp_path / "storage"))
    save_spec(storage, SPEC)
    save_assignment(storage, Assignment("f", 1, {"a": "h:1"}, {"counts": ["a"]}))
    a = server(tmp_path, storage, "a")
    try:
        a.sync()
        record(storage, 0)
        a.commit("f", "counts", 0, 0, 1, [PartitionCommit(0, (0,), len(KEYS))])
        held = a.lookup(PID)
        assert held is not None
        held.store.close()  # what a hand-off does to it, here between lookup and apply
        record(storage, 1)
        with pytest.raises(NotOwner, match="while batch 1 was committing"):
            a.commit("f", "counts", 1, 1, 1, [PartitionCommit(0, (0,), len(KEYS))])
        a._held.pop(PID)  # the rest of a hand-off: closed and forgotten
    finally:
        a.close()


def test_a_run_with_an_added_aggregate_is_applied_in_its_layout_by_owner_and_follower(
        tmp_path: Path) -> None:
    """The job restarted with an aggregate added (docs/upgrading.md): its new epoch comes
    before its first batch, and both the owner (at the commit) and a follower (following
    from storage, before its periodic sync) read the new spec first, so the added
    aggregate's values are kept; a server coming up later replays the older batches, whose
    deltas lack the column, as no value."""
    storage, a, b = owner_and_follower(tmp_path)
    c = server(tmp_path, storage, "c")
    try:
        a.sync()
        b.sync()
        for batch in range(2):
            record(storage, batch)
            a.commit("f", "counts", batch, batch, 1, [PartitionCommit(0, (0,), len(KEYS))])
        b.follow()
        added = OperatorSpec("f", "counts", "k", {"n": "long", "m": "long"}, partitions=1,
                             window=SPEC.window)
        save_spec(storage, added)  # the restarted run's
        save_assignment(storage, Assignment("f", 2, {"a": "h:1", "b": "h:2", "c": "h:3"},
                                            {"counts": ["a"]},
                                            followers={"counts": [["b"]]}))
        t = pa.table({"key": KEYS, "start": [0] * len(KEYS), "end": [60_000] * len(KEYS),
                      "tag": pa.nulls(len(KEYS), pa.int64()), "n": list(range(len(KEYS))),
                      "m": [10 * i for i in range(len(KEYS))]}).cast(deltas.delta_schema(added))
        deltas.write_delta(storage, PID, 2, t, states=added.states)
        write_manifest(storage, "f", "counts", BatchManifest(2, 2, {0: {0: len(KEYS)}}))
        assert b.follow() == 1  # no sync of b since epoch 2 was written
        a.commit("f", "counts", 2, 2, 2, [PartitionCommit(0, (0,), len(KEYS))])
        for p in (a, b):
            held = p.lookup(PID)
            assert held is not None
            assert [w.values for w in held.store.read("key-7")[1]] == [[7, 70]]
        save_assignment(storage, Assignment("f", 3, {"c": "h:3"}, {"counts": ["c"]}))
        c.sync()  # comes up from batches 0-2: the first two without the column
        held = c.lookup(PID)
        assert held is not None and held.ready.wait(30)
        assert [w.values for w in held.store.read("key-7")[1]] == [[7, 70]]
    finally:
        a.close()
        b.close()
        c.close()


def test_a_follower_behind_the_first_snapshot_takes_over_serving_without_a_restore(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The owner's first snapshot (QSTATE_SNAPSHOTS_KEPT 2) keeps the deltas before it, so a
    follower that had not followed them yet when it took over replays them while it serves,
    never restored (a restore answers RESTORING: the 503s of the soak's partition doubling,
    docs/architecture.md §3)."""
    storage = Storage(str(tmp_path / "storage"))
    save_spec(storage, SPEC)
    save_assignment(storage, Assignment("f", 1, {"a": "h:1", "b": "h:2"}, {"counts": ["a"]},
                                        followers={"counts": [["b"]]}))
    a = Partitions(tmp_path / "a", storage, "a", snapshot_every=3, snapshots_kept=2)
    b = Partitions(tmp_path / "b", storage, "b", snapshot_every=3, snapshots_kept=2)
    try:
        a.sync()
        b.sync()
        follower = b.lookup(PID)
        assert follower is not None and follower.ready.wait(30)
        for batch in range(3):
            record(storage, batch)
            a.commit("f", "counts", batch, batch, 1, [PartitionCommit(0, (0,), len(KEYS))])
            if batch == 0:
                b.follow()  # then it falls behind
        wait_until(lambda: snapshot_batches(storage, PID) == [2], 30, "a's first snapshot")
        assert follower.store.meta.last_batch == 0
        assert [bt for bt, _ in delta_files(storage, PID)] == [0, 1, 2]  # kept: one snapshot
        save_assignment(storage, Assignment("f", 2, {"b": "h:2"}, {"counts": ["b"]}))
        a.sync()
        b.sync()
        record(storage, 3)
        with caplog.at_level(logging.WARNING, logger="qstate.shard.recovery"):
            res = b.commit("f", "counts", 3, 3, 2, [PartitionCommit(0, (0,), len(KEYS))])
        assert res.applied == [0] and res.caught_up == 2  # batches 1 and 2, from deltas
        assert "restored from snapshot" not in caplog.text
        assert follower.ready.is_set() and total(b, "key-7") == 7 + 3
    finally:
        a.close()
        b.close()
