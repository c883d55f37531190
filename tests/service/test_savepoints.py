"""Savepoints in checkpoint storage (``qstate.core.records.savepoint``): made at the newest batch
every operator has, from the snapshots and deltas already there; kept from retention (the shards'
snapshot pruning, the job's manifest collection) until deleted; whole or absent when the
process making one is killed -9 (a real ``qstate savepoint create`` process)."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest

from qstate.core.address import PartitionId
from qstate.core.errors import CorruptState, InvalidRequest, NotFound, Unavailable
from qstate.core.records import paths
from qstate.core.records.catalog import delta_batches, manifest_batches, snapshot_batches
from qstate.core.records.manifest import BatchManifest, write_manifest
from qstate.core.records.operator import OperatorSpec, WindowSpec, save_spec
from qstate.core.records.savepoint import (
    NO_SNAPSHOT,
    create,
    delete,
    list_savepoints,
    pins,
    read_savepoint,
)
from qstate.core.records.storage import Storage
from qstate.exit_codes import Exit
from qstate.jobs.runtime.commit import Committer
from qstate.shard.snapshot import Snapshotter

JOB = "shop"
OPS = ("views", "buyers")
P = 2
LAST = 9  # batches 0..9 of every operator
SNAPSHOTS = (3, 6)  # partition 0 of each operator; partition 1 has none


def spec(op: str) -> OperatorSpec:
    return OperatorSpec(JOB, op, "k", {"n": "long"}, partitions=P,
                        window=WindowSpec("tumbling", 10, 10))


def offsets(batch: int) -> dict[str, dict[int, int]]:
    return {"events": {0: 100 * (batch + 1), 1: 50 * (batch + 1)}}


def snapshot(storage: Storage, pid: PartitionId, batch: int) -> None:
    """A snapshot as ``Snapshotter.take`` writes it: a shared SST and a file of its own."""
    base = paths.snapshots_dir(pid)
    storage.write_bytes(f"{base}/{paths.sst_member(f'{batch:040x}')}", b"sst")
    storage.write_bytes(f"{base}/{paths.snapshot_member(batch, 'CURRENT')}", b"current")
    storage.write_bytes(paths.snapshot(pid, batch), orjson.dumps({
        "batch": batch, "watermark_ms": batch * 10,
        "files": {"000001.sst": paths.sst_member(f"{batch:040x}"),
                  "CURRENT": paths.snapshot_member(batch, "CURRENT")}}))


def write_batch(storage: Storage, op: str, batch: int) -> None:
    for p in range(P):
        storage.write_bytes(paths.delta(PartitionId(JOB, op, p), batch, 0), b"delta")
    write_manifest(storage, JOB, op, BatchManifest(
        batch, batch * 10, {p: {0: 1} for p in range(P)}, offsets(batch)))


@pytest.fixture
def storage(tmp_path: Path) -> Storage:
    st = Storage(str(tmp_path / "storage"))
    for op in OPS:
        save_spec(st, spec(op))
        for b in range(LAST + 1):
            write_batch(st, op, b)
        for b in SNAPSHOTS:
            snapshot(st, PartitionId(JOB, op, 0), b)
    return st


def prune(storage: Storage, tmp_path: Path, pid: PartitionId, keep: int = 1) -> None:
    with ThreadPoolExecutor(1) as pool:
        Snapshotter(storage, tmp_path / "scratch", 1, keep, pool).prune(pid)


def test_a_savepoint_names_each_partitions_snapshot_and_the_batchs_offsets(
        storage: Storage) -> None:
    write_manifest(storage, JOB, "views", BatchManifest(LAST + 1, 0, {}, offsets(LAST + 1)))
    sp = create(storage, JOB, "before-v2", now_ms=1_700_000_000_000)
    # batch 10 exists for views only: the newest batch of every operator is 9
    assert sp.batch == LAST and sp.offsets == offsets(LAST) and sp.complete
    assert {op: (c.spec, c.watermark_ms, c.snapshots) for op, c in sp.operators.items()} \
        == {op: (spec(op), LAST * 10, {0: SNAPSHOTS[-1], 1: NO_SNAPSHOT}) for op in OPS}
    assert read_savepoint(storage, JOB, "before-v2") == sp
    assert list_savepoints(storage, JOB) == [sp]
    assert storage.list_names(paths.savepoints_dir(JOB)) == ["before-v2.json"]  # no pending
    with pytest.raises(InvalidRequest, match="already has a savepoint 'before-v2'"):
        create(storage, JOB, "before-v2")
    default = create(storage, JOB, now_ms=1_795_687_200_000)
    assert default.name == "20261126T100000Z"


def test_names_and_jobs_that_are_not_refused_with_what_to_do(storage: Storage) -> None:
    for bad in ("../x", "a/b", "", "x.pending", "-x"):
        with pytest.raises(InvalidRequest):
            create(storage, JOB, bad)
    with pytest.raises(NotFound, match="job 'nojob' has no operator"):
        create(storage, "nojob", "x")
    create(storage, JOB, "one")
    with pytest.raises(NotFound, match="no savepoint 'two' of job 'shop'; it has 'one'"):
        read_savepoint(storage, JOB, "two")
    assert delete(storage, JOB, "one") and not delete(storage, JOB, "one")
    assert list_savepoints(storage, JOB) == []


def test_retention_keeps_what_a_savepoint_needs_until_it_is_deleted(
        storage: Storage, tmp_path: Path) -> None:
    # a savepoint at batch 4: partition 0 starts from snapshot 3 and replays batch 4;
    # partition 1 (no snapshot) replays batches 0..4
    for op in OPS:
        for b in range(5, LAST + 1):
            storage.delete(paths.manifest(JOB, op, b))
    create(storage, JOB, "at-4")
    for op in OPS:
        for b in range(5, LAST + 1):
            write_batch(storage, op, b)
    views0, views1 = PartitionId(JOB, "views", 0), PartitionId(JOB, "views", 1)
    snapshot(storage, views1, 8)
    for pid in (views0, views1):
        prune(storage, tmp_path, pid)
    # without the savepoint, keep=1 would leave snapshot 6 (8 for p1) and the deltas after it
    assert snapshot_batches(storage, views0) == [3, 6]
    assert delta_batches(storage, views0) == [4, 7, 8, 9]
    assert storage.exists(f"{paths.snapshots_dir(views0)}/{paths.sst_member(f'{3:040x}')}")
    assert snapshot_batches(storage, views1) == [8]
    assert delta_batches(storage, views1) == [0, 1, 2, 3, 4, 9]
    spec_views = spec("views")
    committer = Committer(SimpleNamespace(storage=storage))  # type: ignore[arg-type]
    committer.collect_manifests(spec_views)  # partition 1 replays from batch 0: all kept
    assert manifest_batches(storage, JOB, "views") == list(range(LAST + 1))

    assert delete(storage, JOB, "at-4")
    for pid in (views0, views1):
        prune(storage, tmp_path, pid)
    assert snapshot_batches(storage, views0) == [6]
    assert delta_batches(storage, views0) == [7, 8, 9]
    assert not storage.exists(f"{paths.snapshots_dir(views0)}/{paths.sst_member(f'{3:040x}')}")
    assert delta_batches(storage, views1) == [9]
    committer.collect_manifests(spec_views)
    assert manifest_batches(storage, JOB, "views") == [7, 8, 9]


def test_an_unreadable_savepoint_record_keeps_everything(storage: Storage,
                                                         tmp_path: Path) -> None:
    bad = f"{paths.savepoints_dir(JOB)}/crafted.json"
    storage.write_bytes(bad, orjson.dumps({"job": JOB, "name": "../../x", "batch": 1}))
    pid = PartitionId(JOB, "views", 0)
    prune(storage, tmp_path, pid)
    assert snapshot_batches(storage, pid) == list(SNAPSHOTS)
    assert delta_batches(storage, pid) == list(range(LAST + 1))
    with pytest.raises(CorruptState, match=f"savepoint {bad} is not a savepoint record"):
        list_savepoints(storage, JOB)


def test_a_savepoint_whose_files_were_pruned_meanwhile_is_cut_again(storage: Storage) -> None:
    """Retention may delete a snapshot after the cut chose it and before the pending record
    kept it: the check finds it gone and the savepoint is cut again, from what is there."""
    real_create = Storage.create
    pid = PartitionId(JOB, "views", 0)

    def create_then_prune(self: Storage, path: str, data: bytes) -> bool:
        done = real_create(self, path, data)
        self.delete(paths.snapshot(pid, SNAPSHOTS[-1]))  # a shard pruned it just now
        return done

    storage.create = create_then_prune.__get__(storage)  # type: ignore[method-assign]
    sp = create(storage, JOB, "racing")
    assert sp.operators["views"].snapshots == {0: SNAPSHOTS[0], 1: NO_SNAPSHOT}
    assert sp.operators["buyers"].snapshots == {0: SNAPSHOTS[-1], 1: NO_SNAPSHOT}
    assert storage.list_names(paths.savepoints_dir(JOB)) == ["racing.json"]  # not pending


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "qstate", "savepoint", *args],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def test_killed_while_making_it_the_savepoint_is_absent_and_says_so(storage: Storage) -> None:
    at = ["--storage", storage.root]
    r = run("create", JOB, "--name", "crash", *at,
            env={"QSTATE_FAULT": f"savepoint.after-pending@{LAST}"})
    assert r.returncode == -9, r.stderr  # SIGKILL, as kill -9
    r = run("list", JOB, *at)
    assert r.returncode == 0 and "crash\tbatch 9" in r.stdout and \
        "incomplete (its making was interrupted)" in r.stdout, r.stdout
    with pytest.raises(Unavailable, match="savepoint shop@crash is incomplete"):
        read_savepoint(storage, JOB, "crash")
    assert pins(storage, JOB, "views").keeps_batch(1, 0)  # it keeps its files meanwhile
    r = run("create", JOB, "--name", "crash", *at)
    assert r.returncode == Exit.BAD_REQUEST and "already has a savepoint" in r.stderr
    r = run("delete", JOB, "crash", *at)
    assert r.returncode == 0 and "deleted savepoint shop@crash" in r.stdout
    r = run("create", JOB, "--name", "crash", *at)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (f"savepoint shop@crash at batch {LAST} (2 operators, offsets "
                                f"events:0={100 * (LAST + 1)},1={50 * (LAST + 1)})")
    assert read_savepoint(storage, JOB, "crash").complete
    r = run("delete", JOB, "nope", *at)
    assert r.returncode == Exit.NOT_FOUND and "has no savepoint 'nope'" in r.stderr


def test_a_topic_name_kafka_allows_is_kept_as_the_manifest_has_it(storage: Storage) -> None:
    """Kafka topic names run to 249 characters, past a state name's 64: the savepoint keeps
    the offsets as the manifest holds them, and reads them back."""
    topic = "t" * 200
    for op in OPS:
        write_manifest(storage, JOB, op, BatchManifest(LAST + 1, 0, {}, {topic: {0: 7}}))
    sp = create(storage, JOB, "long-topic")
    assert read_savepoint(storage, JOB, "long-topic").offsets == {topic: {0: 7}} == sp.offsets
