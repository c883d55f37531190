"""Where a job begun from a savepoint numbers its batches (``qstate.jobs.runtime.origin``), and
what a rollback deletes (``qstate.shard.seed.abandon``): on checkpoint storage as the savepoint
tests lay it out, the state's build itself stood in for by a recorder (the end-to-end test
with Spark and real shards is ``test_fork_rollback``)."""

from __future__ import annotations

import math
import re
import time
from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from qstate.core.address import PartitionId
from qstate.core.errors import InvalidRequest
from qstate.core.records import paths
from qstate.core.records.catalog import delta_batches, manifest_batches, snapshot_batches
from qstate.core.records.manifest import BatchManifest, write_manifest
from qstate.core.records.operator import OperatorSpec, save_spec
from qstate.core.records.savepoint import Savepoint, create
from qstate.core.records.storage import Storage
from qstate.jobs.runtime.origin import Origin, begin, read_origin
from qstate.shard.seed import abandon
from tests.service.test_savepoints import JOB, LAST, OPS, SNAPSHOTS, snapshot, spec, write_batch
from tests.service.test_savepoints import storage as storage

Call = tuple[str, int, tuple[str, ...]]


class Recorder:
    """Stands in for ``qstate.shard.seed.seed``: what it was asked to write."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[Call] = []
        self.fail = fail

    def __call__(self, storage: Storage, sp: Savepoint, job: str, specs: list[OperatorSpec],
                 batch: int, scratch: Path) -> None:
        self.calls.append((job, batch, tuple(s.operator for s in specs)))
        if self.fail:
            raise OSError("disk full")


def specs(job: str) -> list[OperatorSpec]:
    return [replace(spec(op), job=job) for op in OPS]


def test_a_fork_begins_after_the_savepoints_batch_and_a_restart_goes_on(
        storage: Storage, tmp_path: Path) -> None:
    sp = create(storage, JOB, "before-v2")
    seed = Recorder()
    ckpt = tmp_path / "v2"
    got = begin(storage, ckpt, "shop2", specs("shop2"), sp, seed, ["merged"])
    assert got == Origin(LAST + 1, LAST * 10, "shop@before-v2")
    assert seed.calls == [("shop2", LAST, OPS)]
    assert read_origin(ckpt) == got
    assert (got.batch(0), got.watermark(0), got.watermark(LAST * 10 + 5)) == (
        LAST + 1, LAST * 10, LAST * 10 + 5)
    # the same command again (a restart): the checkpoint goes on, nothing is written
    (ckpt / "merged").mkdir()
    assert begin(storage, ckpt, "shop2", specs("shop2"), sp, seed, ["merged"]) == got
    assert begin(storage, ckpt, "shop2", specs("shop2"), None, seed, ["merged"]) == got
    assert len(seed.calls) == 1


def test_a_rollback_writes_past_every_batch_and_keeps_the_old_checkpoint_aside(
        storage: Storage, tmp_path: Path) -> None:
    sp = create(storage, JOB, "good")
    for b in range(LAST + 1, LAST + 4):  # batches after the savepoint
        for op in OPS:
            write_batch(storage, op, b)
    snapshot(storage, PartitionId(JOB, "views", 1), LAST + 5)  # an earlier rollback's state
    ckpt = tmp_path / "shop"
    (ckpt / "merged" / "offsets").mkdir(parents=True)
    seed = Recorder()
    got = begin(storage, ckpt, JOB, specs(JOB), sp, seed, ["merged"])
    assert seed.calls == [(JOB, LAST + 6, OPS)] and got.base == LAST + 7
    assert not (ckpt / "merged").exists()
    assert (ckpt / f"merged.before-shop.good-{LAST + 6}" / "offsets").is_dir()


def test_an_interrupted_begin_is_taken_up_again_at_the_same_batch(
        storage: Storage, tmp_path: Path) -> None:
    sp = create(storage, JOB, "good")
    write_batch(storage, "views", LAST + 1)
    ckpt = tmp_path / "shop"
    with pytest.raises(OSError):
        begin(storage, ckpt, JOB, specs(JOB), sp, Recorder(fail=True), ["merged"])
    # one past the newest batch of views, the savepoint's (LAST) being older
    assert read_origin(ckpt) == Origin(LAST + 3, LAST * 10, "shop@good", complete=False)
    with pytest.raises(InvalidRequest, match="run it again with --from-savepoint shop@good"):
        begin(storage, ckpt, JOB, specs(JOB), None, Recorder(), ["merged"])
    other = create(storage, JOB, "other")
    with pytest.raises(InvalidRequest, match="is being started from savepoint shop@good"):
        begin(storage, ckpt, JOB, specs(JOB), other, Recorder(), ["merged"])
    write_batch(storage, "views", LAST + 2)  # whatever storage holds now: the chosen batch
    seed = Recorder()
    assert begin(storage, ckpt, JOB, specs(JOB), sp, seed, ["merged"]).complete
    assert seed.calls == [(JOB, LAST + 2, OPS)]


def test_what_a_savepoint_cannot_begin_is_refused_naming_it(
        storage: Storage, tmp_path: Path) -> None:
    sp = create(storage, JOB, "good")
    seed = Recorder()

    def refused(job: str, ops: list[OperatorSpec], match: str) -> None:
        with pytest.raises(InvalidRequest, match=match):
            begin(storage, tmp_path / job, job, ops, sp, seed, ["merged"])

    changed = [replace(s, key="other") if s.operator == "views" else s for s in specs("v2")]
    refused("v2", changed, r"v2/views cannot begin from savepoint shop@good: its key changed "
                           r"\(k -> other\)")
    refused("v2", [replace(s, partitions=4) for s in specs("v2")],
            "has 4 partitions and savepoint shop@good 2: start it with --partitions 2")
    save_spec(storage, specs("taken")[0])
    write_manifest(storage, "taken", "views", BatchManifest(0, 0, {}, {}))
    refused("taken", specs("taken"), "job 'taken' already has state \\(views\\): a fork begins a "
                                     "new job")
    write_batch(storage, "views", LAST + 1)
    write_batch(storage, "buyers", LAST + 1)
    create(storage, JOB, "later")
    refused(JOB, specs(JOB), "has savepoints after good .*: later. A rollback deletes")
    assert seed.calls == []
    # an added operator is not refused: it begins empty
    added = [*specs("v3"), replace(spec("views"), job="v3", operator="new", key="z")]
    begin(storage, tmp_path / "v3", "v3", added, sp, seed, ["merged"])
    assert seed.calls == [("v3", LAST, (*OPS, "new"))]


def test_a_rollback_deletes_the_abandoned_batches_and_only_those(storage: Storage) -> None:
    pid = PartitionId(JOB, "views", 0)
    snapshot(storage, pid, 8)
    abandon(storage, spec("views"), after=4, before=LAST + 3)
    assert manifest_batches(storage, JOB, "views") == [0, 1, 2, 3, 4]
    assert manifest_batches(storage, JOB, "buyers") == list(range(LAST + 1))  # not its
    assert delta_batches(storage, pid) == [0, 1, 2, 3, 4]
    assert snapshot_batches(storage, pid) == [SNAPSHOTS[0]]
    base = paths.snapshots_dir(pid)
    left = {f"{base}/{paths.sst_member(f'{b:040x}')}" for b in (SNAPSHOTS[0], 6, 8)}
    assert [storage.exists(p) for p in sorted(left)] == [True, False, False]


def test_a_checkpoint_that_did_not_write_the_state_is_refused(
        storage: Storage, tmp_path: Path) -> None:
    """Batches LAST and before are recorded: a checkpoint must go on at LAST at most (its
    last committed batch, or the one after it, recorded before Spark committed it)."""
    ckpt = tmp_path / "shop"
    with pytest.raises(InvalidRequest, match=f"has state up to batch {LAST} in checkpoint "
                                             f"storage, and its checkpoint {ckpt / 'merged'} "
                                             "goes on at batch 0"):
        begin(storage, ckpt, JOB, specs(JOB), None, None, ["merged"])
    commits = ckpt / "merged" / "commits"
    commits.mkdir(parents=True)
    for b in range(LAST - 1):
        (commits / str(b)).write_text("v1")
    with pytest.raises(InvalidRequest, match=f"goes on at batch {LAST - 1}"):
        begin(storage, ckpt, JOB, specs(JOB), None, None, ["merged"])
    (commits / str(LAST - 1)).write_text("v1")  # LAST recorded, not committed by Spark yet
    assert begin(storage, ckpt, JOB, specs(JOB), None, None, ["merged"]) == Origin()


def test_a_rollback_of_a_running_job_is_refused(storage: Storage, tmp_path: Path) -> None:
    """Its driver's lease beat within QSTATE_LEASE_S: it would go on writing batches that
    the rollback numbers past, or deletes."""
    sp = create(storage, JOB, "good")
    lease = paths.driver_lease(JOB)
    written = time.time()
    storage.write_bytes(lease, orjson.dumps({"writer": "driver:x", "beat": 3,
                                             "at_ms": int(written * 1000) - 2_000}))
    with pytest.raises(InvalidRequest, match=r"job 'shop' is running: its driver beat (\d+)s "
                                             r"ago\. Stop it first") as refused:
        begin(storage, tmp_path / "shop", JOB, specs(JOB), sp, Recorder(), ["merged"])
    # the age said is the beat's (2 s old when written), bounded by this test's own clock: a
    # stall before begin() reads the lease makes the age larger, and the bound with it
    said = re.search(r"beat (\d+)s ago", str(refused.value))
    assert said is not None
    assert 2 <= int(said.group(1)) <= math.ceil(2 + time.time() - written)
    storage.write_bytes(lease, orjson.dumps({"writer": "driver:x", "beat": 3,
                                             "at_ms": int(time.time() * 1000) - 60_000}))
    assert begin(storage, tmp_path / "shop", JOB, specs(JOB), sp, Recorder(), ["merged"])
