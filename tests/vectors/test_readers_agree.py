"""One value layout, two readers (docs/architecture.md §5, "Value layout"), as a property
beside the committed vectors of ``test_vectors.py``: the bytes the
shard's encoder writes (``qstate.partition.codec``, Python) decoded by the shard's own Python
and by the read engine (``qstate._engine``, Rust) must give the same answers, for every
aggregate kind and edge: a long sum saturated at either bound, absent values, NaN and ±inf
and -0.0 doubles, HyperLogLog sketches, values written before aggregates were added, and
the panes of a sliding window folded into one (numpy's arithmetic, bit for bit)."""

from __future__ import annotations

import math
import struct
from typing import cast

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from qstate._engine import answer_json, decode_value
from qstate.core.records.operator import AggKind, Aggregate, OperatorSpec, StateType, WindowSpec
from qstate.partition.codec import INT64_MAX, INT64_MIN, OVERFLOWED, Codec
from tests.service.shard.sim import sketch

# what a job can declare (qstate.jobs.aggregates): counts and sketches answer longs, averages
# doubles, the others the type of their column; Spark-state values, never mixed with those
MERGED = [("count", "long"), ("sum", "long"), ("sum", "double"), ("min", "long"),
          ("max", "long"), ("min", "double"), ("max", "double"), ("avg", "double"),
          ("approx_count_distinct", "long")]
VALUES = [("value", "long"), ("value", "double")]
EDGE_LONGS = [0, 1, -1, INT64_MAX, INT64_MIN, INT64_MAX - 1, INT64_MIN + 1, 2**53 + 1]
EDGE_DOUBLES = [0.0, -0.0, 1.5, -2.25, math.inf, -math.inf, math.nan, 5e-324, 1e308, 1e16,
                1e-7, 0.1]


def spec_of(aggs: list[tuple[str, str]], window: WindowSpec) -> OperatorSpec:
    def agg(kind: str, ty: str) -> Aggregate:  # an HLL's precision: 12
        return Aggregate(cast(AggKind, kind), cast(StateType, ty),
                         12 if kind == "approx_count_distinct" else 0)

    states = {f"a{i}": agg(kind, ty) for i, (kind, ty) in enumerate(aggs)}
    return OperatorSpec("j", "o", "k", states, window=window)


@st.composite
def records(draw: st.DrawFn, codec: Codec, n: int) -> tuple[np.ndarray, list[list]]:
    """``n`` stored records of ``codec``'s operator: any value in every field, the edges
    above among them, sketches of small and large sets or none."""
    rec = np.zeros(n, codec.dtype)
    for name in codec.dtype.names or ():
        kind = codec.dtype[name]
        for i in range(n):
            if kind == np.uint8:
                rec[name][i] = draw(st.sampled_from([0, 1, OVERFLOWED]))
            elif kind == np.int64:
                rec[name][i] = draw(st.one_of(st.sampled_from(EDGE_LONGS),
                                              st.integers(-(10**12), 10**12)))
            else:
                rec[name][i] = draw(st.one_of(st.sampled_from(EDGE_DOUBLES),
                                              st.floats(allow_nan=True)))
    blobs = [[draw(st.one_of(st.none(), st.builds(lambda lo, k: sketch(range(lo, lo + k)),
                                                  st.integers(0, 10**6),
                                                  st.integers(1, 3000))))
              for _ in range(n)] for _ in codec.sketches]
    return rec, blobs


def same(a: object, b: object) -> bool:
    """Equal as a client reads them: the same type, and doubles bit for bit (NaN is NaN)."""
    if isinstance(a, float) and isinstance(b, float):
        return struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and
                                                                math.isnan(b))
    return type(a) is type(b) and a == b


def python_answers(codec: Codec, values: list[bytes]) -> list[int | float | None]:
    """What the shard's Python reads of one value, or of several folded as panes."""
    if len(values) == 1 and not codec.spec.panes:
        return codec.answers_of(values[0])[1]
    recs, _, blobs = codec.decode(values)
    rec, rec_blobs = codec.fold(recs, blobs)
    return codec.answers(rec, rec_blobs)


MERGED_AGGS = st.lists(st.sampled_from(MERGED), min_size=1, max_size=5)
AGGS = st.one_of(MERGED_AGGS, st.lists(st.sampled_from(VALUES), min_size=1, max_size=3))


@given(AGGS, st.data())
def test_one_stored_value_reads_the_same_in_python_and_rust(aggs: list[tuple[str, str]],
                                                             data: st.DataObject) -> None:
    spec = spec_of(aggs, WindowSpec("tumbling", 60_000))
    codec = Codec(spec)
    rec, blobs = data.draw(records(codec, 1))
    [value] = codec.encode(rec, blobs)
    end, answers = codec.answers_of(value)
    for i, want in enumerate(answers):
        got_end, got = decode_value(spec.to_json(), i, [value])
        assert got_end == end
        assert same(got, want), (spec.states, i, got, want)


@given(MERGED_AGGS, st.integers(1, 40), st.data())
def test_panes_fold_the_same_in_python_and_rust(aggs: list[tuple[str, str]], n: int,
                                                 data: st.DataObject) -> None:
    """A sliding window's panes (up to 40: numpy's pairwise sum changes its steps at 8)."""
    spec = spec_of(aggs, WindowSpec("sliding", 60_000, 10_000))
    codec = Codec(spec)
    rec, blobs = data.draw(records(codec, n))
    values = codec.encode(rec, blobs)
    for i, want in enumerate(python_answers(codec, values)):
        _, got = decode_value(spec.to_json(), i, values)
        assert same(got, want), (spec.states, i, got, want)


@given(st.lists(st.sampled_from([k for k in MERGED if k[0] != "approx_count_distinct"]),
                min_size=1, max_size=4), st.data())
def test_a_value_written_before_aggregates_were_added(aggs: list[tuple[str, str]],
                                                      data: st.DataObject) -> None:
    """Written with the first aggregates only, read with all: the added ones read as no value
    (a count of 0, no sketch), by both readers (docs/upgrading.md; an operator with a sketch
    takes no added aggregates, its sketch ends each value)."""
    old_spec = spec_of(aggs[:1], WindowSpec("tumbling", 60_000))
    spec = spec_of([*aggs, ("count", "long"), ("sum", "double"),
                    ("approx_count_distinct", "long")], WindowSpec("tumbling", 60_000))
    old = Codec(old_spec)
    rec, blobs = data.draw(records(old, 1))
    [value] = old.encode(rec, blobs)
    _, answers = Codec(spec).answers_of(value)
    for i, want in enumerate(answers):
        _, got = decode_value(spec.to_json(), i, [value])
        assert same(got, want), (i, got, want)


def test_the_edges_by_name() -> None:
    """The cases a reader gets wrong first, named: a saturated sum stays at its bound, an
    absent value is None, an empty sketch is 0, an average of nothing is None."""
    spec = spec_of([("sum", "long"), ("sum", "double"), ("avg", "double"),
                    ("approx_count_distinct", "long")], WindowSpec("sliding", 60_000, 10_000))
    codec = Codec(spec)
    rec = np.zeros(3, codec.dtype)
    rec["a0"] = [INT64_MAX - 5, 10, 1]
    rec["a0__has"] = [1, 1, 1]
    rec["a1"] = [1.5, -0.0, 2.0]
    rec["a1__has"] = [1, 0, 1]
    values = codec.encode(rec, [[sketch(range(100)), None, sketch(range(50, 200))]])
    assert [decode_value(spec.to_json(), i, values)[1] for i in range(4)] == \
        python_answers(codec, values) == [INT64_MAX, 3.5, None, 200]


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_a_double_is_written_as_orjson_writes_it(v: float) -> None:
    """The read core writes an answer's doubles as orjson writes the router's other answers
    (any double, beside the fixed ones of json.json)."""
    import orjson

    got = answer_json("j", "o", "s", "k", True, 0, 0, [(None, None, v)], None)
    assert b'"value":' + orjson.dumps(v) + b"}]" in got
