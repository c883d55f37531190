"""Byte layout of one partition's RocksDB.

``d | len(key):u16 | key | start:u64``            -> value (``qstate.partition.codec``)
``d | len(key):u16 | key | pane:u64 | tag:u64``   -> value of a (sub-)pane of a sliding window
``e | end:u64 | <data key without d>``            -> b""   (time index, for retention)
``r | state:u8 | start:u64 | rank:u64 | key``   -> b""   (rank index, for top-N)
``m``                                             -> orjson meta (last_batch, watermark, epoch)

Times are epoch ms shifted by 2**63 so big-endian bytes sort like signed integers. The
length prefix makes every key's entries one contiguous range, so "windows of K between
t1 and t2" is a seek and a short scan; the time index turns retention into one range.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from qstate.core.errors import CorruptState

__all__ = ["DATA", "INDEX", "META", "NO_WINDOW", "RANK", "DataKey", "data_key",
           "data_key_of_index", "data_keys", "dec_time", "enc_time", "index_key", "index_keys",
           "key_of_rank", "key_prefix", "pane_of", "parse_data_key", "rank_keys",
           "rank_prefix", "start_of", "tag_of"]

DATA = b"d"
INDEX = b"e"
META = b"m"
RANK = b"r"
NO_WINDOW = -(1 << 63)  # the start of non-windowed state

_U64 = struct.Struct(">Q")
_U16 = struct.Struct(">H")
_SHIFT = 1 << 63


def enc_time(ms: int) -> bytes:
    return _U64.pack(ms + _SHIFT)


def dec_time(b: bytes) -> int:
    return int(_U64.unpack(b)[0]) - _SHIFT


def key_prefix(key: str) -> bytes:
    k = key.encode("utf-8")
    return DATA + _U16.pack(len(k)) + k


def data_key(key: str, start: int, tag: int | None = None) -> bytes:
    """A window's (or a pane's, with its tag) data key."""
    dk = key_prefix(key) + enc_time(start)
    return dk if tag is None else dk + enc_time(tag)


class DataKey(NamedTuple):
    key: str
    start: int  # the window's start, or a pane's
    tag: int | None  # a pane's tag; None for a window


def parse_data_key(raw: bytes) -> DataKey:
    """A data key taken apart, checked: CorruptState saying what is wrong with bytes that
    are not one (the read path trusts its own keys and uses ``start_of`` and friends)."""
    def bad(why: str) -> CorruptState:
        return CorruptState(f"not a data key of the partition layout ({why}): {raw[:40]!r}")

    if raw[:1] != DATA:
        raise bad(f"it starts with {raw[:1]!r}, not {DATA!r}")
    if len(raw) < 3:
        raise bad(f"{len(raw)} bytes, too short for the key's length")
    (size,) = _U16.unpack_from(raw, 1)
    rest = len(raw) - 3 - size
    if rest not in (8, 16):
        raise bad(f"a {size}-byte key leaves {rest} bytes, not 8 (start) or 16 (pane, tag)")
    try:
        key = raw[3:3 + size].decode("utf-8")
    except UnicodeDecodeError:
        raise bad("the key is not UTF-8") from None
    times = raw[3 + size:]
    return DataKey(key, dec_time(times[:8]), dec_time(times[8:]) if rest == 16 else None)


def _fixed(values: np.ndarray, width: int) -> pa.Array:
    """Each element's bytes as a binary array (``values`` already big-endian)."""
    raw = pa.py_buffer(np.ascontiguousarray(values).tobytes())
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(values),
                                                [None, raw]).cast(pa.binary())


def _times(ms: np.ndarray) -> pa.Array:
    return _fixed((ms.astype(np.int64).view(np.uint64) ^ np.uint64(_SHIFT)).astype(">u8"), 8)


def data_keys(keys: pa.Array, starts: np.ndarray, tags: np.ndarray | None = None) -> pa.Array:
    """``data_key`` of many rows at once (vectorized: a batch builds its keys in C)."""
    k = keys.cast(pa.binary())
    n = len(k)
    lengths = pc.binary_length(k).to_numpy(zero_copy_only=False).astype(">u2")
    parts = [pa.array([DATA] * n, pa.binary()), _fixed(lengths, 2), k, _times(starts)]
    if tags is not None:
        parts.append(_times(tags))
    return pc.binary_join_element_wise(*parts, b"")


def index_keys(ends: np.ndarray, data: pa.Array) -> pa.Array:
    """``index_key`` of many data keys at once."""
    return pc.binary_join_element_wise(pa.array([INDEX] * len(data), pa.binary()),
                                       _times(ends), pc.binary_slice(data, 1, 1 << 30), b"")


def index_key(end: int, data: bytes) -> bytes:
    """Index entry for the data key ``data`` (which already encodes key and start)."""
    return INDEX + enc_time(end) + data[1:]


def data_key_of_index(index: bytes) -> bytes:
    return DATA + index[9:]


def start_of(data: bytes) -> int:
    """The start of a window's data key."""
    return dec_time(data[-8:])


def pane_of(data: bytes) -> int:
    """The pane start of a pane's data key."""
    return dec_time(data[-16:-8])


def tag_of(data: bytes) -> int:
    """The tag of a pane's data key (``qstate.core.windows.pane_tag``)."""
    return dec_time(data[-8:])


def rank_prefix(state: int, start: int) -> bytes:
    """Where the rank entries of one state's window begin (``NO_WINDOW``: unwindowed)."""
    return RANK + bytes((state,)) + enc_time(start)


def rank_keys(state: int, starts: np.ndarray, ranks: np.ndarray, keys: pa.Array) -> pa.Array:
    """Rank entries of many rows at once: ``ranks`` are order-preserving u64
    (``qstate.partition.ranking.ranks_of``), so one state's window sorts by value, then key."""
    n = len(keys)
    return pc.binary_join_element_wise(
        pa.array([RANK + bytes((state,))] * n, pa.binary()), _times(starts),
        _fixed(ranks.astype(">u8"), 8), keys.cast(pa.binary()), b"")


def key_of_rank(entry: bytes) -> str:
    """The key of a rank entry (``r | state | start | rank | key``)."""
    return entry[18:].decode("utf-8")
