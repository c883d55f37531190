"""A brute-force model of Spark's windowed aggregation under its late-data rule, and the job
side's per-batch partial aggregates, to drive a real ``PartitionStore`` in tests.

The model keeps, per (key, window), the raw events Spark would have counted, and per key the
list of sessions; it knows nothing of panes, tags or the store's layout. The partials are
computed the way ``qstate.jobs.windows.assign`` and
``qstate.jobs.queryable.MergeOperator.partials`` do
(tumbling start ``t - t % size``; sliding: pane ``t - t % pane_ms`` tagged with
``windows.pane_tag``; sessions sessionized per batch, merged by the store).
"""

from __future__ import annotations

import math
import os
import tempfile
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import datasketches as ds
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, Phase, settings

from qstate.core.records.delta import delta_schema
from qstate.core.records.operator import Aggregate, OperatorSpec, WindowSpec
from qstate.core.windows import pane_tag
from qstate.partition import layout
from qstate.partition.reader import WindowValue
from qstate.shard.store import PartitionStore

FAR = 1 << 62
KEYS = ["a", "ab", "b", "ü✓", ""]

# key, event time (ms), a nullable value, a user id
Event = tuple[str, int, int | None, int]

STATES = {
    "n": Aggregate("count", "long"),  # count(*)
    "s": Aggregate("sum", "long"),
    "lo": Aggregate("min", "long"),
    "hi": Aggregate("max", "double"),
    "a": Aggregate("avg", "double"),
    "u": Aggregate("approx_count_distinct", "long", 12),
}


def make_spec(window: WindowSpec, states: dict[str, Any] | None = None,
              retention_ms: int | None = None) -> OperatorSpec:
    """The spec of an operator the tests drive; its retention is what they pass to apply."""
    if retention_ms is None:
        return OperatorSpec("j", "op", "k", dict(states or STATES), window=window)
    return OperatorSpec("j", "op", "k", dict(states or STATES), window=window,
                        retention_ms=retention_ms)


# randomized; a failing example is saved in the example database and replayed first by the
# next run (reuse), and printed with its @reproduce_failure blob (tests/conftest.py,
# docs/architecture.md §9). Not shrunk: a failure prints its whole example, and the targeted
# tests are the minimal cases. Each test needs a database key of its own (a test function of
# its own, or @given on the parametrized test itself): a replay that passes under another
# test's strategy deletes the example it replayed.
SETTINGS = settings(max_examples=20, deadline=None,
                    phases=[Phase.explicit, Phase.reuse, Phase.generate],
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def ev(key: str, t: int, v: int | None = 1, user: int = 0) -> Event:
    """An event: key, time, value (None: absent), user (for the distinct count)."""
    return (key, t, v, user)


def scratch() -> tempfile.TemporaryDirectory[str]:
    """A directory for a throw-away RocksDB: in memory where there is /dev/shm (the store
    syncs its WAL at every batch; hypothesis opens many stores)."""
    return tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)


# ---- aggregates of raw events ------------------------------------------------------------
def sketch(users: Iterable[int]) -> bytes:
    s = ds.hll_sketch(12, ds.tgt_hll_type.HLL_8)
    for u in users:
        s.update(u)
    out: bytes = s.serialize_updatable()
    return out


def answers(events: Sequence[Event]) -> list[int | float | None]:
    """What a client should read for these events, in STATES' order."""
    vals = [v for _, _, v, _ in events if v is not None]
    return [len(events), sum(vals) if vals else None, min(vals) if vals else None,
            float(max(vals)) if vals else None,
            math.fsum(vals) / len(vals) if vals else None, len({u for *_, u in events})]


def partial_columns(events: Sequence[Event]) -> dict[str, Any]:
    """One group's partial aggregates, as Spark's groupBy writes them to the delta."""
    vals = [v for _, _, v, _ in events if v is not None]
    return {"n": len(events), "s": sum(vals) if vals else None,
            "lo": min(vals) if vals else None, "hi": float(max(vals)) if vals else None,
            "a__sum": float(sum(vals)) if vals else None, "a__n": len(vals),
            "u": sketch(u for *_, u in events)}


def assert_answers(got: Sequence[int | float | None], events: Sequence[Event],
                   where: object = "") -> None:
    want = answers(events)
    n, s, lo, hi, a, u = got
    assert (n, s, lo, hi) == tuple(want[:4]), (where, got, want)
    assert (a is None) == (want[4] is None), (where, got, want)
    if a is not None:
        assert a == pytest.approx(want[4], rel=1e-9), (where, got, want)
    assert u == pytest.approx(want[5], rel=0.03, abs=1), (where, got, want)


# ---- the job side: one batch's delta -------------------------------------------------------
def sessionize(times_events: list[Event], gap: int) -> list[tuple[int, int, list[Event]]]:
    """Spark's session_window over one key's rows: touching sessions merge."""
    out: list[tuple[int, int, list[Event]]] = []
    for e in sorted(times_events, key=lambda e: e[1]):
        t = e[1]
        if out and t <= out[-1][1]:
            s, end, evs = out[-1]
            out[-1] = (s, max(end, t + gap), [*evs, e])
        else:
            out.append((t, t + gap, [e]))
    return out


def partials(spec: OperatorSpec, events: Sequence[Event], late_ms: int) -> pa.Table:
    """The delta the job writes for a batch whose late-data watermark is ``late_ms``."""
    w = spec.window
    groups: dict[tuple[str, int | None, int | None, int | None], list[Event]] = \
        defaultdict(list)
    if w.kind == "session":
        by_key: dict[str, list[Event]] = defaultdict(list)
        for e in events:
            if e[1] + w.gap_ms > late_ms:
                by_key[e[0]].append(e)
        for k, evs in by_key.items():
            for s, end, group in sessionize(evs, w.gap_ms):
                groups[(k, s, end, None)] = group
    for e in events if w.kind != "session" else ():
        k, t = e[0], e[1]
        if w.kind == "none":
            groups[(k, None, None, None)].append(e)
        elif w.kind == "tumbling":
            start = t - t % w.size_ms
            if start + w.size_ms > late_ms:
                groups[(k, start, start + w.size_ms, None)].append(e)
        else:
            g = w.pane_ms
            pane = t - t % g
            tag = pane_tag(pane, w.size_ms, w.slide_ms, late_ms)
            if tag is not None:
                groups[(k, pane, pane + g, tag)].append(e)
    rows = [{"key": k, "start": s, "end": end, "tag": tag, **partial_columns(evs)}
            for (k, s, end, tag), evs in groups.items()]
    return pa.Table.from_pylist(rows, schema=delta_schema(spec))


# ---- the Spark side, by brute force --------------------------------------------------------
def spark_windows(t: int, size: int, slide: int) -> list[int]:
    """Starts of every window containing t: multiples of slide s with s <= t < s + size."""
    return [s for s in range((t - size) // slide * slide, t + 1, slide) if s <= t < s + size]


@dataclass
class Session:
    start: int
    end: int
    events: list[Event] = field(default_factory=list)


@dataclass
class SparkModel:
    window: WindowSpec
    watermark: int = 0  # batch -1's watermark: what batch 0 drops against
    windows: dict[tuple[str, int | None], list[Event]] = field(
        default_factory=lambda: defaultdict(list))
    sessions: dict[str, list[Session]] = field(default_factory=lambda: defaultdict(list))

    def batch(self, events: Sequence[Event], watermark: int) -> None:
        late = self.watermark
        w = self.window
        if w.kind == "session":
            self._sessions(events, late)
        for e in events if w.kind != "session" else ():
            if w.kind == "none":
                self.windows[(e[0], None)].append(e)
                continue
            size = w.size_ms
            for s in spark_windows(e[1], size, w.slide):
                if s + size > late:  # Spark drops the row from windows that ended
                    self.windows[(e[0], s)].append(e)
        self.watermark = max(self.watermark, watermark)

    def _sessions(self, events: Sequence[Event], late: int) -> None:
        gap = self.window.gap_ms
        new: dict[str, list[Session]] = defaultdict(list)
        for e in events:
            if e[1] + gap > late:
                new[e[0]].append(Session(e[1], e[1] + gap, [e]))
        for k, rows in new.items():
            closed = [s for s in self.sessions[k] if s.end <= late]  # evicted by Spark
            pool = sorted([s for s in self.sessions[k] if s.end > late] + rows,
                          key=lambda s: s.start)
            merged: list[Session] = []
            for s in pool:
                if merged and s.start <= merged[-1].end:
                    m = merged[-1]
                    merged[-1] = Session(m.start, max(m.end, s.end), m.events + s.events)
                else:
                    merged.append(s)
            self.sessions[k] = closed + merged

    def expected(self, retention_ms: int | None = None
                 ) -> dict[str, dict[int | None, tuple[int | None, list[Event]]]]:
        """key -> window start -> (end, events), without what retention has deleted."""
        cutoff = -FAR if retention_ms is None else self.watermark - retention_ms
        out: dict[str, dict[int | None, tuple[int | None, list[Event]]]] = defaultdict(dict)
        w = self.window
        for k, sessions in self.sessions.items():
            for s in sessions:
                assert s.start not in out[k], "two sessions of a key with one start"
                if s.end > cutoff:
                    out[k][s.start] = (s.end, s.events)
        for (k, start), evs in self.windows.items():
            end = None if start is None else start + w.size_ms
            if end is None or end > cutoff:
                out[k][start] = (end, evs)
        return out


# ---- driving a store and comparing ---------------------------------------------------------
Batches = list[tuple[list[Event], int]]


def run(store: PartitionStore, model: SparkModel, batches: Batches, retention_ms: int | None = None,
        first: int = 0) -> None:
    for i, (events, wm) in enumerate(batches):
        assert store.meta.watermark_ms == model.watermark
        delta = partials(store.spec, events, model.watermark)
        assert store.apply(first + i, wm, 1, delta if delta.num_rows else None, retention_ms)
        model.batch(events, wm)


def view(ws: Sequence[WindowValue]) -> list[tuple[int | None, int | None,
                                                  list[int | float | None]]]:
    return [(w.start, w.end, w.values) for w in ws]


def compare(store: PartitionStore, model: SparkModel, retention_ms: int | None = None,
            keys: Sequence[str] = KEYS, past_retention_may_linger: bool = False) -> None:
    """Every (key, window) read back, by range and as the latest, is what Spark has (without
    what retention deleted; with ``past_retention_may_linger``, windows that ended at or
    before the cutoff are not looked at)."""
    expected = model.expected(retention_ms)
    cutoff = -FAR if retention_ms is None else model.watermark - retention_ms

    def keep(ws: list[WindowValue]) -> list[WindowValue]:
        if not past_retention_may_linger:
            return ws
        return [w for w in ws if w.end is None or w.end > cutoff]

    for k in keys:
        want = expected.get(k, {})
        meta, latest = store.read(k)
        assert meta.last_batch == store.meta.last_batch
        assert meta.watermark_ms == model.watermark
        if not store.spec.windowed:
            assert [(w.start, w.end) for w in latest] == [(None, None)] * len(want)
            for w in latest:
                assert_answers(w.values, want[None][1], k)
            continue
        _, got = store.read(k, (-FAR, FAR), limit=1 << 30)
        got = keep(got)
        if past_retention_may_linger and latest and not keep(latest):
            latest = got[-1:]  # the latest lingers: not a thing to compare
        starts = sorted(want)  # type: ignore[type-var]
        assert [(w.start, w.end) for w in got] == [(s, want[s][0]) for s in starts], k
        for w in got:
            assert_answers(w.values, want[w.start][1], (k, w.start))
        if starts:
            assert [(w.start, w.end) for w in latest] == [(starts[-1], want[starts[-1]][0])]
            assert_answers(latest[0].values, want[starts[-1]][1], (k, "latest"))
        else:
            assert latest == []


def raw_items(store: PartitionStore) -> list[tuple[bytes, bytes]]:
    """Everything in the partition's RocksDB (raw mode: bytes to bytes), in key order."""
    return [(bytes(k), bytes(v)) for k, v in store.db.items()]  # type: ignore[arg-type]


def data_and_index_keys(store: PartitionStore) -> list[bytes]:
    """The stored keys other than the meta: windows, panes, sessions and their index."""
    return [k for k, _ in raw_items(store) if k != layout.META]


def check_index(store: PartitionStore) -> None:
    """Every stored window (or pane, or session) has exactly one time-index entry, at the
    time it stops mattering, and every index entry names a stored record."""
    data: dict[bytes, bytes] = {}
    index: dict[bytes, int] = {}
    for k, v in raw_items(store):
        if k.startswith(layout.DATA):
            data[k] = v
        elif k.startswith(layout.INDEX):
            dk = layout.data_key_of_index(k)
            assert dk not in index, f"two index entries for {dk!r}"
            index[dk] = layout.dec_time(k[1:9])
    if not store.spec.windowed:
        assert index == {}
        return
    assert set(index) == set(data), (sorted(set(data) - set(index)),
                                     sorted(set(index) - set(data)))
    w = store.spec.window
    for dk, v in data.items():
        if store.panes:
            pane = layout.pane_of(dk)
            assert index[dk] == pane - pane % w.slide + w.size_ms
        else:
            rec, _, _ = store.codec.decode([v])
            assert index[dk] == int(rec["end"][0])


# ---- random scenarios ----------------------------------------------------------------------
def window_specs(kind: str) -> Any:
    from hypothesis import strategies as st

    if kind == "none":
        return st.just(WindowSpec())
    if kind == "tumbling":
        return st.integers(1, 40).map(lambda n: WindowSpec("tumbling", n))
    if kind == "session":
        return st.integers(1, 30).map(lambda g: WindowSpec("session", gap_ms=g))
    return st.integers(2, 60).flatmap(
        lambda size: st.integers(1, size).map(lambda slide: WindowSpec("sliding", size, slide)))


def scenarios(kind: str, max_jump: int = 60, min_jump: int = 0) -> Any:
    """(window, batches): up to 6 batches of events around the moving watermark (some late,
    some far ahead, negative times too), each with its watermark."""
    from hypothesis import strategies as st

    event = st.tuples(st.sampled_from(KEYS), st.integers(-80, 60),
                      st.one_of(st.none(), st.integers(-50, 50)), st.integers(0, 25))

    @st.composite
    def build(draw: st.DrawFn) -> tuple[WindowSpec, Batches]:
        w = draw(window_specs(kind))
        wm = 0
        batches: Batches = []
        for _ in range(draw(st.integers(1, 6))):
            raw = draw(st.lists(event, max_size=14))
            events = [(k, wm + dt, v, u) for k, dt, v, u in raw]
            wm += draw(st.integers(min_jump, max_jump))
            batches.append((events, wm))
        return w, batches

    return build()
