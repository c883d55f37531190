"""One partition of one operator: a RocksDB instance with exactly-once batch application.

A batch is applied in one WriteBatch that also records ``last_batch``, the watermark and the
epoch (synced, docs/architecture.md §4), so a reader sees all of a batch or none and a re-run batch
is
skipped. How a delta meets what is stored depends on the operator (``qstate.partition.codec``):
merged aggregates combine with the stored value of the same (key, window) — or (key, pane,
tag) for a sliding window — and session windows merge per key (``_merge_sessions``).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rocksdict import BlockBasedOptions, DBCompressionType, Options, Rdict, WriteBatch, WriteOptions

from qstate.core.errors import StaleEpoch
from qstate.core.records.operator import OperatorSpec
from qstate.partition import files, layout, rank
from qstate.partition.codec import Codec
from qstate.partition.layout import INDEX, META, NO_WINDOW
from qstate.partition.meta import Meta, encode_meta, read_meta
from qstate.partition.reader import WindowValue, read_many, read_windows
from qstate.shard.memory import MemoryBudget, process_budget

__all__ = ["ApplyStats", "PartitionStore"]

log = logging.getLogger(__name__)


@dataclass
class ApplyStats:
    rows: int = 0  # delta rows applied
    writes: int = 0  # RocksDB puts and deletes of data, not counting the index and meta


def _options(memory: MemoryBudget) -> Options:
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    # the one codec every reader of a partition has: the read engine's RocksDB is built with
    # snappy alone (engine/core/Cargo.toml), so a table file in any other could not be read
    opts.set_compression_type(DBCompressionType.snappy())
    # most keys of a batch are new at millions of keys: a Bloom filter answers "absent"
    # without reading a block
    table = BlockBasedOptions()
    table.set_bloom_filter(10, False)
    memory.configure(opts, table)  # one budget for every partition of the server
    opts.set_block_based_table_factory(table)
    # a server holds many partitions: keep each one's memtables small
    opts.set_write_buffer_size(8 << 20)
    opts.set_max_write_buffer_number(2)
    opts.set_max_open_files(64)
    opts.set_keep_log_file_num(2)
    return opts


class PartitionStore:
    def __init__(self, path: Path, spec: OperatorSpec, rank_index: bool = True,
                 memory: MemoryBudget | None = None) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.token = uuid.uuid4().hex[:12]
        self.path = path
        self.spec = spec
        self.codec = Codec(spec)
        self.panes = spec.panes
        self.memory = memory or process_budget()
        self.db = Rdict(str(path), _options(self.memory))
        self._sync = WriteOptions()
        self._sync.sync = True  # WAL synced at each commit (docs/architecture.md §4)
        self.lock = threading.RLock()  # one writer at a time; readers use snapshots
        self.rank_index = rank_index  # QSTATE_RANK_INDEX
        self.meta = read_meta(self.db)
        self._index_ranks()
        self.last_apply = ApplyStats()
        # wall-clock ms of the last batch this process applied (0: none yet): routers
        # measure a watch's delivery delay from it (docs/architecture.md §5, watch)
        self.applied_ms = 0
        self._mark()

    def _index_ranks(self) -> None:
        """A partition written before the rank index existed gets one before it serves."""
        if not self.rank_index or self.meta.ranks >= rank.VERSION or self.meta.last_batch < 0:
            return
        rows = rank.rebuild(self.db, self.spec)
        self.meta = replace(self.meta, ranks=rank.VERSION)
        self.db.put(META, encode_meta(self.meta), self._sync)
        log.info("rank index of %s built from %d rows", self.path, rows)

    def _mark(self) -> None:
        """Publish "incarnation batch" for same-host readers (qstate.partition.files)."""
        files.write_marker(self.path, self.token, self.meta.last_batch)

    def retire(self) -> None:
        """No longer ours: same-host readers must stop reading these files at once."""
        files.remove_marker(self.path)

    def close(self) -> None:
        self.db.close()

    def reopen(self) -> None:
        """Open again after the directory was replaced (a snapshot was restored into it)."""
        self.db = Rdict(str(self.path), _options(self.memory))
        self.token = uuid.uuid4().hex[:12]  # a new incarnation: readers must reopen
        self.meta = read_meta(self.db)
        self._index_ranks()
        self._mark()

    def respec(self, spec: OperatorSpec) -> None:
        """The operator's spec changed where its stored values carry over (aggregates added
        after the existing ones, docs/upgrading.md): the next batch is read and written in
        its layout."""
        with self.lock:
            self.spec, self.codec, self.panes = spec, Codec(spec), spec.panes

    def relabel(self, batch: int, watermark_ms: int) -> None:
        """This state as batch ``batch`` of another history: a fork's first, or a rolled-back
        job's (docs/architecture.md §4, forks and rollbacks). Epoch 0: the epochs that
        wrote it were another job's, or older than any that commits from now on."""
        with self.lock:
            ranks = self.meta.ranks if self.meta.last_batch >= 0 else (
                rank.VERSION if self.rank_index else 0)  # an empty index is complete
            self.meta = Meta(batch, max(watermark_ms, self.meta.watermark_ms), 0, ranks)
            self.db.put(META, encode_meta(self.meta), self._sync)
            self._mark()

    # ---- write path -------------------------------------------------------------
    def apply(self, batch: int, watermark_ms: int, epoch: int, delta: pa.Table | None,
              retention_ms: int | None) -> bool:
        """Apply one batch's delta atomically; False if the batch is already applied."""
        with self.lock:
            if epoch < self.meta.epoch:
                raise StaleEpoch(f"epoch {epoch} < {self.meta.epoch} at {self.path.name}")
            if batch <= self.meta.last_batch:
                return False
            wb = WriteBatch(raw_mode=True)
            late = self.meta.watermark_ms  # batch N's late-data watermark is batch N-1's
            watermark_ms = max(watermark_ms, self.meta.watermark_ms)
            stats = ApplyStats()
            cutoff = NO_WINDOW  # what ended at or before it is past retention
            if retention_ms is not None:
                cutoff = watermark_ms - retention_ms
                stats.writes += self._expire(wb, cutoff)
            if delta is not None and delta.num_rows:
                stats.rows = delta.num_rows
                if self.spec.window.kind == "session":
                    stats.writes += self._merge_sessions(wb, delta, late, cutoff)
                else:
                    stats.writes += self._merge_rows(wb, delta, cutoff)
            meta = Meta(batch, watermark_ms, max(epoch, self.meta.epoch),
                        rank.VERSION if self.rank_index else 0)
            wb.put(META, encode_meta(meta))
            self.db.write(wb, self._sync)
            self.meta = meta
            self.last_apply = stats
            self.applied_ms = int(time.time() * 1000)
            self._mark()
            return True

    def _merge_rows(self, wb: WriteBatch, delta: pa.Table, cutoff: int) -> int:
        """Each row meets the stored value of its exact data key: keys built vectorized,
        one multi-get of the batch's keys in sorted order, one vectorized combine, one
        sorted pass of puts. A row already past retention is not kept (what was stored of
        it, ``_expire`` deletes in the same batch)."""
        starts = delta.column("start").fill_null(NO_WINDOW).to_numpy()
        tags = delta.column("tag").fill_null(0).to_numpy() if self.panes else None
        keys = layout.data_keys(delta.column("key").combine_chunks(), starts, tags)
        order = pc.sort_indices(keys)
        keys, delta = keys.take(order), delta.take(order)
        new, new_blobs = self.codec.from_delta(delta)
        keys, delta, new, new_blobs = self._fold_duplicates(keys, delta, new, new_blobs)
        dks: list[bytes] = keys.to_pylist()
        stored: list[bytes | None] = self.db.get(dks)  # type: ignore[arg-type,assignment]
        old, present, old_blobs = self.codec.decode(stored)
        merged, blobs = self.codec.combine(old, present, old_blobs, new, new_blobs)
        values = self.codec.encode(merged, blobs)
        if not self.spec.windowed:
            for dk, value in zip(dks, values, strict=True):
                wb.put(dk, value)
            self._rank(wb, delta, old, present, merged, np.ones(len(dks), bool))
            return len(dks)
        ends = self._index_ends(delta, merged["end"])
        keep = ends > cutoff
        self._rank(wb, delta, old, present, merged, keep)
        for dk, value, kept in zip(dks, values, keep.tolist(), strict=True):
            if kept:
                wb.put(dk, value)
        fresh = keep & ~present
        if fresh.any():
            for ik in layout.index_keys(ends[fresh], keys.filter(pa.array(fresh))).to_pylist():
                wb.put(ik, b"")
        return int(keep.sum())

    def _rank(self, wb: WriteBatch, delta: pa.Table, old: np.ndarray, present: np.ndarray,
              merged: np.ndarray, keep: np.ndarray) -> None:
        if self.rank_index:
            rank.update(wb, self.spec, delta.column("key").combine_chunks(),
                        delta.column("start").fill_null(NO_WINDOW).to_numpy(), old, present,
                        merged, keep)

    def _fold_duplicates(self, keys: pa.Array, delta: pa.Table, new: np.ndarray,
                         new_blobs: list[list[bytes | None]]
                         ) -> tuple[pa.Array, pa.Table, np.ndarray, list[list[bytes | None]]]:
        """Rows of one data key from several fragments (tasks) of the batch, combined into
        one, in key order (``keys`` is sorted)."""
        n = len(keys)
        if n < 2:
            return keys, delta, new, new_blobs
        same = pc.equal(keys.slice(1), keys.slice(0, n - 1)).to_numpy(zero_copy_only=False)
        if not same.any():
            return keys, delta, new, new_blobs
        firsts = np.flatnonzero(np.concatenate(([True], ~same)))
        ends = np.append(firsts[1:], n)
        out, out_blobs = new[firsts].copy(), [[b[i] for i in firsts] for b in new_blobs]
        for j, (lo, hi) in enumerate(zip(firsts.tolist(), ends.tolist(), strict=True)):
            if hi - lo > 1:
                rec, blobs = self.codec.fold(new[lo:hi], [b[lo:hi] for b in new_blobs])
                out[j] = rec
                for b, v in zip(out_blobs, blobs, strict=True):
                    b[j] = v
        take = pa.array(firsts)
        return keys.take(take), delta.take(take), out, out_blobs

    def _index_ends(self, delta: pa.Table, ends: np.ndarray) -> np.ndarray:
        """When a stored record stops mattering: its window's end, or for a pane the end of
        the newest window that covers it."""
        if not self.panes:
            return ends
        w = self.spec.window
        panes = delta.column("start").to_numpy()
        return panes - panes % w.slide + w.size_ms

    def _merge_sessions(self, wb: WriteBatch, delta: pa.Table, late_ms: int,
                        cutoff: int) -> int:
        """A key's new sessions merge with its open stored ones (end after the late-data
        watermark, as Spark's state holds them) wherever they touch (start <= end); a session
        that bridges two merges all three. Replaced sessions are deleted in the same batch."""
        delta = delta.sort_by([("key", "ascending"), ("start", "ascending")])
        keys = delta.column("key").to_pylist()
        new, new_blobs = self.codec.from_delta(delta)
        starts = delta.column("start").to_numpy()
        writes = 0
        i = 0
        while i < len(keys):
            j = i
            while j < len(keys) and keys[j] == keys[i]:
                j += 1
            writes += self._merge_key_sessions(
                wb, keys[i], late_ms, starts[i:j], new[i:j], [b[i:j] for b in new_blobs],
                cutoff)
            i = j
        return writes

    def _merge_key_sessions(self, wb: WriteBatch, key: str, late_ms: int, starts: np.ndarray,
                            new: np.ndarray, new_blobs: list[list[bytes | None]],
                            cutoff: int) -> int:
        codec = self.codec
        prefix = layout.key_prefix(key)
        stored_keys, stored_values = [], []
        it: Iterator[tuple[bytes, bytes]] = self.db.items(from_key=prefix)  # type: ignore[assignment]
        for k, v in it:
            if not k.startswith(prefix):
                break
            stored_keys.append(k)
            stored_values.append(v)
        old, _, old_blobs = codec.decode(stored_values)
        open_ = [n for n in range(len(stored_keys)) if old["end"][n] > late_ms]
        cands = [(layout.start_of(stored_keys[n]), "old", n) for n in open_]
        cands += [(int(starts[n]), "new", n) for n in range(len(new))]
        cands.sort()
        writes = 0
        cur: list[tuple[str, int]] = []
        cur_start, cur_end = 0, 0

        def flush() -> int:
            olds = [n for kind, n in cur if kind == "old"]
            if len(cur) == 1 and olds:
                return 0  # an untouched stored session
            recs = np.concatenate([(old if kind == "old" else new)[n:n + 1] for kind, n in cur])
            blobs = [[(ob if kind == "old" else nb)[n] for kind, n in cur]
                     for ob, nb in zip(old_blobs, new_blobs, strict=True)]
            merged, merged_blobs = codec.fold(recs, blobs)
            merged["end"] = cur_end
            for n in olds:
                wb.delete(stored_keys[n])
                wb.delete(layout.index_key(int(old["end"][n]), stored_keys[n]))
            if cur_end <= cutoff:
                return len(olds)  # already past retention
            dk = layout.data_key(key, cur_start)
            [value] = codec.encode(np.array([merged], codec.dtype), [[b] for b in merged_blobs])
            wb.put(dk, value)
            wb.put(layout.index_key(cur_end, dk), b"")
            return len(olds) + 1

        for start, kind, n in cands:
            end = int((old if kind == "old" else new)["end"][n])
            if cur and start <= cur_end:
                cur.append((kind, n))
                cur_end = max(cur_end, end)
                continue
            if cur:
                writes += flush()
            cur, cur_start, cur_end = [(kind, n)], start, end
        if cur:
            writes += flush()
        return writes

    def _expire(self, wb: WriteBatch, cutoff_ms: int) -> int:
        """Delete what ended at or before ``cutoff_ms``: one range of the index."""
        hi = INDEX + layout.enc_time(cutoff_ms + 1)
        n = 0
        keys: Iterator[bytes] = self.db.keys(from_key=INDEX)  # type: ignore[assignment]  # raw mode
        for k in keys:
            if k >= hi or not k.startswith(INDEX):
                break
            wb.delete(layout.data_key_of_index(k))
            n += 1
        if n:
            wb.delete_range(INDEX, hi)
            if self.rank_index:
                rank.drop_windows(wb, self.spec, cutoff_ms)
        return n

    # ---- read path --------------------------------------------------------------
    def read(self, key: str, range_ms: tuple[int, int] | None = None,
             limit: int = 1000) -> tuple[Meta, list[WindowValue]]:
        return read_windows(self.db, self.codec, key, range_ms, limit)

    def read_many(self, keys: list[str], range_ms: tuple[int, int] | None = None,
                  limit: int = 1000) -> tuple[Meta, list[list[WindowValue]]]:
        """``read`` of each key, as of one batch: one snapshot for them all."""
        return read_many(self.db, self.codec, keys, range_ms, limit)
