"""Reading one key's windows from a partition's RocksDB: on the shard (its primary) and on a
same-host router (a secondary instance) alike. One snapshot per read: read-committed, all of
a batch or none (docs/architecture.md §3).

Windows are what a client asks for; for a sliding window they are made here from the
stored panes (``qstate.core.windows``): window ``s`` combines the records of the panes in
``[s, s + size)`` whose tag lets them count in ``s``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
from rocksdict import Rdict

from qstate.core.windows import ALL_WINDOWS, first_window_of, last_window_of
from qstate.partition import layout
from qstate.partition.codec import Codec
from qstate.partition.layout import META, NO_WINDOW
from qstate.partition.meta import Meta, decode_meta

__all__ = ["Meta", "WindowValue", "page", "read_many", "read_windows"]


class WindowValue(NamedTuple):  # a tuple: one is made per window read, on the hot path
    start: int | None  # None for non-windowed state
    end: int | None
    values: list[int | float | None]  # one per aggregate


def read_windows(db: Rdict, codec: Codec, key: str, range_ms: tuple[int, int] | None = None,
                 limit: int = 1000, meta: Meta | None = None) -> tuple[Meta, list[WindowValue]]:
    """The key's latest window, or its windows starting in ``[from, to)`` oldest first (at
    most ``limit``), with the meta of the batch they belong to. ``meta``: the caller knows
    that ``db`` holds that batch and does not change during the read (a secondary between
    two catch-ups, docs/architecture.md §5), so no snapshot is taken."""
    meta, [windows] = read_many(db, codec, [key], range_ms, limit, meta)
    return meta, windows


def read_many(db: Rdict, codec: Codec, keys: Sequence[str],
              range_ms: tuple[int, int] | None = None, limit: int = 1000,
              meta: Meta | None = None) -> tuple[Meta, list[list[WindowValue]]]:
    """``read_windows`` of each key, in order, as of one batch: one snapshot (or none, given
    ``meta``) and one iterator for them all."""
    if meta is None:
        it = db.snapshot().iter()
        it.seek(META)
        meta = decode_meta(it.value() if it.valid() and it.key() == META else None)
    else:
        it = db.iter()
    if codec.spec.panes:
        cutoff = meta.watermark_ms - codec.spec.retention_ms  # what retention has deleted
        return meta, [_sliding(it, codec, layout.key_prefix(k), range_ms, limit, cutoff)
                      for k in keys]
    if range_ms is None:
        return meta, [_latest(it, codec, layout.key_prefix(k)) for k in keys]
    return meta, [_range(it, codec, layout.key_prefix(k), range_ms, limit) for k in keys]


def _latest(it: Any, codec: Codec, prefix: bytes) -> list[WindowValue]:
    it.seek_for_prev(prefix + b"\xff" * 8)
    if it.valid() and it.key().startswith(prefix):
        return [_window(codec, it.key(), it.value())]
    return []


def _range(it: Any, codec: Codec, prefix: bytes, range_ms: tuple[int, int],
           limit: int) -> list[WindowValue]:
    out: list[WindowValue] = []
    lo, hi = range_ms
    it.seek(prefix + layout.enc_time(lo))
    stop = prefix + layout.enc_time(hi)
    while it.valid() and len(out) < limit:
        k = it.key()
        if k >= stop or not k.startswith(prefix):
            break
        out.append(_window(codec, k, it.value()))
        it.next()
    return out


def page(windows: list[WindowValue], limit: int) -> tuple[list[WindowValue], int | None]:
    """At most ``limit`` of ``windows`` (read with ``limit + 1``) and where the next page
    starts: the start of the first window left out, None when none was. A range answer is
    cut here and says so, never silently."""
    if len(windows) <= limit:
        return windows, None
    return windows[:limit], windows[limit].start


def _window(codec: Codec, k: bytes, v: bytes) -> WindowValue:
    end, answers = codec.answers_of(v)
    start = layout.start_of(k)
    windowed = start != NO_WINDOW
    return WindowValue(start if windowed else None, end if windowed else None, answers)


def _sliding(it: object, codec: Codec, prefix: bytes, range_ms: tuple[int, int] | None,
             limit: int, cutoff: int) -> list[WindowValue]:
    w = codec.spec.window
    size, slide = w.size_ms, w.slide
    if range_ms is None:
        it.seek_for_prev(prefix + b"\xff" * 16)  # type: ignore[attr-defined]
        if not (it.valid() and it.key().startswith(prefix)):  # type: ignore[attr-defined]
            return []
        newest = last_window_of(layout.pane_of(it.key()), slide)  # type: ignore[attr-defined]
        lo, hi = newest, newest + 1
    else:
        lo, hi = range_ms
    # a window that ended at or before the retention cutoff is gone, though some of its
    # panes may still serve newer windows
    lo = max(lo, cutoff - size + 1)
    if lo >= hi:
        return []
    # panes that can be in a window starting in [lo, hi)
    first_pane, stop = lo, min(hi + size, (1 << 63) - 1)
    it.seek(prefix + layout.enc_time(first_pane))  # type: ignore[attr-defined]
    end_key = prefix + layout.enc_time(stop)
    keys: list[bytes] = []
    values: list[bytes] = []
    while it.valid():  # type: ignore[attr-defined]
        k = it.key()  # type: ignore[attr-defined]
        if k >= end_key or not k.startswith(prefix):
            break
        keys.append(k)
        values.append(it.value())  # type: ignore[attr-defined]
        it.next()  # type: ignore[attr-defined]
    if not keys:
        return []
    recs, _, blobs = codec.decode(values)
    members: dict[int, list[int]] = {}
    for n, k in enumerate(keys):
        pane, tag = layout.pane_of(k), layout.tag_of(k)
        first = max(first_window_of(pane, size, slide), lo)
        if tag != ALL_WINDOWS:
            first = max(first, tag)
        first += (-first) % slide  # align up
        for s in range(first, min(last_window_of(pane, slide), hi - 1) + 1, slide):
            members.setdefault(s, []).append(n)
    out = []
    for s in sorted(members)[:limit]:
        idx = members[s]
        rec, rec_blobs = codec.fold(recs[np.array(idx)], [[b[i] for i in idx] for b in blobs])
        out.append(WindowValue(s, s + size, codec.answers(rec, rec_blobs)))
    return out
