"""Bytes from outside the process, fuzzed: delta files from checkpoint storage and the
partition store's key layout. Whatever the bytes, the answer is the data or an error that
says what is wrong and where (``DeltaMismatch`` naming the file, ``CorruptState``), never
another exception; and a shard given a corrupt delta refuses that commit with DATA_LOSS
naming the file while the partition keeps serving its last good batch."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qstate.core.address import MAX_KEY_BYTES, PartitionId, partition_of
from qstate.core.errors import CorruptState, DeltaMismatch, from_grpc
from qstate.core.records import delta as deltas
from qstate.core.records import paths
from qstate.core.records.assignment import Assignment, save_assignment
from qstate.core.records.manifest import BatchManifest, write_manifest
from qstate.core.records.operator import OperatorSpec, WindowSpec, save_spec
from qstate.core.records.storage import Storage
from qstate.core.transport.shard_client import ShardClients
from qstate.embedded.procs import ShardProcess
from qstate.partition import layout
from qstate.proto import shard_pb2 as pb
from qstate.proto import shard_pb2_grpc as pb_grpc
from tests.helpers import wait_until

pytestmark = pytest.mark.security

SPEC = OperatorSpec("fz", "counts", "k", {"n": "long", "avg": "double"}, partitions=4,
                    window=WindowSpec("tumbling", 10))
PID = PartitionId(SPEC.job, SPEC.operator, 0)
KEYS = [f"k{i}" for i in range(40)]
SHARED = settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)


def delta_for(p: int, batch: int) -> pa.Table:
    mine = [k for k in KEYS if partition_of(k, SPEC.partitions) == p]
    n = len(mine)
    return pa.table({
        "key": mine, "start": pa.array([batch * 10] * n, pa.int64()),
        "end": pa.array([batch * 10 + 10] * n, pa.int64()), "tag": pa.nulls(n, pa.int64()),
        "n": pa.array([batch + 1] * n, pa.int64()),
        "avg": pa.array([0.5 * batch] * n, pa.float64())}).cast(deltas.delta_schema(SPEC))


def good_file(storage: Storage) -> bytes:
    deltas.write_delta(storage, PID, 0, delta_for(0, 0))
    with storage.open_file(paths.delta(PID, 0, 0)) as f:
        return bytes(f.read())


# ------------------------------------------------------------------------ delta files


@SHARED
@given(raw=st.binary(max_size=4096))
def test_any_bytes_as_a_delta_file_read_or_name_the_file(tmp_path: Path, raw: bytes) -> None:
    storage = Storage(str(tmp_path))
    storage.write_bytes(paths.delta(PID, 7, 0), raw)
    try:
        table = deltas.read_delta(storage, PID, 7, 0, SPEC)
    except DeltaMismatch as exc:
        assert paths.delta(PID, 7, 0) in exc.message and "batch 7" in exc.message
    else:  # a well-formed file of the operator's schema: then it is the data
        assert table.schema.names[:4] == ["key", "start", "end", "tag"]


@SHARED
@given(data=st.data())
def test_a_damaged_delta_file_reads_whole_or_names_the_file(tmp_path: Path,
                                                            data: st.DataObject) -> None:
    storage = Storage(str(tmp_path))
    good = good_file(storage)
    damaged = bytearray(good)
    for _ in range(data.draw(st.integers(1, 8), label="flips")):
        at = data.draw(st.integers(0, len(good) - 1), label="at")
        damaged[at] = data.draw(st.integers(0, 255), label="byte")
    cut = data.draw(st.just(len(good)) | st.integers(0, len(good)), label="length")
    storage.write_bytes(paths.delta(PID, 3, 0), bytes(damaged[:cut]))
    try:
        table = deltas.read_delta(storage, PID, 3, 0, SPEC)
    except DeltaMismatch as exc:
        assert paths.delta(PID, 3, 0) in exc.message
    else:  # the damage missed everything that matters: what is read is consistent
        table.validate(full=True)
        assert table.column("key").null_count == 0


def test_a_delta_file_of_another_schema_names_what_does_not_fit(tmp_path: Path) -> None:
    storage = Storage(str(tmp_path))
    other = delta_for(0, 0).drop_columns(["avg"]).set_column(
        4, "n", pa.array(["x"] * delta_for(0, 0).num_rows, pa.string()))
    deltas.write_delta(storage, PID, 2, other)
    with pytest.raises(DeltaMismatch) as info:
        deltas.read_deltas(storage, PID, 2, [0], SPEC)
    assert paths.delta(PID, 2, 0) in info.value.message
    assert "n (int64)" in info.value.message and "avg (double)" in info.value.message
    with pytest.raises(DeltaMismatch, match="missing from storage"):
        deltas.read_delta(storage, PID, 99, 0, SPEC)


# ------------------------------------------------------------------- the key layout

KEY = st.text(min_size=1, max_size=300).filter(lambda k: len(k.encode()) <= MAX_KEY_BYTES)
TIME = st.integers(-(2**63), 2**63 - 1)


@given(key=KEY, start=TIME, tag=st.none() | TIME)
def test_data_keys_round_trip(key: str, start: int, tag: int | None) -> None:
    raw = layout.data_key(key, start, tag)
    assert layout.parse_data_key(raw) == (key, start, tag)
    assert raw.startswith(layout.key_prefix(key))
    if tag is None:
        assert layout.start_of(raw) == start
    else:
        assert (layout.pane_of(raw), layout.tag_of(raw)) == (start, tag)
    end = start // 2
    ik = layout.index_key(end, raw)
    assert layout.data_key_of_index(ik) == raw and layout.dec_time(ik[1:9]) == end


@given(st.lists(st.tuples(st.sampled_from(["a", "b", "ab", "é", "a\x00"]), TIME),
                min_size=1, max_size=30))
def test_a_keys_windows_are_contiguous_and_ordered_by_start(rows: list[tuple[str, int]]
                                                            ) -> None:
    ordered = sorted(layout.data_key(k, s) for k, s in rows)
    parsed = [layout.parse_data_key(r) for r in ordered]
    seen: list[str] = []
    for p in parsed:  # each key's entries form one run: a range read is a seek and a scan
        if not seen or seen[-1] != p.key:
            assert p.key not in seen, ordered
            seen.append(p.key)
    for k in seen:
        starts = [p.start for p in parsed if p.key == k]
        assert starts == sorted(starts)


@given(st.lists(st.tuples(KEY, TIME, TIME), min_size=1, max_size=20), st.booleans())
def test_vectorized_keys_equal_one_by_one(rows: list[tuple[str, int, int]], panes: bool
                                          ) -> None:
    keys = pa.array([k for k, _, _ in rows], pa.string())
    starts = np.array([s for _, s, _ in rows], np.int64)
    tags = np.array([t for _, _, t in rows], np.int64) if panes else None
    assert layout.data_keys(keys, starts, tags).to_pylist() == [
        layout.data_key(k, s, t if panes else None) for k, s, t in rows]


@given(st.binary(max_size=80))
def test_any_bytes_parse_as_a_data_key_or_say_why_not(raw: bytes) -> None:
    try:
        got = layout.parse_data_key(raw)
    except CorruptState as exc:
        assert "not a data key" in exc.message
    else:
        assert layout.data_key(*got) == raw


# --------------------------------------------------- a corrupt delta at a real shard


@pytest.fixture
def shard(tmp_path: Path) -> Iterator[tuple[Storage, pb_grpc.ShardStub]]:
    storage = Storage(str(tmp_path / "storage"))
    save_spec(storage, SPEC)
    proc = ShardProcess.make("fz0", tmp_path / "data", storage.uri, tmp_path / "logs")
    save_assignment(storage, Assignment(SPEC.job, 1, {"fz0": proc.address},
                                        {SPEC.operator: ["fz0"] * SPEC.partitions}))
    proc.start_and_wait()
    clients = ShardClients()
    stub = clients.stub(proc.address)
    def ready() -> bool:
        held = stub.Describe(pb.DescribeRequest(), timeout=5).partitions
        return len(held) == SPEC.partitions and not any(p.restoring for p in held)

    wait_until(ready, 20, "the shard serving every partition")
    try:
        yield storage, stub
    finally:
        clients.close()
        proc.stop()


def _commit(stub: pb_grpc.ShardStub, storage: Storage, batch: int, parts: list[int],
            tables: dict[int, pa.Table] | None = None) -> pb.CommitReply:
    written = {}
    for p in parts:
        t = (tables or {}).get(p, delta_for(p, batch))
        deltas.write_delta(storage, PartitionId(SPEC.job, SPEC.operator, p), batch, t)
        written[p] = t.num_rows
    write_manifest(storage, SPEC.job, SPEC.operator,
                   BatchManifest(batch, batch * 10, {p: {0: n} for p, n in written.items()}))
    req = pb.CommitRequest(job=SPEC.job, operator=SPEC.operator, batch=batch,
                           watermark_ms=batch * 10, epoch=1)
    for p in parts:
        req.partitions.add(partition=p, has_delta=True, fragments=[0], rows=written[p])
    reply: pb.CommitReply = stub.Commit(req, timeout=10)
    return reply


def _serving(stub: pb_grpc.ShardStub, p: int) -> list[tuple[int, int, int]]:
    """(batch, window start, n) of each key of partition ``p``."""
    mine = [k for k in KEYS if partition_of(k, SPEC.partitions) == p]
    rep = stub.MultiGet(pb.LookupRequest(
        job=SPEC.job, operator=SPEC.operator, state="n",
        keys=[pb.KeyQuery(key=k, partition=p) for k in mine]), timeout=5)
    assert all(r.status == pb.FOUND for r in rep.results), rep
    return [(r.batch, r.windows[0].start_ms, r.windows[0].int_value) for r in rep.results]


def test_a_corrupt_delta_is_refused_naming_the_file_and_the_last_good_batch_serves(
        shard: tuple[Storage, pb_grpc.ShardStub]) -> None:
    storage, stub = shard
    assert sorted(_commit(stub, storage, 0, [0, 1]).applied) == [0, 1]
    before = _serving(stub, 0)
    assert before and all(b == (0, 0, 1) for b in before)
    # batch 1's file for partition 0 damaged on storage after the job wrote it
    path = paths.delta(PID, 1, 0)
    deltas.write_delta(storage, PID, 1, delta_for(0, 1))
    with storage.open_file(path) as f:
        raw = bytes(f.read())
    storage.write_bytes(path, raw[: len(raw) // 2])
    req = pb.CommitRequest(job=SPEC.job, operator=SPEC.operator, batch=1, watermark_ms=10,
                           epoch=1)
    req.partitions.add(partition=0, has_delta=True, fragments=[0],
                       rows=delta_for(0, 1).num_rows)
    with pytest.raises(grpc.RpcError) as info:
        stub.Commit(req, timeout=10)
    assert info.value.code() == grpc.StatusCode.DATA_LOSS  # type: ignore[attr-defined]
    assert path in info.value.details()  # type: ignore[attr-defined]
    assert isinstance(from_grpc(info.value), DeltaMismatch)
    assert _serving(stub, 0) == before  # still batch 0, every key
    # a file of another schema for partition 1: refused naming the columns; 1 serves batch 0
    other = delta_for(1, 1).drop_columns(["avg"])
    with pytest.raises(grpc.RpcError) as info:
        _commit(stub, storage, 1, [1], tables={1: other})
    assert info.value.code() == grpc.StatusCode.DATA_LOSS  # type: ignore[attr-defined]
    assert "avg (double)" in info.value.details()  # type: ignore[attr-defined]
    assert all(b == (0, 0, 1) for b in _serving(stub, 1))
    d = stub.Describe(pb.DescribeRequest(), timeout=5)
    held = {p.partition: (p.last_batch, p.restoring) for p in d.partitions}
    assert held[0] == held[1] == (0, False)
    # the job rewrites the file and commits again: applied, and served
    assert sorted(_commit(stub, storage, 1, [0, 1]).applied) == [0, 1]
    assert all(b == (1, 10, 2) for b in _serving(stub, 0) + _serving(stub, 1))
