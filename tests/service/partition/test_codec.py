"""``qstate.partition.codec``: how a batch's partial aggregates combine with the stored ones,
checked against expectations computed independently in plain Python."""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from qstate.core.records.delta import delta_schema
from qstate.core.records.operator import Aggregate, OperatorSpec, WindowSpec
from qstate.partition.codec import Codec
from tests.service.shard.sim import sketch

MERGED = OperatorSpec("j", "o", "k", {
    "c": Aggregate("count", "long"),
    "sl": Aggregate("sum", "long"),
    "sd": Aggregate("sum", "double"),
    "mnl": Aggregate("min", "long"),
    "mxl": Aggregate("max", "long"),
    "mnd": Aggregate("min", "double"),
    "mxd": Aggregate("max", "double"),
    "av": Aggregate("avg", "double"),
    "u": Aggregate("approx_count_distinct", "long", 12),
}, window=WindowSpec("tumbling", 10))
NUMERIC = ["sl", "sd", "mnl", "mxl", "mnd", "mxd"]


class Part:
    """One partial aggregate of a group of rows, and the raw rows it came from."""

    def __init__(self, rng: random.Random) -> None:
        self.n = rng.randint(0, 50)
        self.ints: list[int] = [rng.randint(-10**6, 10**6) for _ in range(rng.randint(0, 4))]
        self.floats: list[float] = [rng.uniform(-1e3, 1e3) for _ in range(rng.randint(0, 4))]
        lo = rng.randint(0, 3000)
        self.users = list(range(lo, lo + rng.randint(0, 1500)))

    def row(self, start: int) -> dict[str, Any]:
        ints, fl = self.ints, self.floats
        return {
            "key": "k", "start": start, "end": start + 10, "tag": None,
            "c": self.n,
            "sl": sum(ints) if ints else None, "sd": sum(fl) if fl else None,
            "mnl": min(ints) if ints else None, "mxl": max(ints) if ints else None,
            "mnd": min(fl) if fl else None, "mxd": max(fl) if fl else None,
            "av__sum": sum(fl) if fl else None, "av__n": len(fl),
            "u": sketch(self.users),
        }


def table(rows: list[dict[str, Any]], spec: OperatorSpec = MERGED) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=delta_schema(spec))


def expected(parts: list[Part]) -> dict[str, Any]:
    """The aggregates of all the parts' rows together, computed from the rows."""
    ints = [x for p in parts for x in p.ints]
    fl = [x for p in parts for x in p.floats]
    return {
        "c": sum(p.n for p in parts),
        "sl": sum(ints) if ints else None, "sd": math.fsum(fl) if fl else None,
        "mnl": min(ints) if ints else None, "mxl": max(ints) if ints else None,
        "mnd": min(fl) if fl else None, "mxd": max(fl) if fl else None,
        "av": math.fsum(fl) / len(fl) if fl else None,
        "u": len({u for p in parts for u in p.users}),
    }


def check(answer: list[int | float | None], want: dict[str, Any]) -> None:
    got = dict(zip(MERGED.states, answer, strict=True))
    for name in ("c", "sl", "mnl", "mxl", "mnd", "mxd"):
        assert got[name] == want[name], name
        if want[name] is not None:
            kind = int if MERGED.states[name].type == "long" else float
            assert type(got[name]) is kind, name
    for name in ("sd", "av"):
        if want[name] is None:
            assert got[name] is None, name
        else:
            assert got[name] == pytest.approx(want[name], rel=1e-9, abs=1e-6), name
    true_u = want["u"]
    assert got["u"] == pytest.approx(true_u, rel=0.04, abs=1), (got["u"], true_u)


@pytest.mark.parametrize("seed", range(6))
def test_combine_matches_the_rows_aggregated_at_once(seed: int) -> None:
    rng = random.Random(seed)
    codec = Codec(MERGED)
    n = 40
    olds = [Part(rng) for _ in range(n)]
    news = [Part(rng) for _ in range(n)]
    present = [rng.random() < 0.7 for _ in range(n)]
    # stored values go through bytes, absent ones are None (as a RocksDB multi-get answers)
    rec, blobs = codec.from_delta(table([p.row(10 * i) for i, p in enumerate(olds)]))
    encoded = codec.encode(rec, blobs)
    stored = [v if here else None for v, here in zip(encoded, present, strict=True)]
    old, old_present, old_blobs = codec.decode(stored)
    assert old_present.tolist() == present
    new, new_blobs = codec.from_delta(table([p.row(10 * i) for i, p in enumerate(news)]))
    out, out_blobs = codec.combine(old, old_present, old_blobs, new, new_blobs)
    assert out["end"].tolist() == [10 * i + 10 for i in range(n)]
    for i in range(n):
        parts = [olds[i], news[i]] if present[i] else [news[i]]
        check(codec.answers(out[i], [b[i] for b in out_blobs]), expected(parts))


def test_combine_nulls_keep_the_side_that_has_a_value() -> None:
    codec = Codec(MERGED)
    empty = {"key": "k", "start": 0, "end": 10, "tag": None, "c": 0, "sl": None, "sd": None,
             "mnl": None, "mxl": None, "mnd": None, "mxd": None, "av__sum": None, "av__n": 0,
             "u": sketch([])}
    full = {**empty, "c": 2, "sl": 5, "sd": 1.5, "mnl": -3, "mxl": 8, "mnd": -0.5, "mxd": 2.0,
            "av__sum": 3.0, "av__n": 2, "u": sketch([1, 2])}
    want_full = [2, 5, 1.5, -3, 8, -0.5, 2.0, 1.5, 2]
    present = np.ones(1, bool)
    for a, b, want in [(empty, full, want_full), (full, empty, want_full),
                       (empty, empty, [0, None, None, None, None, None, None, None, 0])]:
        old, old_blobs = codec.from_delta(table([a]))
        new, new_blobs = codec.from_delta(table([b]))
        out, blobs = codec.combine(old, present, old_blobs, new, new_blobs)
        assert codec.answers(out[0], [x[0] for x in blobs]) == want
    # an absent stored record (as decode gives it) counts for nothing
    new, new_blobs = codec.from_delta(table([empty]))
    zero, absent, none_blobs = codec.decode([None])
    assert not absent[0]
    out, blobs = codec.combine(zero, absent, none_blobs, new, new_blobs)
    assert codec.answers(out[0], [x[0] for x in blobs])[:8] == [
        0, None, None, None, None, None, None, None]


def test_min_max_of_negative_and_extreme_values() -> None:
    codec = Codec(MERGED)
    big = 2**62
    rows = [{"key": "k", "start": 0, "end": 10, "tag": None, "c": 1, "sl": big, "sd": -1e300,
             "mnl": -big, "mxl": -big, "mnd": -1e300, "mxd": -1e300, "av__sum": 1.0,
             "av__n": 1, "u": None},
            {"key": "k", "start": 0, "end": 10, "tag": None, "c": 1, "sl": big - 1, "sd": 1e300,
             "mnl": -big + 1, "mxl": -big + 1, "mnd": 1e300, "mxd": 1e300, "av__sum": 2.0,
             "av__n": 1, "u": None}]
    rec, blobs = codec.from_delta(table(rows))
    acc, acc_blobs = codec.fold(rec, blobs)
    assert codec.answers(acc, acc_blobs) == [2, 2 * big - 1, 0.0, -big, -big + 1, -1e300, 1e300,
                                             1.5, 0]


def test_min_ignores_nan_as_spark_does() -> None:
    """Spark orders NaN above every other double: min(NaN, 1.0) is 1.0, max is NaN. A batch
    whose only value is NaN must not make the window's min NaN."""
    codec = Codec(MERGED)
    base = {"key": "k", "start": 0, "end": 10, "tag": None, "c": 1, "sl": None, "sd": None,
            "mnl": None, "mxl": None, "av__sum": None, "av__n": 0, "u": None}
    rec, blobs = codec.from_delta(table([{**base, "mnd": math.nan, "mxd": math.nan},
                                         {**base, "mnd": 1.0, "mxd": 1.0}]))
    acc, acc_blobs = codec.fold(rec, blobs)
    got = dict(zip(MERGED.states, codec.answers(acc, acc_blobs), strict=True))
    assert math.isnan(got["mxd"])  # type: ignore[arg-type]
    assert got["mnd"] == 1.0


def test_spark_state_values_are_replaced() -> None:
    spec = OperatorSpec("j", "o", "k", {"v": "long", "x": "double"},
                        window=WindowSpec("tumbling", 10))
    codec = Codec(spec)
    rows_old = [{"key": "k", "start": s, "end": s + 10, "tag": None, "v": v, "x": x}
                for s, v, x in [(0, 5, 0.5), (10, 7, None), (20, None, 2.5)]]
    rows_new = [{"key": "k", "start": s, "end": s + 10, "tag": None, "v": v, "x": x}
                for s, v, x in [(0, 1, None), (10, None, 3.5), (20, -4, 1.0)]]
    old, old_blobs = codec.from_delta(table(rows_old, spec))
    new, new_blobs = codec.from_delta(table(rows_new, spec))
    out, blobs = codec.combine(old, np.ones(3, bool), old_blobs, new, new_blobs)
    assert blobs == []
    assert [codec.answers(out[i], []) for i in range(3)] == [[1, None], [None, 3.5], [-4, 1.0]]
    # a value that is replaced by a smaller one is not kept as a max would be
    rec, rb = codec.fold(np.concatenate([new[:1], old[:1]]), [])
    assert codec.answers(rec, rb) == [5, 0.5]


TWO_SKETCHES = OperatorSpec("j", "o", "k", {
    "u1": Aggregate("approx_count_distinct", "long", 12),
    "c": Aggregate("count", "long"),
    "u2": Aggregate("approx_count_distinct", "long", 12),
    "mx": Aggregate("max", "double"),
}, window=WindowSpec("tumbling", 10))
NO_SKETCH = OperatorSpec("j", "o", "k", {
    "c": Aggregate("count", "long"), "s": Aggregate("sum", "long"),
    "a": Aggregate("avg", "double"), "mn": Aggregate("min", "double")})


@pytest.mark.parametrize("spec", [MERGED, TWO_SKETCHES, NO_SKETCH],
                         ids=["one-sketch", "two-sketches", "no-sketch"])
def test_encode_decode_round_trip(spec: OperatorSpec) -> None:
    rng = np.random.default_rng(7)
    codec = Codec(spec)
    n = 30
    rec = np.zeros(n, codec.dtype)
    for name in codec.dtype.names or ():
        if codec.dtype[name] == np.dtype("u1"):
            rec[name] = rng.integers(0, 2, n)
        elif codec.dtype[name].kind == "i":
            rec[name] = rng.integers(-2**62, 2**62, n)
        else:
            rec[name] = rng.normal(0, 1e6, n)
    blobs: list[list[bytes | None]] = [
        [None if i % 7 == 0 else sketch(range(i * (j + 1), i * (j + 2) + 5)) for i in range(n)]
        for j in range(len(codec.sketches))]
    values = codec.encode(rec, blobs)
    assert all(len(v) == codec.width for v in values) or codec.sketches
    with_absent = [None if i % 5 == 3 else v for i, v in enumerate(values)]
    back, present, back_blobs = codec.decode(with_absent)
    assert present.tolist() == [i % 5 != 3 for i in range(n)]
    for i in range(n):
        if present[i]:
            assert back[i].tobytes() == rec[i].tobytes()
            for b, bb in zip(blobs, back_blobs, strict=True):
                assert (bb[i] or None) == b[i]  # an empty sketch comes back empty
        else:
            assert back[i].tobytes() == bytes(codec.width)
            assert all(bb[i] is None for bb in back_blobs)
    assert codec.decode([])[0].shape == (0,)


def test_fold_of_many_records() -> None:
    rng = random.Random(3)
    codec = Codec(MERGED)
    parts = [Part(rng) for _ in range(60)]
    rec, blobs = codec.from_delta(table([p.row(0) for p in parts]))
    acc, acc_blobs = codec.fold(rec, blobs)
    check(codec.answers(acc, acc_blobs), expected(parts))
    # one record folds to itself
    one, one_blobs = codec.fold(rec[5:6], [b[5:6] for b in blobs])
    assert one.tobytes() == rec[5].tobytes() and one_blobs == [blobs[0][5]]


def test_sketch_union_estimate_is_close_to_the_true_distinct_count() -> None:
    codec = Codec(MERGED)
    rng = random.Random(11)
    # 40 batches of overlapping user ids: 0..~60k distinct
    sets = []
    for _ in range(40):
        lo = rng.randint(0, 50_000)
        sets.append(range(lo, lo + rng.randint(1, 10_000)))
    base = {"key": "k", "start": 0, "end": 10, "tag": None, "c": 1, "sl": None, "sd": None,
            "mnl": None, "mxl": None, "mnd": None, "mxd": None, "av__sum": None, "av__n": 0}
    rec, blobs = codec.from_delta(table([{**base, "u": sketch(s)} for s in sets]))
    acc, acc_blobs = codec.fold(rec, blobs)
    true = len({x for s in sets for x in s})
    est = codec.answers(acc, acc_blobs)[-1]
    assert isinstance(est, int)
    assert abs(est - true) <= 0.04 * true, (est, true)
    # union is idempotent: folding the result with its own inputs changes nothing
    again, again_blobs = codec.fold(np.concatenate([acc[None], rec]),
                                    [[acc_blobs[0], *blobs[0]]])
    assert codec.answers(again, again_blobs)[-1] == est


SUM = OperatorSpec("j", "o", "k", {"s": Aggregate("sum", "long")},
                   window=WindowSpec("tumbling", 10))
MAX, MIN = 2**63 - 1, -(2**63)


def saturating(values: list[int]) -> int:
    """The rule in plain Python: sum in order; once past int64, the bound crossed, for good."""
    total = 0
    for v in values:
        if v in (MAX, MIN):  # a partial that overflowed on its executor
            return v
        total += v
        if not MIN < total < MAX:
            return MAX if total > 0 else MIN
    return total


@pytest.mark.parametrize("values", [
    [MAX - 10, 100],  # over the top
    [MAX - 10, 100, -50],  # and it stays there: a wrapped sum would be negative
    [MIN + 5, -6, 1000],
    [2**62, 2**62, -(2**62)],  # over on the way, back in range after: still over
    [10, -20, 5],  # nothing to see
    [MAX, -1],  # an executor's saturated partial counts as overflowed
])
def test_a_long_sum_saturates_at_the_bound_it_crossed_and_stays(values: list[int]) -> None:
    """Never wraps (issue 25): batch after batch (combine) and pane after pane (fold) give the
    same answer, the one ``saturating`` computes."""
    codec = Codec(SUM)
    rows = [{"key": "k", "start": 0, "end": 10, "tag": None, "s": v} for v in values]
    rec, blobs = codec.from_delta(table(rows, SUM))
    acc = rec[:1].copy()
    present = np.ones(1, bool)
    for i in range(1, len(values)):
        acc, _ = codec.combine(acc, present, [], rec[i:i + 1], [])
    folded, _ = codec.fold(rec, blobs)
    want = saturating(values)
    assert codec.answers(acc[0], []) == [want]
    assert codec.answers(folded, []) == [want]
    # the store keeps it so: encoded, decoded, then a batch of -1 more
    stored, seen, _ = codec.decode(codec.encode(acc, []))
    minus_one, _ = codec.from_delta(table([{**rows[0], "s": -1}], SUM))
    again, _ = codec.combine(stored, seen, [], minus_one, [])
    assert codec.answers(again[0], []) == [want if want in (MAX, MIN) else want - 1]


@pytest.mark.parametrize("seed", range(4))
def test_one_value_decodes_as_the_array_path_does(seed: int) -> None:
    """``answers_of`` (a point read, no numpy) equals ``answers(decode(...))`` for stored
    values of every aggregate kind, absent values and saturated sums included."""
    rng = random.Random(seed)
    codec = Codec(MERGED)
    rows = [Part(rng).row(rng.randrange(0, 1000) * 10) for _ in range(40)]
    rows += [{**rows[0], "sl": None, "mnl": None, "av__n": 0, "av__sum": None}]
    rec, blobs = codec.from_delta(table(rows))
    rec["sl__has"][-1] = 2  # a saturated long sum reads as its value
    for value in codec.encode(rec, blobs):
        arrays, _, bl = codec.decode([value])
        want = (int(arrays["end"][0]), codec.answers(arrays[0], [b[0] for b in bl]))
        assert codec.answers_of(value) == want


@pytest.mark.parametrize("added", [
    {"n2": Aggregate("count", "long"), "mx": Aggregate("max", "double")},
    {"u": Aggregate("approx_count_distinct", "long", 12), "a": Aggregate("avg", "double")},
], ids=["fixed fields", "a sketch"])
def test_values_stored_before_aggregates_were_added_read_them_as_empty(
        added: dict[str, Aggregate]) -> None:
    """A value written under the operator's older spec has its aggregates' fields first:
    read under the newer spec, each added aggregate is empty, beside values written under
    the newer one (the whole-array path and a point read); a newer value read under the
    older spec gives the older aggregates."""
    old = OperatorSpec("j", "o", "k", {"c": Aggregate("count", "long"),
                                       "s": Aggregate("sum", "long")},
                       window=WindowSpec("tumbling", 10))
    new = OperatorSpec("j", "o", "k", {**old.states, **added}, window=old.window)
    before = Codec(old).encode(Codec(old).from_delta(table(
        [{"key": "k", "start": 0, "end": 10, "tag": None, "c": 3, "s": 7}], old))[0], [])[0]
    codec = Codec(new)
    row = {"key": "k", "start": 0, "end": 10, "tag": None, "c": 1, "s": 2, "n2": 4, "mx": 0.5,
           "u": sketch(range(9)), "a__sum": 3.0, "a__n": 2}
    rec, blobs = codec.from_delta(table([row], new))
    after = codec.encode(rec, blobs)[0]
    empty = {"n2": 0, "mx": None, "u": 0, "a": None}
    full = {"n2": 4, "mx": 0.5, "u": 9, "a": 1.5}
    want_before = [3, 7] + [empty[n] for n in added]
    want_after = [1, 2] + [full[n] for n in added]
    records, present, got_blobs = codec.decode([before, None, after])
    assert list(present) == [True, False, True]
    for i, want in ((0, want_before), (2, want_after)):
        assert codec.answers(records[i], [b[i] for b in got_blobs]) == want
    assert codec.answers_of(before) == (10, want_before)
    assert codec.answers_of(after) == (10, want_after)
    stale = Codec(old)
    records, _, _ = stale.decode([after, before])
    assert [stale.answers(r, []) for r in records] == [[1, 2], [3, 7]]
    assert stale.answers_of(after) == (10, [1, 2])
