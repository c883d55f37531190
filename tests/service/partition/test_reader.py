"""``qstate.partition.reader.read_windows`` on a real partition store: range reads ``[from, to)``
with limits, the latest window, sliding windows assembled from (sub-)panes, keys kept apart,
against the brute-force Spark model of ``sim``."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qstate.core.records.operator import WindowSpec
from qstate.partition.codec import Codec
from qstate.partition.reader import Meta, WindowValue, read_many, read_windows
from qstate.shard.store import PartitionStore
from tests.service.shard.sim import (
    FAR,
    KEYS,
    SETTINGS,
    Batches,
    SparkModel,
    assert_answers,
    ev,
    make_spec,
    run,
    scenarios,
    scratch,
)

queries = st.lists(st.tuples(st.integers(-150, 400), st.integers(1, 300), st.integers(1, 6)),
                   min_size=1, max_size=8)


def spans(ws: list[WindowValue]) -> list[tuple[int | None, int | None]]:
    return [(w.start, w.end) for w in ws]


# ---- range reads against the model ----------------------------------------------------------
def check_ranges(case: tuple[WindowSpec, Batches],
                 qs: list[tuple[int, int, int]]) -> None:
    w, batches = case
    with scratch() as d:
        store = PartitionStore(Path(d) / "p", make_spec(w))
        model = SparkModel(w)
        try:
            run(store, model, batches)
            expected = model.expected()
            for k in KEYS:
                want = expected.get(k, {})
                starts = sorted(s for s in want if s is not None)
                for lo, width, limit in qs:
                    hi = lo + width
                    meta, got = read_windows(store.db, store.codec, k, (lo, hi), limit)
                    assert meta == store.meta
                    in_range = [s for s in starts if lo <= s < hi][:limit]
                    assert spans(got) == [(s, want[s][0]) for s in in_range], (k, lo, hi, limit)
                    for x in got:
                        assert_answers(x.values, want[x.start][1], (k, x.start))
                _, latest = read_windows(store.db, store.codec, k)
                assert spans(latest) == [(s, want[s][0]) for s in starts[-1:]]
            # many keys through one iterator read what each reads alone, in their order
            keys = [*reversed(KEYS), "never-seen", KEYS[0]]
            for rng in [None, *((lo, lo + width) for lo, width, _ in qs)]:
                meta, many = read_many(store.db, store.codec, keys, rng, 3)
                assert meta == store.meta
                assert many == [read_windows(store.db, store.codec, k, rng, 3)[1] for k in keys]
                # the batch known (a secondary between catch-ups): no snapshot, same answer
                assert read_many(store.db, store.codec, keys, rng, 3, store.meta) == (meta, many)
        finally:
            store.close()


# @given on the parametrized test itself, drawing its kind's scenario: each kind then has a
# key of its own in the example database, where a failure is saved and replayed (sim.SETTINGS)
@pytest.mark.parametrize("kind", ["tumbling", "sliding", "session"])
@SETTINGS
@given(data=st.data())
def test_random_range_reads(kind: str, data: st.DataObject) -> None:
    check_ranges(data.draw(scenarios(kind), "case"), data.draw(queries, "queries"))


# ---- particular cases ---------------------------------------------------------------------
def test_an_empty_partition_reads_nothing(tmp_path: Path) -> None:
    for w in (WindowSpec("sliding", 50, 20), WindowSpec("tumbling", 10), WindowSpec()):
        store = PartitionStore(tmp_path / w.kind, make_spec(w))  # no batch yet: no meta
        codec = Codec(store.spec)
        assert read_windows(store.db, codec, "k") == (Meta(), [])
        assert read_windows(store.db, codec, "k", (-FAR, FAR)) == (Meta(), [])
        store.close()


def test_keys_that_prefix_each_other_stay_apart(tmp_path: Path) -> None:
    for w in (WindowSpec("tumbling", 10), WindowSpec("sliding", 10, 5),
              WindowSpec("session", gap_ms=10), WindowSpec()):
        store = PartitionStore(tmp_path / w.kind, make_spec(w))
        model = SparkModel(w)
        keys = ["a", "ab", "a\x00", "", "é", "a" * 300]
        run(store, model, [([ev(k, 10 * i + n) for i, k in enumerate(keys) for n in range(i + 1)],
                            0)])
        for k in [*keys, "b", "a\x00\x00"]:
            want = model.expected().get(k, {})
            _, latest = store.read(k)
            if w.kind != "none":
                _, got = store.read(k, (-FAR, FAR))
                assert spans(got) == [(s, want[s][0]) for s in sorted(want)], (w, k)  # type: ignore[type-var]
            for x in latest:
                assert x.values[0] == len(want[x.start][1]), (w, k)
            assert len(latest) == (1 if want else 0)
        store.close()


def test_sliding_windows_from_sub_panes_keep_closed_windows_unchanged(tmp_path: Path) -> None:
    """size 50, slide 20, pane 10: a row late for its older windows goes to a sub-pane that
    only the still-open windows count."""
    w = WindowSpec("sliding", 50, 20)
    store = PartitionStore(tmp_path / "p", make_spec(w))
    model = SparkModel(w)
    run(store, model, [([ev("k", 5), ev("k", 25), ev("k", 45)], 30)])
    before = {x.start: x.values[0] for x in store.read("k", (-FAR, FAR))[1]}
    assert before == {-40: 1, -20: 2, 0: 3, 20: 2, 40: 1}
    # batch 1 drops against watermark 30: windows -40 (end 10) and -20 (end 30) are closed;
    # t=5 (windows -40, -20, 0) and t=15 (-20, 0) count in 0 only, t=29 in 0 and 20, t=-15
    # (windows -60, -40, -20) in nothing
    run(store, model, [([ev("k", 5), ev("k", 15), ev("k", -15), ev("k", 29)], 60)], first=1)
    after = {x.start: x.values[0] for x in store.read("k", (-FAR, FAR))[1]}
    assert after == {-40: 1, -20: 2, 0: 6, 20: 3, 40: 1}
    # a range starting mid-slide starts at the next window start; a limit keeps the oldest
    assert spans(store.read("k", (-19, 41))[1]) == [(0, 50), (20, 70), (40, 90)]
    assert spans(store.read("k", (-40, FAR), limit=2)[1]) == [(-40, 10), (-20, 30)]
    assert spans(store.read("k", (41, FAR))[1]) == []
    assert spans(store.read("k")[1]) == [(40, 90)]
    # batch 2 drops against 60: windows from 20 (end 70) are open, window 0 stays at 6; t=5 is
    # dropped, t=45 counts in 20 and 40, t=65 in 20, 40 and 60
    run(store, model, [([ev("k", 5), ev("k", 45), ev("k", 65)], 60)], first=2)
    got = {x.start: x.values[0] for x in store.read("k", (-FAR, FAR))[1]}
    assert got == {-40: 1, -20: 2, 0: 6, 20: 5, 40: 3, 60: 1}
    for x in store.read("k", (-FAR, FAR))[1]:
        assert_answers(x.values, model.expected()["k"][x.start][1], x.start)
    assert spans(store.read("k")[1]) == [(60, 110)]


def test_the_whole_int64_range_can_be_read(tmp_path: Path) -> None:
    """A client may ask for [-2**63, 2**63 - 1): the widest range a proto int64 holds."""
    lo, hi = -(1 << 63), (1 << 63) - 1
    for w in (WindowSpec("tumbling", 10), WindowSpec("session", gap_ms=10),
              WindowSpec("sliding", 10, 5)):
        store = PartitionStore(tmp_path / w.kind, make_spec(w))
        run(store, SparkModel(w), [([ev("k", 7)], 0)])
        assert [x.start for x in store.read("k", (lo, hi))[1]] == (
            [0, 5] if w.kind == "sliding" else [0 if w.kind == "tumbling" else 7]), w
        store.close()


def test_meta_is_the_batch_read(tmp_path: Path) -> None:
    w = WindowSpec("tumbling", 10)
    spec = make_spec(w)
    store = PartitionStore(tmp_path / "p", spec)
    model = SparkModel(w)
    run(store, model, [([ev("k", 1)], 5), ([], 17)])
    meta, _ = read_windows(store.db, store.codec, "nobody")
    assert (meta.last_batch, meta.watermark_ms, meta.epoch) == (1, 17, 1)
