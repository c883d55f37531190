"""Top-N of one state in one window of a partition (docs/architecture.md §5).

The rank index holds, per (key, window) with a value, ``r | state | start | rank | key``
(``qstate.partition.layout``), where ``rank`` is the value as an order-preserving u64: one
state's window is one contiguous range sorted by value, then by key, so the N largest are a
seek and N steps back (and the ties at the cut a seek forward: ties go by key, ascending).
The shard keeps it in the same WriteBatch as the rows (``qstate.shard.store``), so a top-N is
as of one batch like any read; retention drops a window's entries with one range delete.

Which states: what orders as a number (count, sum, min, max, avg, value), of windows stored
whole (tumbling; sliding in spark-state mode) and unwindowed state. A merged sliding window
is stored as panes and has no stored value to rank: its top-N reads the keys of the window
from the time index and folds each (``scan_top``), at most ``max_keys`` of them. Session
windows differ per key, so "one window across keys" does not exist: refused (``check_top``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
from rocksdict import Rdict, WriteBatch

from qstate.core.errors import InvalidRequest, TooLarge
from qstate.core.records.operator import OperatorSpec
from qstate.partition import layout
from qstate.partition.codec import Codec
from qstate.partition.layout import DATA, INDEX, NO_WINDOW, RANK
from qstate.partition.meta import Meta, decode_meta
from qstate.partition.ranking import (
    Ranked,
    current_start,
    rank_of,
    ranked_states,
    ranks_of,
    value_of_rank,
)
from qstate.partition.reader import read_many

__all__ = ["VERSION", "Owned", "drop_windows", "read_top", "rebuild", "scan_top", "top",
           "update"]

VERSION = 1  # of the rank index a writer keeps (``Meta.ranks``)
_REBUILD_CHUNK = 10_000


def update(wb: WriteBatch, spec: OperatorSpec, keys: pa.Array, starts: np.ndarray,
           old: np.ndarray, present: np.ndarray, new: np.ndarray, keep: np.ndarray) -> None:
    """Move each row's rank entries from its stored value (``old`` where ``present``) to
    its new one (where ``keep``: a row past retention is not stored)."""
    for i in ranked_states(spec):
        o, o_has = ranks_of(spec, old, i)
        n, n_has = ranks_of(spec, new, i)
        o_has &= present
        n_has &= keep
        same = o_has & n_has & (o == n)
        for mask, rank, put in ((o_has & ~same, o, False), (n_has & ~same, n, True)):
            if not mask.any():
                continue
            entries = layout.rank_keys(i, starts[mask], rank[mask], keys.filter(pa.array(mask)))
            for e in entries.to_pylist():
                if put:
                    wb.put(e, b"")
                else:
                    wb.delete(e)


def drop_windows(wb: WriteBatch, spec: OperatorSpec, cutoff_ms: int) -> None:
    """Retention: the entries of every window that ended at or before ``cutoff_ms``."""
    size = spec.window.size_ms
    for i in ranked_states(spec):
        wb.delete_range(RANK + bytes((i,)), layout.rank_prefix(i, cutoff_ms - size + 1))


def rebuild(db: Rdict, spec: OperatorSpec) -> int:
    """The rank index written from the stored rows (a partition kept before it existed):
    returns the rows read. Runs before the store serves; one WriteBatch per chunk."""
    if not ranked_states(spec):
        return 0
    codec = Codec(spec)
    db.delete_range(RANK, RANK + b"\xff")
    rows = 0
    it: Iterator[tuple[bytes, bytes]] = db.items(from_key=DATA)  # type: ignore[assignment]
    chunk: list[tuple[bytes, bytes]] = []

    def flush() -> None:
        recs, _, _ = codec.decode([v for _, v in chunk])
        parsed = [layout.parse_data_key(k) for k, _ in chunk]
        wb = WriteBatch(raw_mode=True)
        update(wb, spec, pa.array([p.key for p in parsed], pa.string()),
               np.array([p.start for p in parsed], np.int64), recs,
               np.zeros(len(chunk), bool), recs, np.ones(len(chunk), bool))
        db.write(wb)

    for k, v in it:
        if not k.startswith(DATA):
            break
        chunk.append((k, v))
        rows += 1
        if len(chunk) >= _REBUILD_CHUNK:
            flush()
            chunk = []
    if chunk:
        flush()
    return rows


Owned = Callable[[str], bool]  # whether a key is this partition's (by the current count)


def top(db: Any, spec: OperatorSpec, state: int, start: int, n: int,
        descending: bool = True, owned: Owned | None = None, max_skipped: int = 0
        ) -> list[Ranked]:
    """The ``n`` keys of the window starting at ``start`` with the largest values (or the
    smallest), ties by key, from the rank index of ``db`` (an Rdict or a snapshot of one):
    at most 2n steps whatever the window holds. ``owned``: keys it says are not this
    partition's are passed over (a partition split by a rescale still holds the keys that
    moved, as they were then), at most ``max_skipped`` of them, else TooLarge."""
    prefix = layout.rank_prefix(state, start)
    cut = len(prefix)
    it = db.iter()
    skipped = 0

    def walk(stop: bytes, forward: bool, got: list[bytes]) -> None:
        nonlocal skipped
        while it.valid() and len(got) < n:
            k = it.key()
            if not k.startswith(stop):
                break
            if owned is None or owned(layout.key_of_rank(k)):
                got.append(k[cut:])
            else:
                skipped += 1
                if skipped > max_skipped:
                    raise TooLarge(
                        f"more than {max_skipped} keys of {spec.job}/{spec.operator} in the "
                        "window are left from before a rescale (QSTATE_MAX_TOP_SCAN_KEYS)")
            if forward:
                it.next()
            else:
                it.prev()

    got: list[bytes] = []
    if not descending:
        it.seek(prefix)
        walk(prefix, True, got)
    else:
        it.seek_for_prev(prefix + b"\xff" * 9)  # past every rank: UTF-8 has no 0xff byte
        walk(prefix, False, got)
        if got and len(got) == n:
            # walking back met the ties at the cut in descending key order: take them
            # again from the first, ascending
            last = got[-1][:8]
            got = [g for g in got if g[:8] != last]
            it.seek(prefix + last)
            walk(prefix + last, True, got)
    ranked = [(int.from_bytes(g[:8], "big"), g[8:].decode("utf-8")) for g in got]
    if descending:  # the walk back met equal values in descending key order
        ranked.sort(key=lambda rk: (-rk[0], rk[1]))
    a = list(spec.states.values())[state]
    return [Ranked(k, value_of_rank(a, r)) for r, k in ranked]


def scan_top(db: Any, codec: Codec, state: int, start: int, n: int, descending: bool,
             meta: Meta, max_keys: int, owned: Owned | None = None) -> list[Ranked]:
    """``top`` of a merged sliding window, which has no rank index: the keys with a pane in
    the window, from the time index (a pane's entry is under the end of the newest window
    that covers it, ``PartitionStore._index_ends``), each key's window folded from its panes.
    More than ``max_keys`` keys is TooLarge: one request's work stays bounded."""
    spec = codec.spec
    size = spec.window.size_ms
    lo, hi = INDEX + layout.enc_time(start + size), INDEX + layout.enc_time(start + 2 * size)
    keys: set[str] = set()
    it = db.iter()
    it.seek(lo)
    while it.valid():
        k = it.key()
        if k >= hi:
            break
        pane = layout.parse_data_key(layout.data_key_of_index(k))
        if start <= pane.start < start + size and (owned is None or owned(pane.key)):
            keys.add(pane.key)
            if len(keys) > max_keys:
                raise TooLarge(
                    f"the window holds more than {max_keys} keys in one partition: a top-N "
                    f"of {spec.job}/{spec.operator}, a sliding window kept as panes, folds "
                    "every key of the window (QSTATE_MAX_TOP_SCAN_KEYS)")
        it.next()
    ordered = sorted(keys)
    _, per_key = read_many(db, codec, ordered, (start, start + 1), 1, meta)
    a = list(spec.states.values())[state]
    found = [(k, ws[0].values[state]) for k, ws in zip(ordered, per_key, strict=True)
             if ws and ws[0].values[state] is not None]
    sign = -1 if descending else 1
    found.sort(key=lambda kv: (sign * rank_of(a, kv[1]), kv[0]))  # type: ignore[arg-type]
    return [Ranked(k, v) for k, v in found[:n]]  # type: ignore[arg-type]


def read_top(db: Rdict, codec: Codec, state: int, start: int | None, n: int,
             descending: bool, max_keys: int, owned: Owned | None = None
             ) -> tuple[Meta, int, list[Ranked]]:
    """A partition's top ``n`` of the window starting at ``start`` (None: the current one by
    its watermark), with the meta of the batch it is as of and the window's start: all from
    one snapshot. ``owned``: which keys are the partition's (``top``)."""
    view: Any = db.snapshot()
    it = view.iter()
    it.seek(layout.META)
    meta = decode_meta(it.value() if it.valid() and it.key() == layout.META else None)
    spec = codec.spec
    if not spec.windowed:
        start = NO_WINDOW
    elif start is None:
        start = current_start(spec, meta.watermark_ms)
    if spec.panes:
        return meta, start, scan_top(view, codec, state, start, n, descending, meta, max_keys,
                                     owned)
    if meta.ranks < VERSION and meta.last_batch >= 0:
        raise InvalidRequest(
            f"the shard holding {spec.job}/{spec.operator} keeps no rank index "
            "(QSTATE_RANK_INDEX=false there), so it has no top-N of this state")
    return meta, start, top(view, spec, state, start, n, descending, owned, max_keys)
