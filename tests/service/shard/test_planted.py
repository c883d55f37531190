"""Crafted objects planted in checkpoint storage (issue 25): a snapshot whose file list
points outside its folder, a manifest that is not one. Each is refused with an error naming
the object before anything is read, written or deleted, and a partition that was serving
keeps serving its last good batch (a real shard process)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import orjson
import pytest

from qstate.core.address import PartitionId
from qstate.core.errors import CorruptState
from qstate.core.records import paths
from qstate.core.records.storage import Storage
from qstate.shard.snapshot import Snapshotter, restore
from tests.service.shard.test_server import SPEC, commit, env, lookup, write_batch  # noqa: F401

PID = PartitionId(SPEC.job, SPEC.operator, 0)
PLANTED = {
    "local name with ..": {"../../../escaped": "sst/x.sst"},
    "local name with /": {"a/CURRENT": "sst/x.sst"},
    "stored path with ..": {"CURRENT": "../../../../../../outside"},
    "absolute stored path": {"CURRENT": "/etc/passwd"},
}


def plant(storage: Storage, batch: int, files: dict[str, str]) -> str:
    path = paths.snapshot(PID, batch)
    storage.write_bytes(path, orjson.dumps({"batch": batch, "watermark_ms": 0,
                                            "files": files}))
    return path


@pytest.mark.parametrize("case", list(PLANTED))
def test_a_planted_snapshot_is_refused_naming_it(tmp_path: Path, case: str) -> None:
    storage = Storage(str(tmp_path / "storage"))
    outside = tmp_path / "outside"
    outside.write_bytes(b"not yours")
    dest = tmp_path / "data" / "p0"
    dest.mkdir(parents=True)
    (dest / "CURRENT").write_bytes(b"the partition's own")
    path = plant(storage, 7, PLANTED[case])
    with pytest.raises(CorruptState, match=f"snapshot {path}"):
        restore(storage, PID, dest)
    # pruning reads the same list (to delete what no kept snapshot uses): refused too
    plant(storage, 8, {})
    with ThreadPoolExecutor(1) as pool, pytest.raises(CorruptState, match=f"snapshot {path}"):
        Snapshotter(storage, tmp_path / "scratch", 1, 1, pool).prune(PID)
    assert outside.read_bytes() == b"not yours"
    assert (dest / "CURRENT").read_bytes() == b"the partition's own"
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "data" / "escaped").exists()
    assert sorted(os.listdir(tmp_path)) == ["data", "outside", "storage"]


def test_a_planted_manifest_is_refused_and_the_partition_keeps_serving(env) -> None:  # noqa: F811
    storage, _, stub = env
    commit(stub, storage, 0)
    before = lookup(stub, ["k1"])
    write_batch(storage, 1)  # batch 1's deltas, then a manifest that is not one
    bad = paths.manifest("j", "op", 1)
    storage.write_bytes(bad, orjson.dumps({"batch": 1, "watermark_ms": 10,
                                           "deltas": {"../../../../etc": {"0": 1}}}))
    with pytest.raises(grpc.RpcError) as err:  # batch 2 arrives: 1 must come from storage
        commit(stub, storage, 2)
    assert err.value.code() == grpc.StatusCode.DATA_LOSS
    assert f"manifest {bad} is not a batch manifest" in (err.value.details() or "")
    after = lookup(stub, ["k1"])
    assert after.results[0].batch == 0 and after.results == before.results
