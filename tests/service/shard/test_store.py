from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from service.shard.store import PartitionStore, StaleEpoch


def delta(rows: list[tuple[str, int | None, int | None, int, float]]) -> pa.Table:
    keys, starts, ends, views, avg = zip(*rows, strict=True)
    return pa.table({"key": list(keys), "start": pa.array(starts, pa.int64()),
                     "end": pa.array(ends, pa.int64()), "views": pa.array(views, pa.int64()),
                     "avg": pa.array(avg, pa.float64())})


@pytest.fixture
def store(tmp_path: Path) -> PartitionStore:
    return PartitionStore(tmp_path / "p0", ["views", "avg"])


def test_upsert_latest_and_range(store: PartitionStore) -> None:
    store.apply(0, 0, 1, delta([("a", 0, 10, 1, 0.5), ("a", 10, 20, 2, 1.5),
                                ("ab", 5, 15, 7, 2.0)]), None)
    meta, w = store.read("a")
    assert meta.last_batch == 0
    assert [(x.start, x.end, x.values) for x in w] == [(10, 20, [2, 1.5])]
    store.apply(1, 5, 1, delta([("a", 10, 20, 5, 3.0)]), None)
    meta, w = store.read("a", (0, 100))
    assert meta.last_batch == 1 and meta.watermark_ms == 5
    assert [(x.start, x.values[0]) for x in w] == [(0, 1), (10, 5)]
    # "a" is a prefix of "ab" as a string, never as a stored key
    assert [x.start for x in store.read("ab", (0, 100))[1]] == [5]
    assert store.read("b")[1] == []


def test_batch_is_applied_once(store: PartitionStore) -> None:
    assert store.apply(3, 0, 1, delta([("k", 0, 10, 1, 0.0)]), None)
    assert not store.apply(3, 0, 1, delta([("k", 0, 10, 99, 0.0)]), None)
    assert not store.apply(2, 0, 1, delta([("k", 0, 10, 98, 0.0)]), None)
    assert store.read("k")[1][0].values[0] == 1


def test_negative_and_non_windowed_times(store: PartitionStore) -> None:
    store.apply(0, 0, 1, delta([("k", -20, -10, 1, 0.0), ("k", 5, 15, 2, 0.0),
                                ("n", None, None, 42, 1.0)]), None)
    assert [x.start for x in store.read("k", (-100, 100))[1]] == [-20, 5]
    [w] = store.read("n")[1]
    assert (w.start, w.end, w.values) == (None, None, [42, 1.0])


def test_retention_deletes_closed_windows_by_range(store: PartitionStore) -> None:
    store.apply(0, 0, 1, delta([(f"k{i}", s, s + 10, 1, 0.0)
                                for i in range(50) for s in (0, 10, 20, 30)]), 100)
    # watermark 125, retention 100: windows ending at or before 25 go
    store.apply(1, 125, 1, None, 100)
    starts = {x.start for i in range(50) for x in store.read(f"k{i}", (0, 100))[1]}
    assert starts == {20, 30}
    assert store.read("k0")[1][0].start == 30


def test_state_survives_reopen_and_stale_epoch_is_refused(tmp_path: Path) -> None:
    s = PartitionStore(tmp_path / "p", ["views", "avg"])
    s.apply(7, 70, 3, delta([("x", 0, 10, 9, 0.0)]), None)
    s.close()
    s = PartitionStore(tmp_path / "p", ["views", "avg"])
    assert (s.meta.last_batch, s.meta.watermark_ms, s.meta.epoch) == (7, 70, 3)
    assert s.read("x")[1][0].values[0] == 9
    with pytest.raises(StaleEpoch):
        s.apply(8, 80, 2, None, None)
