"""Top-N of a partition (``qstate.partition.rank``) on a real partition store, against the
brute-force Spark model of ``sim``: every window's N largest and smallest keys of every
ranked state, ties by key, after late events, retention and a rebuild of the index."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from qstate.core.errors import InvalidRequest, TooLarge
from qstate.core.records.operator import Aggregate, WindowSpec
from qstate.partition import layout, rank, ranking
from qstate.partition.layout import RANK
from qstate.partition.meta import encode_meta
from qstate.shard.store import PartitionStore
from tests.service.shard.sim import (
    SETTINGS,
    STATES,
    Batches,
    Event,
    SparkModel,
    answers,
    ev,
    make_spec,
    raw_items,
    run,
    scenarios,
    scratch,
)

RANKED = [i for i, a in enumerate(STATES.values()) if a.kind in ranking.RANKED_KINDS]
SCAN_ALL = 1 << 30


Expected = dict[str, dict[int | None, tuple[int | None, list[Event]]]]


def truth(expected: Expected, state: int, start: int | None, n: int,
          descending: bool) -> list[tuple[str, float]]:
    """The top ``n`` of one window from the events Spark counted: value order, then key."""
    vals = []
    for k, windows in expected.items():
        if start in windows:
            v = answers(windows[start][1])[state]
            if v is not None:
                vals.append((k, v))
    vals.sort(key=lambda kv: ((-kv[1] if descending else kv[1]), kv[0]))
    return vals[:n]


def read_top(store: PartitionStore, state: int, start: int, n: int,
             descending: bool) -> list[tuple[str, float]]:
    if store.panes:
        got = rank.scan_top(store.db, store.codec, state, start, n, descending, store.meta,
                            SCAN_ALL)
    else:
        got = rank.top(store.db, store.spec, state, start, n, descending)
    return [(r.key, r.value) for r in got]


def same(got: list[tuple[str, float]], want: list[tuple[str, float]], where: object) -> None:
    assert [k for k, _ in got] == [k for k, _ in want], (where, got, want)
    for (_, g), (_, w) in zip(got, want, strict=True):
        assert g == pytest.approx(w, rel=1e-9), (where, got, want)


def cuts(ranked: int) -> list[int]:
    """The n asked of a window whose ranking holds ``ranked`` keys: the first, all but the
    last (cuts, where the walk back meets the ties at the cut), all, and more than there are.
    A window of the scenarios holds a few of sim.KEYS: a fixed n such as 10 would never cut
    it."""
    return sorted({1, max(ranked - 1, 1), max(ranked, 1), ranked + 1})


def check_all(store: PartitionStore, model: SparkModel, retention_ms: int | None = None) -> None:
    expected = model.expected(retention_ms)
    starts = {s for ws in expected.values() for s in ws}
    starts.add(None if not store.spec.windowed
               else ranking.current_start(store.spec, store.meta.watermark_ms))
    for start in starts:
        at = layout.NO_WINDOW if start is None else start
        for state in RANKED:
            for desc in (True, False):
                whole = truth(expected, state, start, SCAN_ALL, desc)
                for n in cuts(len(whole)):
                    same(read_top(store, state, at, n, desc), whole[:n], (start, state, n, desc))


def check_scenario(case: tuple[WindowSpec, Batches], retention_ms: int | None = None) -> None:
    w, batches = case
    with scratch() as d:
        spec = make_spec(w, retention_ms=retention_ms)
        store = PartitionStore(Path(d) / "p", spec)
        model = SparkModel(w)
        try:
            run(store, model, batches, retention_ms)
            check_all(store, model, retention_ms)
        finally:
            store.close()


@given(scenarios("tumbling"))
@SETTINGS
def test_tumbling_top_n_is_sparks(case: tuple[WindowSpec, Batches]) -> None:
    check_scenario(case)


@given(scenarios("sliding"))
@SETTINGS
def test_sliding_top_n_is_sparks(case: tuple[WindowSpec, Batches]) -> None:
    check_scenario(case)


@given(scenarios("none"))
@SETTINGS
def test_unwindowed_top_n_is_sparks(case: tuple[WindowSpec, Batches]) -> None:
    check_scenario(case)


@given(scenarios("tumbling", max_jump=40), st.integers(0, 30))
@SETTINGS
def test_retention_drops_ranks_of_expired_windows(case: tuple[WindowSpec, Batches],
                                                  retention: int) -> None:
    w, batches = case
    with scratch() as d:
        store = PartitionStore(Path(d) / "p", make_spec(w, retention_ms=retention))
        model = SparkModel(w)
        try:
            run(store, model, batches, retention)
            check_all(store, model, retention)
            cutoff = store.meta.watermark_ms - retention
            for k, _ in raw_items(store):
                if not k.startswith(RANK):
                    continue
                start = layout.dec_time(k[2:10])
                assert start + w.size_ms > cutoff, f"rank entry of an expired window: {k!r}"
        finally:
            store.close()


def test_ties_at_the_cut_go_by_key_ascending() -> None:
    """Many keys share the value at the N-th place: the walk back meets them in descending
    key order; the answer has the smallest keys of the tie, after every larger value."""
    w = WindowSpec("tumbling", 100)
    keys = [f"k{i:02d}" for i in range(30)]
    events = [ev(k, 5) for k in keys] + [ev("k29", 6), ev("k29", 7), ev("k17", 8)]
    with scratch() as d:
        store = PartitionStore(Path(d) / "p", make_spec(w))
        model = SparkModel(w)
        try:
            run(store, model, [(events, 1)])
            got = read_top(store, 0, 0, 5, True)
            assert got == [("k29", 3), ("k17", 2), ("k00", 1), ("k01", 1), ("k02", 1)]
            assert read_top(store, 0, 0, 3, False) == [("k00", 1), ("k01", 1), ("k02", 1)]
            check_all(store, model)
        finally:
            store.close()


def test_keys_another_partition_owns_are_passed_over_within_a_bound() -> None:
    """A partition split by a rescale still holds the keys that moved (as they were then):
    its board passes them over, in either order and at the ties, and says so past the
    bound rather than walk the whole window."""
    w = WindowSpec("tumbling", 100)
    counts = {f"k{i:02d}": 1 + i % 4 for i in range(40)}  # ties at every value
    events = [ev(k, 5) for k, c in counts.items() for _ in range(c)]
    moved = {k for k in counts if int(k[1:]) % 3 == 0}  # what another partition now owns
    with scratch() as d:
        store = PartitionStore(Path(d) / "p", make_spec(w))
        try:
            run(store, SparkModel(w), [(events, 1)])
            mine = {k: c for k, c in counts.items() if k not in moved}
            for n in (1, 5, 12, 40):
                for desc in (True, False):
                    want = sorted(mine.items(), key=lambda kv: (-kv[1] if desc else kv[1],
                                                                kv[0]))[:n]
                    got = rank.top(store.db, store.spec, 0, 0, n, desc,
                                   lambda k: k not in moved, max_skipped=len(moved))
                    assert [(r.key, r.value) for r in got] == want, (n, desc)
            with pytest.raises(TooLarge, match="before a rescale"):
                rank.top(store.db, store.spec, 0, 0, 40, True, lambda k: k not in moved,
                         max_skipped=3)
        finally:
            store.close()


def test_values_keep_their_order_through_the_rank() -> None:
    """Negative, zero, huge and NaN/inf values of longs and doubles rank as Spark orders them
    (NaN above every number), and come back as the same values."""
    spec = make_spec(WindowSpec(), {"l": Aggregate("max", "long"), "d": Aggregate("max", "double")})
    longs = np.array([-(1 << 63), -5, -1, 0, 1, 7, (1 << 63) - 1], np.int64)
    doubles = np.array([-math.inf, -1e300, -1.5, -0.0, 0.0, 1e-300, 2.5, math.inf, math.nan])
    for state, vals in ((0, longs), (1, doubles)):
        name = list(spec.states)[state]
        rec = np.zeros(len(vals), [("end", "<i8"), ("l", "<i8"), ("l__has", "u1"), ("d", "<f8"),
                                   ("d__has", "u1")])
        rec[name], rec[f"{name}__has"] = vals, 1
        ranks, has = ranking.ranks_of(spec, rec, state)
        assert has.all()
        a = list(spec.states.values())[state]
        back = [ranking.value_of_rank(a, int(r)) for r in ranks]
        # the scalar rank the router merges by is the one the index sorts by
        assert [ranking.rank_of(a, v) for v in vals.tolist()] == [int(r) for r in ranks]
        for got, want in zip(back, vals.tolist(), strict=True):
            assert got == want or (math.isnan(got) and math.isnan(want))
        # in order, strictly but for -0.0 and 0.0, which are one value
        steps = [int(ranks[i + 1]) - int(ranks[i]) for i in range(len(vals) - 1)]
        assert all(s > 0 for s in steps) if state == 0 else \
            [s > 0 for s in steps] == [True, True, True, False, True, True, True, True]


def test_sessions_and_sketches_are_refused_with_why() -> None:
    with pytest.raises(InvalidRequest, match="session windows"):
        ranking.check_top(make_spec(WindowSpec("session", gap_ms=5)), "n")
    with pytest.raises(InvalidRequest, match="approx_count_distinct"):
        ranking.check_top(make_spec(WindowSpec("tumbling", 10)), "u")
    assert ranking.check_top(make_spec(WindowSpec("tumbling", 10)), "s") == 1


def test_a_sliding_window_with_too_many_keys_is_too_large() -> None:
    w = WindowSpec("sliding", 20, 10)
    with scratch() as d:
        store = PartitionStore(Path(d) / "p", make_spec(w))
        try:
            run(store, SparkModel(w), [([ev(f"k{i}", 5) for i in range(5)], 1)])
            with pytest.raises(TooLarge, match="QSTATE_MAX_TOP_SCAN_KEYS"):
                rank.scan_top(store.db, store.codec, 0, 0, 3, True, store.meta, 4)
            assert len(rank.scan_top(store.db, store.codec, 0, 0, 3, True, store.meta, 5)) == 3
        finally:
            store.close()


def test_a_shard_without_the_rank_index_refuses_top_n_and_indexes_when_turned_on() -> None:
    w = WindowSpec("tumbling", 10)
    with scratch() as d:
        path, spec = Path(d) / "p", make_spec(w)
        store = PartitionStore(path, spec, rank_index=False)
        model = SparkModel(w)
        run(store, model, [([ev("a", 1), ev("b", 2), ev("b", 3)], 1)])
        assert not [k for k, _ in raw_items(store) if k.startswith(RANK)]  # nothing written
        with pytest.raises(InvalidRequest, match="QSTATE_RANK_INDEX"):
            rank.read_top(store.db, store.codec, 0, 0, 3, True, SCAN_ALL)
        store.close()
        store = PartitionStore(path, spec)
        try:
            assert rank.read_top(store.db, store.codec, 0, 0, 3, True, SCAN_ALL)[2] == [
                ranking.Ranked("b", 2), ranking.Ranked("a", 1)]
            check_all(store, model)
        finally:
            store.close()


def test_a_partition_kept_before_the_rank_index_is_indexed_when_opened() -> None:
    w = WindowSpec("tumbling", 10)
    batches: Batches = [([ev(k, t) for k in ("a", "b", "c") for t in range(0, 30, 3)
                          if hash((k, t)) % 3], 5), ([ev("b", 12), ev("c", 25)], 12)]
    with scratch() as d:
        path = Path(d) / "p"
        spec = make_spec(w)
        store = PartitionStore(path, spec)
        model = SparkModel(w)
        run(store, model, batches)
        # as an older writer left it: no rank entries, a meta without the index's version
        store.db.delete_range(RANK, RANK + b"\xff")
        store.db.put(layout.META, encode_meta(replace(store.meta, ranks=0)))
        assert rank.top(store.db, spec, 0, 0, 3) == []
        store.close()
        store = PartitionStore(path, spec)
        try:
            assert store.meta.ranks == rank.VERSION
            check_all(store, model)
        finally:
            store.close()
