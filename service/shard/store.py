"""One partition of one operator: a RocksDB instance with exactly-once batch application."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pyarrow as pa
from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from service.core import shard_files
from service.core.errors import StaleEpoch
from service.shard import layout
from service.shard.layout import INDEX, META, NO_WINDOW

__all__ = ["Meta", "PartitionStore", "WindowValue", "read_windows"]


@dataclass
class Meta:
    last_batch: int = -1
    watermark_ms: int = 0
    epoch: int = 0


@dataclass(frozen=True)
class WindowValue:
    start: int | None  # None for non-windowed state
    end: int | None
    values: list[int | float | None]


def _options() -> Options:
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    # a server holds many partitions: keep each one's memtables small
    opts.set_write_buffer_size(8 << 20)
    opts.set_max_write_buffer_number(2)
    opts.set_max_open_files(64)
    opts.set_keep_log_file_num(2)
    return opts


class PartitionStore:
    def __init__(self, path: Path, state_names: list[str]) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.token = uuid.uuid4().hex[:12]
        self.path = path
        self.state_names = state_names
        self.db = Rdict(str(path), _options())
        self._sync = WriteOptions()
        self._sync.sync = True  # WAL synced at each commit (DESIGN §4)
        self.lock = threading.RLock()  # one writer at a time; readers use snapshots
        self.meta = self._load_meta()
        self._mark()

    def _mark(self) -> None:
        """Publish "incarnation batch" for same-host readers (service.core.shard_files)."""
        shard_files.write_marker(self.path, self.token, self.meta.last_batch)

    def retire(self) -> None:
        """No longer ours: same-host readers must stop reading these files at once."""
        shard_files.remove_marker(self.path)

    def _load_meta(self) -> Meta:
        raw = self.db.get(META)
        return Meta(**orjson.loads(raw)) if raw is not None else Meta()

    def close(self) -> None:
        self.db.close()

    def reopen(self) -> None:
        """Open again after the directory was replaced (a snapshot was restored into it)."""
        self.db = Rdict(str(self.path), _options())
        self.token = uuid.uuid4().hex[:12]  # a new incarnation: readers must reopen
        self.meta = self._load_meta()
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
            watermark_ms = max(watermark_ms, self.meta.watermark_ms)
            if retention_ms is not None:
                self._expire(wb, watermark_ms - retention_ms)
            if delta is not None and delta.num_rows:
                self._upsert(wb, delta)
            meta = Meta(batch, watermark_ms, max(epoch, self.meta.epoch))
            wb.put(META, orjson.dumps(meta.__dict__))
            self.db.write(wb, self._sync)
            self.meta = meta
            self._mark()
            return True

    def _upsert(self, wb: WriteBatch, delta: pa.Table) -> None:
        keys = delta.column("key").to_pylist()
        starts = delta.column("start").to_pylist()
        ends = delta.column("end").to_pylist()
        cols = [delta.column(n).to_pylist() for n in self.state_names]
        rows = []
        for i, key in enumerate(keys):
            start = starts[i]
            dk = layout.data_key(key, NO_WINDOW if start is None else start)
            rows.append((dk, ends[i], [c[i] for c in cols]))
        rows.sort(key=lambda r: r[0])  # sorted WriteBatches are several times faster
        for dk, end, vals in rows:
            wb.put(dk, orjson.dumps([end, *vals]))
            if end is not None:
                wb.put(layout.index_key(end, dk), b"")

    def _expire(self, wb: WriteBatch, cutoff_ms: int) -> int:
        """Delete windows that ended at or before ``cutoff_ms``: one range of the index."""
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
        return n

    # ---- read path --------------------------------------------------------------
    def read(self, key: str, range_ms: tuple[int, int] | None = None,
             limit: int = 1000) -> tuple[Meta, list[WindowValue]]:
        return read_windows(self.db, key, range_ms, limit)


def _decode(k: bytes, v: bytes) -> WindowValue:
    end, *vals = orjson.loads(v)
    start = layout.start_of(k)
    return WindowValue(None if start == NO_WINDOW else start, end, vals)


def read_windows(db: Rdict, key: str, range_ms: tuple[int, int] | None = None,
                 limit: int = 1000) -> tuple[Meta, list[WindowValue]]:
    """The key's latest window, or its windows starting in ``[from, to)`` oldest first, with
    the meta of the batch they belong to. One snapshot: read-committed. Works on a primary
    and on a secondary instance alike."""
    snap = db.snapshot()
    it = snap.iter()
    it.seek(META)
    meta = Meta(**orjson.loads(it.value())) if it.valid() and it.key() == META else Meta()
    prefix = layout.key_prefix(key)
    out: list[WindowValue] = []
    if range_ms is None:
        it.seek_for_prev(prefix + b"\xff" * 8)
        if it.valid() and it.key().startswith(prefix):
            out.append(_decode(it.key(), it.value()))
        return meta, out
    lo, hi = range_ms
    it.seek(prefix + layout.enc_time(lo))
    stop = prefix + layout.enc_time(hi)
    while it.valid() and len(out) < limit:
        k = it.key()
        if k >= stop or not k.startswith(prefix):
            break
        out.append(_decode(k, it.value()))
        it.next()
    return meta, out
