"""A real shard server process over gRPC: commits, lookups, errors, crash recovery."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pyarrow as pa
import pytest

from qstate.core.address import PartitionId, partition_of
from qstate.core.errors import StaleEpoch, from_grpc
from qstate.core.records import delta as deltas
from qstate.core.records.assignment import Assignment, save_assignment
from qstate.core.records.manifest import BatchManifest, write_manifest
from qstate.core.records.operator import OperatorSpec, WindowSpec, save_spec
from qstate.core.records.storage import Storage
from qstate.core.transport.shard_client import ShardClients
from qstate.embedded.procs import ShardProcess
from qstate.proto import shard_pb2 as pb

SPEC = OperatorSpec("j", "op", "k", {"n": "long", "avg": "double"}, partitions=4,
                    window=WindowSpec("tumbling", 10))


def delta_for(p: int, batch: int, keys: list[str]) -> pa.Table:
    mine = [k for k in keys if partition_of(k, SPEC.partitions) == p]
    return pa.table({
        "key": mine, "start": pa.array([batch * 10] * len(mine), pa.int64()),
        "end": pa.array([batch * 10 + 10] * len(mine), pa.int64()),
        "tag": pa.nulls(len(mine), pa.int64()),
        "n": pa.array([batch + 1] * len(mine), pa.int64()),
        "avg": pa.array([0.5 * batch] * len(mine), pa.float64()),
    }).cast(deltas.delta_schema(SPEC))


@pytest.fixture
def env(tmp_path: Path):
    storage = Storage(str(tmp_path / "storage"))
    save_spec(storage, SPEC)
    shard = ShardProcess.make("t0", tmp_path / "data", storage.uri, tmp_path / "logs")
    save_assignment(storage, Assignment("j", 1, {"t0": shard.address}, {"op": ["t0"] * 4}))
    shard.start_and_wait()
    clients = ShardClients()
    wait_ready(clients.stub(shard.address), 4)
    yield storage, shard, clients.stub(shard.address)
    clients.close()
    shard.stop()


KEYS = [f"k{i}" for i in range(40)]


def wait_ready(stub, n: int, timeout: float = 10.0) -> None:
    """Until the server has taken up its ``n`` assigned partitions."""
    deadline = time.monotonic() + timeout
    while True:
        d = stub.Describe(pb.DescribeRequest(), timeout=5)
        if len(d.partitions) == n and not any(p.restoring for p in d.partitions):
            return
        assert time.monotonic() < deadline, d
        time.sleep(0.05)


def write_batch(storage: Storage, batch: int, parts=range(4), keys=KEYS) -> dict[int, int]:
    """What the job's executors and driver write before a commit: deltas + the manifest."""
    written = {}
    for p in parts:
        t = delta_for(p, batch, keys)
        deltas.write_delta(storage, PartitionId(SPEC.job, SPEC.operator, p), batch, t)
        written[p] = t.num_rows
    write_manifest(storage, "j", "op", BatchManifest(
        batch, batch * 10, {p: {0: n} for p, n in written.items()}))
    return written


def commit(stub, storage: Storage, batch: int, parts=range(4), rows=None, epoch=1, keys=KEYS):
    written = write_batch(storage, batch, parts, keys)
    req = pb.CommitRequest(job="j", operator="op", batch=batch, watermark_ms=batch * 10,
                           epoch=epoch)
    for p in parts:
        req.partitions.add(partition=p, has_delta=True, fragments=[0],
                           rows=written[p] if rows is None else rows)
    return stub.Commit(req, timeout=10)


def lookup(stub, keys, state="n", **kw):
    return stub.MultiGet(pb.LookupRequest(
        job="j", operator="op", state=state,
        keys=[pb.KeyQuery(key=k, partition=partition_of(k, 4)) for k in keys], **kw), timeout=5)


def test_commit_then_latest_and_range(env) -> None:
    storage, _, stub = env
    assert sorted(commit(stub, storage, 0).applied) == [0, 1, 2, 3]
    assert sorted(commit(stub, storage, 1).applied) == [0, 1, 2, 3]
    again = commit(stub, storage, 1)
    assert (list(again.applied), sorted(again.skipped)) == ([], [0, 1, 2, 3])
    rep = lookup(stub, ["k1", "nope"])
    hit, miss = rep.results
    assert (hit.status, hit.batch, hit.watermark_ms) == (pb.FOUND, 1, 10)
    assert [(w.start_ms, w.end_ms, w.int_value) for w in hit.windows] == [(10, 20, 2)]
    assert (miss.status, miss.batch) == (pb.ABSENT, 1)
    rng = lookup(stub, ["k1"], state="avg", range=True, from_ms=0, to_ms=100)
    assert [(w.start_ms, w.double_value) for w in rng.results[0].windows] == [(0, 0.0), (10, 0.5)]
    d = stub.Describe(pb.DescribeRequest(), timeout=5)
    assert d.server_id == "t0"
    assert sorted((p.partition, p.last_batch) for p in d.partitions) == [(p, 1) for p in range(4)]


def test_bad_requests_get_clear_status_codes(env) -> None:
    storage, _, stub = env
    commit(stub, storage, 0, parts=[0])
    cases = [
        (dict(job="j", operator="op", state="n", keys=[pb.KeyQuery(key="k1", partition=3)]),
         grpc.StatusCode.INVALID_ARGUMENT, "not in partition"),
        (dict(job="j", operator="nope", state="n"), grpc.StatusCode.NOT_FOUND, "j/nope"),
        (dict(job="j", operator="op", state="zzz"), grpc.StatusCode.NOT_FOUND, "no state"),
        (dict(job="bad/name", operator="op", state="n"), grpc.StatusCode.INVALID_ARGUMENT,
         "A-Z a-z"),
    ]
    for req, code, text in cases:
        with pytest.raises(grpc.RpcError) as err:
            stub.MultiGet(pb.LookupRequest(**req), timeout=5)  # type: ignore[arg-type]
        assert err.value.code() == code and text in err.value.details()
    # a stale writer (an older epoch than the assignment's) is refused with its own code,
    # which the coordinator reads back as StaleEpoch without looking at the message
    with pytest.raises(grpc.RpcError) as err:
        commit(stub, storage, 1, parts=[0], epoch=0)
    assert err.value.code() == grpc.StatusCode.ABORTED
    assert isinstance(from_grpc(err.value), StaleEpoch)
    # the committer announced rows the delta file does not have
    with pytest.raises(grpc.RpcError) as err:
        commit(stub, storage, 1, parts=[0], rows=12345)
    assert err.value.code() == grpc.StatusCode.DATA_LOSS


def test_moved_partition_is_not_owned_any_more(env) -> None:
    storage, shard, stub = env
    commit(stub, storage, 0)
    save_assignment(storage, Assignment("j", 2, {"t0": shard.address, "other": "x:1"},
                                        {"op": ["t0", "t0", "t0", "other"]}))
    k = next(k for k in KEYS if partition_of(k, 4) == 3)
    deadline = time.monotonic() + 5
    while lookup(stub, [k]).results[0].status != pb.NOT_OWNED:
        assert time.monotonic() < deadline, "the shard did not follow the new assignment"
        time.sleep(0.1)
    with pytest.raises(grpc.RpcError) as err:
        commit(stub, storage, 1, epoch=2)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "not owned" in err.value.details()


def test_gap_is_closed_from_deltas_and_kill9_keeps_committed_state(env, tmp_path) -> None:
    storage, shard, stub = env
    commit(stub, storage, 0)
    for b in (1, 2):  # written by the job while this server missed the commits
        write_batch(storage, b)
    rep = commit(stub, storage, 3)
    assert rep.caught_up_batches == 4 * 2
    # delta_for: batch b writes window b*10 of every key with n = b + 1
    truth = {(k, b * 10): b + 1 for k in KEYS for b in range(4)}

    def windows() -> dict[tuple[str, int], int]:
        got = lookup(stub, KEYS, range=True, from_ms=0, to_ms=1000)
        return {(r.key, w.start_ms): w.int_value for r in got.results for w in r.windows}
    assert windows() == truth
    shard.kill()
    shard.start_and_wait()
    stub = ShardClients().stub(shard.address)
    wait_ready(stub, 4)
    assert windows() == truth


def test_a_second_server_on_a_port_in_use_refuses_to_start(env, tmp_path) -> None:
    """grpc would share the port (SO_REUSEPORT) and the newcomer would take part of the
    first one's commits and reads; it must stop at once and say why."""
    storage, shard, stub = env
    second = ShardProcess.make("t1", tmp_path / "data2", storage.uri, tmp_path / "logs",
                               port=shard.port).start()
    assert second.proc is not None
    assert second.proc.wait(30) == 2
    log = second.log_path.read_text()
    assert f"cannot listen on 127.0.0.1:{shard.port}: the port is in use" in log, log[-2000:]
    assert stub.Describe(pb.DescribeRequest(), timeout=5).server_id == "t0"
