from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from qstate.core.address import PartitionId
from qstate.core.errors import DeltaMismatch
from qstate.core.records import paths
from qstate.core.records.catalog import delta_batches
from qstate.core.records.delta import delta_schema, read_delta, read_deltas, write_delta
from qstate.core.records.operator import Aggregate, OperatorSpec, WindowSpec
from qstate.core.records.storage import Storage

PID = PartitionId("ads", "per_campaign", 5)
SPEC = OperatorSpec("ads", "per_campaign", "campaign", {"impressions": "long", "spend": "double"},
                    partitions=8, window=WindowSpec("tumbling", 60_000, 60_000))


@pytest.fixture
def storage(tmp_path: Path) -> Storage:
    return Storage(str(tmp_path))


def sample_table() -> pa.Table:
    return pa.table({
        "key": ["c-1", "c-2", "ünï ✓"],
        "start": [0, 60_000, None],
        "end": [60_000, 120_000, None],
        "tag": [None, None, None],
        "impressions": [3, None, 2**62],
        "spend": [0.5, 1e300, None],
    }, schema=delta_schema(SPEC))


def test_schema_has_key_window_tag_and_one_column_per_state() -> None:
    schema = delta_schema(SPEC)
    assert schema.names == ["key", "start", "end", "tag", "impressions", "spend"]
    assert [schema.field(n).type for n in schema.names] == [
        pa.string(), pa.int64(), pa.int64(), pa.int64(), pa.int64(), pa.float64()]
    assert not schema.field("key").nullable
    assert schema.field("start").nullable and schema.field("end").nullable  # not windowed
    swapped = OperatorSpec("j", "o", "k", {"b": "double", "a": "long"})
    assert delta_schema(swapped).names == ["key", "start", "end", "tag", "b", "a"]  # spec order


def test_merged_aggregates_have_their_partial_columns() -> None:
    spec = OperatorSpec("j", "o", "k", {
        "n": Aggregate("count", "long"), "s": Aggregate("sum", "double"),
        "lo": Aggregate("min", "long"), "mean": Aggregate("avg", "double"),
        "users": Aggregate("approx_count_distinct", "long", 12)})
    schema = delta_schema(spec)
    assert schema.names[4:] == ["n", "s", "lo", "mean__sum", "mean__n", "users"]
    assert [schema.field(n).type for n in schema.names[4:]] == [
        pa.int64(), pa.float64(), pa.int64(), pa.float64(), pa.int64(), pa.binary()]


def test_write_read_round_trip(storage: Storage) -> None:
    table = sample_table()
    write_delta(storage, PID, 12, table)
    assert storage.exists(paths.delta(PID, 12, 0))
    back = read_delta(storage, PID, 12)
    assert back.schema == table.schema
    assert back.equals(table)
    assert back.to_pylist() == table.to_pylist()
    assert delta_batches(storage, PID) == [12]


def test_empty_delta_round_trip(storage: Storage) -> None:
    empty = delta_schema(SPEC).empty_table()
    write_delta(storage, PID, 0, empty)
    back = read_delta(storage, PID, 0)
    assert back.num_rows == 0 and back.schema == empty.schema


def test_rewrite_replaces_the_delta(storage: Storage) -> None:
    write_delta(storage, PID, 3, sample_table())
    smaller = sample_table().slice(0, 1)
    write_delta(storage, PID, 3, smaller)  # a re-run batch
    assert read_delta(storage, PID, 3).to_pylist() == smaller.to_pylist()
    assert storage.list_names(paths.deltas_dir(PID)) == [
        paths.delta(PID, 3, 0).rsplit("/", 1)[1]]


def test_fragments_read_as_one_delta(storage: Storage) -> None:
    table = sample_table()
    write_delta(storage, PID, 5, table.slice(0, 2), fragment=1)
    write_delta(storage, PID, 5, table.slice(2), fragment=4)
    assert read_deltas(storage, PID, 5, [4, 1]).to_pylist() == table.to_pylist()


def test_the_file_is_arrow_ipc(storage: Storage) -> None:
    # shard servers and Spark executors agree on the format, not only on this module
    write_delta(storage, PID, 1, sample_table())
    with pa.OSFile(storage.full(paths.delta(PID, 1, 0))) as f:
        assert ipc.open_file(f).read_all().equals(sample_table())


def test_missing_delta_names_the_file(storage: Storage) -> None:
    with pytest.raises(DeltaMismatch) as info:
        read_delta(storage, PID, 9)
    msg = str(info.value)
    assert paths.delta(PID, 9, 0) in msg
    assert "missing" in msg


@pytest.mark.parametrize("corrupt", [
    b"", b"not arrow at all", b"ARROW1\x00\x00" + b"\x00" * 64,
    "truncated",
], ids=["empty", "garbage", "bad-footer", "truncated"])
def test_corrupt_delta_names_the_file(storage: Storage, corrupt: bytes | str) -> None:
    if corrupt == "truncated":
        write_delta(storage, PID, 4, sample_table())
        whole = storage.read_bytes(paths.delta(PID, 4, 0))
        data = whole[: len(whole) // 2]
    else:
        assert isinstance(corrupt, bytes)
        data = corrupt
    storage.write_bytes(paths.delta(PID, 4, 0), data)
    with pytest.raises(DeltaMismatch) as info:
        read_delta(storage, PID, 4)
    msg = str(info.value)
    assert paths.delta(PID, 4, 0) in msg
    assert "unreadable" in msg


def test_a_delta_of_another_partition_or_batch_is_not_read(storage: Storage) -> None:
    write_delta(storage, PID, 2, sample_table())
    with pytest.raises(DeltaMismatch):
        read_delta(storage, PartitionId("ads", "per_campaign", 6), 2)
    with pytest.raises(DeltaMismatch):
        read_delta(storage, PID, 3)


def test_a_delta_written_before_an_aggregate_was_added_reads_it_as_no_rows(
        storage: Storage) -> None:
    """A file records the aggregates its writer declared: a column of one declared since
    (docs/upgrading.md) reads as nulls; a column missing of one it was written for, or
    from a file that says nothing, is refused as before."""
    added = OperatorSpec(SPEC.job, SPEC.operator, SPEC.key,
                         {**SPEC.states, "clicks": SPEC.states["impressions"]},
                         window=SPEC.window)
    write_delta(storage, PID, 1, sample_table(), states=SPEC.states)
    got = read_delta(storage, PID, 1, 0, added)
    assert got.column("clicks").null_count == got.num_rows == sample_table().num_rows
    assert got.column("impressions").to_pylist() == sample_table().column(
        "impressions").to_pylist()
    write_delta(storage, PID, 2, sample_table(), states=added.states)  # said, not there
    write_delta(storage, PID, 3, sample_table())  # says nothing
    for batch in (2, 3):
        with pytest.raises(DeltaMismatch, match="missing or mistyped columns clicks"):
            read_delta(storage, PID, batch, 0, added)
