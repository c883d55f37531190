"""A partition's META record: the batch its state reflects, that batch's watermark and the
epoch that wrote it. Written in the same RocksDB WriteBatch as the batch's rows, so whoever
reads it from one snapshot sees the batch the rows belong to (docs/architecture.md §3)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Protocol

import orjson

from qstate.partition.layout import META

__all__ = ["META", "Meta", "decode_meta", "encode_meta", "read_meta"]


@dataclass(frozen=True)
class Meta:
    last_batch: int = -1
    watermark_ms: int = 0
    epoch: int = 0
    # the version of the rank index its writer keeps (``qstate.partition.rank``): 0, a
    # partition written before it existed, which the shard indexes when it opens it
    ranks: int = 0


class _Gets(Protocol):  # an Rdict, or a snapshot of one
    def get(self, key: bytes) -> bytes | None: ...


def encode_meta(meta: Meta) -> bytes:
    return orjson.dumps(asdict(meta))


def decode_meta(raw: bytes | None) -> Meta:
    """The record's Meta; a partition that never committed (no record) is ``Meta()``."""
    return Meta(**orjson.loads(raw)) if raw is not None else Meta()


def read_meta(db: _Gets) -> Meta:
    return decode_meta(db.get(META))
