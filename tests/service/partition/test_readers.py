"""One partition, two readers: the shard's (``qstate.partition.reader``, Python over rocksdict,
``seek_for_prev`` to a key's newest window) and the read engine's (``qstate._engine``, Rust over
rust-rocksdb, a seek and steps forward) give the same windows of the same bytes: the latest
window, ranges, a sliding window folded from its panes, what retention has dropped, and every
page of a range cut at ``limit`` followed by ``next_from`` (docs/architecture.md §5). The bytes
are a real ``PartitionStore``'s after random batches of events (``tests.service.shard.sim``)."""

from __future__ import annotations

import math
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qstate._engine import read_partition
from qstate.partition.reader import page, read_many
from qstate.shard.store import PartitionStore
from tests.service.shard.sim import KEYS, SETTINGS, SparkModel, make_spec, run, scenarios, scratch

FAR = 1 << 62


def same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and
                                                                math.isnan(b))
    return type(a) is type(b) and a == b


def shard_pages(store: PartitionStore, state: int, key: str, rng: tuple[int, int] | None,
                limit: int) -> list[tuple[tuple[int, int], list[Any], int | None]]:
    """Every page the shard's reader answers, following next_from."""
    out = []
    while True:
        meta, [ws] = read_many(store.db, store.codec, [key], rng, limit + 1)
        ws, next_from = page(ws, limit)
        out.append(((meta.last_batch, meta.watermark_ms),
                    [(w.start, w.end, w.values[state]) for w in ws], next_from))
        if next_from is None or rng is None:
            return out
        rng = (next_from, rng[1])


def engine_pages(store: PartitionStore, state: int, key: str, rng: tuple[int, int] | None,
                 limit: int) -> list[tuple[tuple[int, int], list[Any], int | None]]:
    out = []
    while True:
        meta, [(ws, next_from)] = read_partition(store.path, store.spec.to_json(), state, [key],
                                                 rng, limit)
        out.append((meta, list(ws), next_from))
        if next_from is None or rng is None:
            return out
        rng = (next_from, rng[1])


def agree(store: PartitionStore, rng: tuple[int, int] | None, limit: int) -> None:
    for state in range(len(store.spec.states)):
        for key in KEYS:
            ours, theirs = engine_pages(store, state, key, rng, limit), \
                shard_pages(store, state, key, rng, limit)
            assert len(ours) == len(theirs), (key, state, rng, ours, theirs)
            for (m1, w1, n1), (m2, w2, n2) in zip(ours, theirs, strict=True):
                assert (m1, n1) == (m2, n2), (key, state, rng)
                assert [(s, e) for s, e, _ in w1] == [(s, e) for s, e, _ in w2], (key, state, rng)
                assert all(same(a, b) for (_, _, a), (_, _, b) in zip(w1, w2, strict=True)), \
                    (key, state, rng, w1, w2)


@pytest.mark.parametrize("kind", ["tumbling", "sliding", "session", "none"])
@SETTINGS
@given(data=st.data())
def test_both_readers_read_the_same_windows(kind: str, data: st.DataObject) -> None:
    window, batches = data.draw(scenarios(kind))
    retention = data.draw(st.sampled_from([None, 0, 15, 1000]))
    spec = make_spec(window, retention_ms=retention)
    half = data.draw(st.integers(0, len(batches)))
    with scratch() as d:
        store = PartitionStore(Path(d) / "p", spec)
        try:
            model = SparkModel(window)
            run(store, model, batches[:half], retention)
            store.db.flush()  # part of it in a table file, the rest in the memtable
            run(store, model, batches[half:], retention, first=half)
            agree(store, None, 1)
            # bounds anywhere, and on the windows' own starts (where >= and > part ways)
            starts = sorted({w[0] for key in KEYS
                             for w in engine_pages(store, 0, key, (-FAR, FAR), 10_000)[0][1]
                             if w[0] is not None})
            for _ in range(3):
                lo = data.draw(st.one_of(st.integers(-120, 200), *(
                    [st.sampled_from(starts)] if starts else [])))
                above = [t for t in starts if t > lo]
                hi = data.draw(st.one_of(st.integers(lo + 1, lo + 300), st.just(FAR), *(
                    [st.sampled_from(above)] if above else [])))
                agree(store, (lo, hi), data.draw(st.integers(1, 4)))
        finally:
            store.close()
