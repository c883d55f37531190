"""``PartitionStore`` in merge mode against a brute-force model of Spark (``sim``): batches of
partial aggregates applied with their watermarks must read back as Spark's own state would,
window by window; plus exactly-once application, epochs, retention and spark-state values."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from qstate.core.errors import StaleEpoch
from qstate.core.records.delta import delta_schema
from qstate.core.records.operator import Aggregate, OperatorSpec, WindowSpec
from qstate.partition.codec import Codec
from qstate.partition.reader import read_windows
from qstate.shard.store import PartitionStore
from tests.service.shard.sim import (
    FAR,
    SETTINGS,
    Batches,
    SparkModel,
    assert_answers,
    check_index,
    compare,
    data_and_index_keys,
    ev,
    make_spec,
    partials,
    raw_items,
    run,
    scenarios,
    scratch,
    sketch,
    view,
)


def replay(w: WindowSpec, batches: Batches, retention_ms: int | None = None,
           past_retention_may_linger: bool = False) -> None:
    """Apply the batches one by one, comparing everything with the model after each."""
    with scratch() as d:
        store = PartitionStore(Path(d) / "p", make_spec(w, retention_ms=retention_ms))
        model = SparkModel(w)
        try:
            for i, b in enumerate(batches):
                run(store, model, [b], retention_ms, first=i)
                check_index(store)
                compare(store, model, retention_ms,
                        past_retention_may_linger=past_retention_may_linger)
        finally:
            store.close()


# ---- random batches against the model ------------------------------------------------------
# @given on each parametrized test itself, drawing its kind's scenario: each kind then has a
# key of its own in the example database, where a failure is saved and replayed (sim.SETTINGS)
@pytest.mark.parametrize("kind", ["none", "tumbling", "sliding", "session"])
@SETTINGS
@given(data=st.data())
def test_random_batches_read_back_as_spark_state(kind: str, data: st.DataObject) -> None:
    replay(*data.draw(scenarios(kind), "case"))


@pytest.mark.parametrize("kind", ["tumbling", "sliding", "session"])
@SETTINGS
@given(data=st.data())
def test_random_batches_with_retention(kind: str, data: st.DataObject) -> None:
    """Retention of at least one batch's watermark advance: nothing a batch writes is
    already past retention. Windows that ended at or before watermark - retention are gone."""
    w, batches = data.draw(scenarios(kind, max_jump=40), "case")
    replay(w, batches, retention_ms=data.draw(st.integers(40, 120), "retention"))


@pytest.mark.parametrize("kind", ["tumbling", "sliding", "session"])
@SETTINGS
@given(data=st.data())
def test_random_batches_with_watermark_jumps_past_retention(kind: str,
                                                            data: st.DataObject) -> None:
    """The watermark may jump further than retention in one batch: rows of a window that is
    still open (end after the previous watermark) but already past retention. Every stored
    record must stay in the time index (else it never expires); whether such a window is
    read until the next batch is left to the targeted tests below."""
    w, batches = data.draw(scenarios(kind, max_jump=120, min_jump=20), "case")
    replay(w, batches, retention_ms=data.draw(st.integers(0, 20), "retention"),
           past_retention_may_linger=True)


# ---- sessions --------------------------------------------------------------------------------
def sessions_of(store: PartitionStore, key: str) -> list[tuple[int | None, int | None, int]]:
    return [(w.start, w.end, int(w.values[0] or 0))
            for w in store.read(key, (-FAR, FAR))[1]]


def test_a_row_bridging_two_open_sessions_merges_all_three(tmp_path: Path) -> None:
    w = WindowSpec("session", gap_ms=10)
    store = PartitionStore(tmp_path / "p", make_spec(w, retention_ms=110))
    model = SparkModel(w)
    run(store, model, [([ev("k", 100, 1, 1), ev("k", 115, 2, 2), ev("k2", 100)], 0)])
    assert sessions_of(store, "k") == [(100, 110, 1), (115, 125, 1)]
    # [110, 120) touches [100, 110) and [115, 125): one session [100, 125)
    run(store, model, [([ev("k", 110, 3, 3)], 50)], first=1)
    assert sessions_of(store, "k") == [(100, 125, 3)]
    assert_answers(store.read("k")[1][0].values, model.expected()["k"][100][1])
    assert store.read("k", (101, FAR))[1] == []  # the session at 115 is gone
    assert sessions_of(store, "k2") == [(100, 110, 1)]
    compare(store, model)
    check_index(store)
    # the merged session keeps growing from its new end, and expires at it, not before
    run(store, model, [([ev("k", 125, 4, 4)], 112)], first=2)
    assert sessions_of(store, "k") == [(100, 135, 4)]
    run(store, model, [([], 240)], retention_ms=110, first=3)  # cutoff 130
    assert sessions_of(store, "k") == [(100, 135, 4)]
    assert sessions_of(store, "k2") == []
    run(store, model, [([], 245)], retention_ms=110, first=4)  # cutoff 135
    assert sessions_of(store, "k") == []
    check_index(store)
    assert data_and_index_keys(store) == []


def test_a_new_session_in_one_batch_bridges_stored_ones(tmp_path: Path) -> None:
    """A batch's own session (several rows) joins two stored sessions; a third stored session
    further on stays apart."""
    w = WindowSpec("session", gap_ms=10)
    store = PartitionStore(tmp_path / "p", make_spec(w))
    model = SparkModel(w)
    run(store, model, [([ev("k", 0), ev("k", 40), ev("k", 100)], 0)])
    run(store, model, [([ev("k", 12), ev("k", 20), ev("k", 30), ev("k", 5)], 5)], first=1)
    assert sessions_of(store, "k") == [(0, 50, 6), (100, 110, 1)]
    compare(store, model)
    check_index(store)


def test_a_row_touching_a_closed_session_starts_a_new_one(tmp_path: Path) -> None:
    w = WindowSpec("session", gap_ms=10)
    store = PartitionStore(tmp_path / "p", make_spec(w))
    model = SparkModel(w)
    run(store, model, [([ev("k", 100)], 0), ([], 110)])
    # batch 2 drops against watermark 110: [100, 110) is closed (Spark evicted it)
    run(store, model, [([ev("k", 110), ev("k", 105)], 110)], first=2)
    assert sessions_of(store, "k") == [(100, 110, 1), (105, 120, 2)]
    run(store, model, [([ev("k", 99)], 120)], first=3)  # late: [99, 109) ended
    assert sessions_of(store, "k") == [(100, 110, 1), (105, 120, 2)]
    compare(store, model)
    check_index(store)


# ---- exactly once, epochs ----------------------------------------------------------------------
def dump(store: PartitionStore) -> list[tuple[bytes, bytes]]:
    return raw_items(store)


def test_reapplying_a_batch_is_a_no_op(tmp_path: Path) -> None:
    w = WindowSpec("sliding", 50, 20)
    spec = make_spec(w)
    store = PartitionStore(tmp_path / "p", spec)
    model = SparkModel(w)
    batch0 = [ev("k", t, t, t % 5) for t in range(0, 100, 7)]
    run(store, model, [(batch0, 40)])
    delta1 = partials(spec, [ev("k", 35), ev("k", 120)], 40)
    assert store.apply(1, 60, 1, delta1, None)
    model.batch([ev("k", 35), ev("k", 120)], 60)
    before, meta = dump(store), store.meta
    for b in (1, 0):  # the same batch again, then an older one
        assert not store.apply(b, 999, 1, delta1, 10)
        assert store.apply(b, 999, 1, None, 10) is False
    assert dump(store) == before and store.meta == meta
    compare(store, model)
    # and it stays applied once across a reopen
    store.close()
    store = PartitionStore(tmp_path / "p", spec)
    assert store.meta == meta
    assert not store.apply(1, 60, 1, delta1, None)
    compare(store, model)


def test_a_stale_epoch_raises(tmp_path: Path) -> None:
    w = WindowSpec("tumbling", 10)
    spec = make_spec(w)
    store = PartitionStore(tmp_path / "p", spec)
    assert store.apply(0, 0, 3, partials(spec, [ev("k", 5)], 0), None)
    before = dump(store)
    with pytest.raises(StaleEpoch):
        store.apply(1, 10, 2, partials(spec, [ev("k", 6)], 0), None)
    with pytest.raises(StaleEpoch):  # stale even for a batch already applied
        store.apply(0, 10, 2, None, None)
    assert dump(store) == before and store.meta.last_batch == 0
    assert store.apply(1, 10, 4, None, None)  # a newer epoch is taken up
    store.close()
    store = PartitionStore(tmp_path / "p", spec)
    assert (store.meta.last_batch, store.meta.epoch) == (1, 4)
    with pytest.raises(StaleEpoch):
        store.apply(2, 20, 3, None, None)


def test_the_watermark_never_goes_back(tmp_path: Path) -> None:
    w = WindowSpec("tumbling", 10)
    spec = make_spec(w)
    store = PartitionStore(tmp_path / "p", spec)
    model = SparkModel(w)
    run(store, model, [([ev("k", 5)], 50), ([ev("k", 45)], 20), ([ev("k", 45), ev("k", 55)], 30)])
    assert store.meta.watermark_ms == 50
    compare(store, model)  # batches 1 and 2 drop against 50: [40, 50) takes nothing
    assert [(w.start, w.values[0]) for w in store.read("k", (0, 100))[1]] == [(0, 1), (50, 1)]


# ---- retention -----------------------------------------------------------------------------
def test_retention_deletes_windows_ended_at_or_before_watermark_minus_retention(
        tmp_path: Path) -> None:
    w = WindowSpec("tumbling", 10)
    spec = make_spec(w, retention_ms=100)
    store = PartitionStore(tmp_path / "p", spec)
    rows = [ev(f"k{i}", t) for i in range(20) for t in (-15, 5, 15, 25, 35)]
    assert store.apply(0, -100, 1, partials(spec, rows, -100), 100)
    assert store.apply(1, 125, 1, None, 100)  # cutoff 25: windows ending at <= 25 go
    for i in range(20):
        assert [x.start for x in store.read(f"k{i}", (-FAR, FAR))[1]] == [20, 30]
    assert store.apply(2, 130, 1, None, 100)  # cutoff 30: [20, 30) ends at the cutoff
    assert [x.start for x in store.read("k3", (-FAR, FAR))[1]] == [30]
    assert store.read("k3")[1][0].start == 30
    check_index(store)
    assert store.apply(3, 1000, 1, None, 100)
    assert data_and_index_keys(store) == []


def test_retention_of_sliding_windows_removes_whole_windows(tmp_path: Path) -> None:
    """A window past retention is gone, not read back from its panes that newer windows
    still need (size 20, slide 10: pane [10, 20) is in windows 0 and 10)."""
    w = WindowSpec("sliding", 20, 10)
    spec = make_spec(w, retention_ms=100)
    store = PartitionStore(tmp_path / "p", spec)
    model = SparkModel(w)
    run(store, model, [([ev("k", 5), ev("k", 15), ev("k", 25)], 0)], retention_ms=100)
    assert [(x.start, x.values[0]) for x in store.read("k", (-FAR, FAR))[1]] == [
        (-10, 1), (0, 2), (10, 2), (20, 1)]
    run(store, model, [([], 120)], retention_ms=100, first=1)  # cutoff 20: windows -10, 0 go
    check_index(store)
    assert [(x.start, x.values[0]) for x in store.read("k", (-FAR, FAR))[1]] == [
        (10, 2), (20, 1)]


@pytest.mark.parametrize("window", [WindowSpec("tumbling", 10), WindowSpec("sliding", 10, 5)],
                         ids=["tumbling", "sliding"])
def test_a_window_past_retention_on_arrival_is_not_kept_forever(tmp_path: Path,
                                                                window: WindowSpec) -> None:
    """Batch 1's watermark jumps past window [0, 10) + retention while the window is still open
    for batch 1 (it drops against watermark 0): its row meets the stored record, and then the
    window (pane) must still expire."""
    spec = make_spec(window, retention_ms=100)
    store = PartitionStore(tmp_path / "p", spec)
    assert store.apply(0, 0, 1, partials(spec, [ev("k", 5)], 0), 100)
    assert store.apply(1, 1000, 1, partials(spec, [ev("k", 6)], 0), 100)  # cutoff 900
    assert store.apply(2, 2000, 1, None, 100)  # cutoff 1900
    assert store.read("k", (-FAR, FAR))[1] == []
    check_index(store)


def test_a_window_already_past_retention_is_not_read(tmp_path: Path) -> None:
    """Batch 0 drops against watermark 0, so [0, 10) takes its row; its own watermark 1000
    with retention 100 puts [0, 10) past retention: it is not read after the batch."""
    for w in (WindowSpec("tumbling", 10), WindowSpec("sliding", 10, 5),
              WindowSpec("session", gap_ms=10)):
        with scratch() as d:
            spec = make_spec(w, retention_ms=100)
            store = PartitionStore(Path(d) / "p", spec)
            assert store.apply(0, 1000, 1, partials(spec, [ev("k", 0)], 0), 100)
            assert store.read("k", (-FAR, FAR))[1] == [], w
            assert store.read("k")[1] == [], w
            store.close()


def test_sessions_expire_at_their_end(tmp_path: Path) -> None:
    w = WindowSpec("session", gap_ms=10)
    store = PartitionStore(tmp_path / "p", make_spec(w, retention_ms=50))
    model = SparkModel(w)
    run(store, model, [([ev("a", 0), ev("a", 8), ev("b", 30)], 0)], retention_ms=50)
    assert sessions_of(store, "a") == [(0, 18, 2)]
    run(store, model, [([ev("a", 17)], 60)], retention_ms=50, first=1)  # cutoff 10
    assert sessions_of(store, "a") == [(0, 27, 3)]
    run(store, model, [([], 77)], retention_ms=50, first=2)  # cutoff 27
    assert sessions_of(store, "a") == [] and sessions_of(store, "b") == [(30, 40, 1)]
    check_index(store)
    compare(store, model, retention_ms=50)


# ---- non-windowed and spark-state operators ----------------------------------------------------
def test_non_windowed_sum_min_max_avg(tmp_path: Path) -> None:
    w = WindowSpec()
    spec = make_spec(w)
    store = PartitionStore(tmp_path / "p", spec)
    model = SparkModel(w)
    run(store, model, [([ev("k", 1, None, 1), ev("k", -5, None, 2)], 0)], retention_ms=None)
    [got] = store.read("k")[1]
    assert (got.start, got.end, got.values) == (None, None, [2, None, None, None, None, 2])
    run(store, model, [([ev("k", 100, 7, 1), ev("k", -100, -3, 3), ev("j", 0, 0, 0)], 10),
                       ([ev("k", 0, 4, 9)], 20)], first=1)
    [got] = store.read("k")[1]
    assert got.values == [5, 8, -3, 7.0, pytest.approx(8 / 3), 4]
    assert store.read("k", (-FAR, FAR))[1] == []  # non-windowed state has no window range
    compare(store, model)
    check_index(store)  # nothing in the time index: never expires


def value_delta(spec: OperatorSpec, rows: Sequence[tuple[str, int | None, int | None,
                                                        int | None, float | None]]) -> pa.Table:
    return pa.Table.from_pylist(
        [{"key": k, "start": s, "end": e, "tag": None, "v": v, "x": x} for k, s, e, v, x in rows],
        schema=delta_schema(spec))


@pytest.mark.parametrize("window", [WindowSpec("tumbling", 10), WindowSpec("sliding", 20, 10),
                                    WindowSpec()], ids=["tumbling", "sliding", "none"])
def test_spark_state_values_replace(tmp_path: Path, window: WindowSpec) -> None:
    spec = OperatorSpec("j", "op", "k", {"v": "long", "x": "double"}, window=window)
    assert spec.mode == "spark-state" and not spec.panes
    store = PartitionStore(tmp_path / "p", spec)
    size = window.size_ms

    def win(s: int) -> tuple[int | None, int | None]:
        return (s, s + size) if spec.windowed else (None, None)

    starts = [0, 10] if spec.windowed else [0]
    assert store.apply(0, 0, 1, value_delta(spec, [("k", *win(s), 5 + s, 0.5) for s in starts]
                                           + [("o", *win(0), 1, 1.0)]), 100)
    assert store.apply(1, 0, 1, value_delta(spec, [("k", *win(0), 2, None)]), 100)
    assert store.apply(2, 0, 1, value_delta(spec, [("k", *win(0), None, -1.5)]), 100)
    if spec.windowed:
        assert view(store.read("k", (-FAR, FAR))[1]) == [
            (0, size, [None, -1.5]), (10, 10 + size, [15, 0.5])]
        assert view(store.read("k")[1]) == [(10, 10 + size, [15, 0.5])]
    else:
        assert view(store.read("k")[1]) == [(None, None, [None, -1.5])]
    assert view(store.read("o")[1]) == [(*win(0), [1, 1.0])]
    check_index(store)


def test_merge_with_several_aggregates_of_one_kind(tmp_path: Path) -> None:
    spec = OperatorSpec("j", "op", "k", {
        "u1": Aggregate("approx_count_distinct", "long", 12), "n": Aggregate("count", "long"),
        "u2": Aggregate("approx_count_distinct", "long", 12)},
        window=WindowSpec("tumbling", 10))
    store = PartitionStore(tmp_path / "p", spec)
    def d(users1: range, users2: range, n: int) -> pa.Table:
        return pa.Table.from_pylist([{"key": "k", "start": 0, "end": 10, "tag": None,
                                      "u1": sketch(users1), "n": n, "u2": sketch(users2)}],
                                    schema=delta_schema(spec))

    store.apply(0, 0, 1, d(range(100), range(5), 3), None)
    store.apply(1, 0, 1, d(range(50, 300), range(5, 7), 4), None)
    [got] = store.read("k")[1]
    assert got.values[1] == 7
    assert got.values[0] == pytest.approx(300, rel=0.03)
    assert got.values[2] == 7


def test_aggregates_added_to_an_operator_begin_empty_beside_the_kept_ones(
        tmp_path: Path) -> None:
    """An operator restarted with aggregates added after its existing ones (docs/
    upgrading.md): values stored before read the added ones as empty (no value, a count of
    0, no sketch) and the kept ones as they were; a batch after adds to both. A reader
    still on the old spec (a router not yet refreshed) reads the kept ones right."""
    old = OperatorSpec("j", "op", "k", {"n": Aggregate("count", "long"),
                                        "s": Aggregate("sum", "long")},
                       window=WindowSpec("tumbling", 10))
    store = PartitionStore(tmp_path / "p", old)
    first = [{"key": k, "start": 0, "end": 10, "tag": None, "n": 2, "s": 5} for k in "ko"]
    store.apply(0, 0, 1, pa.Table.from_pylist(first, schema=delta_schema(old)), None)
    new = OperatorSpec("j", "op", "k", {**old.states, "m": Aggregate("max", "double"),
                                        "c": Aggregate("count", "long"),
                                        "u": Aggregate("approx_count_distinct", "long", 12)},
                       window=old.window)
    store.respec(new)
    assert view(store.read("k")[1]) == [(0, 10, [2, 5, None, 0, 0])]
    rows: list[dict[str, object]] = [
        {"key": k, "start": 0, "end": 10, "tag": None, "n": 1, "s": 1, "m": 1.5, "c": 3,
         "u": sketch(range(4))} for k in "kj"]
    store.apply(1, 0, 1, pa.Table.from_pylist(rows, schema=delta_schema(new)), None)
    assert view(store.read("k")[1]) == [(0, 10, [3, 6, 1.5, 3, 4])]
    assert view(store.read("j")[1]) == [(0, 10, [1, 1, 1.5, 3, 4])]
    assert view(store.read("o")[1]) == [(0, 10, [2, 5, None, 0, 0])]
    stale = read_windows(store.db, Codec(old), "k", (-FAR, FAR))[1]
    assert view(stale) == [(0, 10, [3, 6])]
    check_index(store)


def test_partitions_are_written_in_the_one_codec_every_reader_has(tmp_path: Path) -> None:
    """snappy, the only codec the read engine's RocksDB is built with (engine/core/Cargo.toml),
    at every level: a table file in another could not be read by a router."""
    w = WindowSpec("tumbling", 10)
    store = PartitionStore(tmp_path / "p", make_spec(w))
    run(store, SparkModel(w), [([ev("k", t) for t in range(50)], 10)])
    store.db.flush()
    store.close()
    [options] = sorted((tmp_path / "p").glob("OPTIONS-*"))[-1:]
    said = dict(line.strip().split("=", 1) for line in options.read_text().splitlines()
                if "=" in line and line.strip().split("=", 1)[0] in
                ("compression", "bottommost_compression"))
    assert said == {"compression": "kSnappyCompression",
                    "bottommost_compression": "kDisableCompressionOption"}  # i.e. the same
