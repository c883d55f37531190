"""What ranks, and how, for top-N (docs/architecture.md §5): which states of which windows a
rank index keeps, the order-preserving u64 of a value (NaN above every number, as Spark orders
it), the window ``current`` means, and the 400 of a top-N that cannot be. Rules only, no
RocksDB: the router checks and merges with them, the shard's rank index
(``qstate.partition.rank``) writes and reads by them."""

from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np

from qstate.core.errors import InvalidRequest
from qstate.core.records.operator import Aggregate, OperatorSpec
from qstate.core.windows import first_open_start
from qstate.partition.codec import ranked, stored_as_long
from qstate.partition.layout import NO_WINDOW

__all__ = ["RANKED_KINDS", "Ranked", "check_top", "current_start", "rank_of", "ranked_states",
           "ranks_of", "value_of_rank"]

RANKED_KINDS = ("count", "sum", "min", "max", "avg", "value")
_SHIFT = np.uint64(1 << 63)
_MASK = (1 << 64) - 1


class Ranked(NamedTuple):
    key: str
    value: int | float


def ranked_states(spec: OperatorSpec) -> list[int]:
    """Indexes of the states the rank index keeps (none for panes or sessions)."""
    if spec.panes or spec.window.kind == "session":
        return []
    return [i for i, a in enumerate(spec.states.values()) if a.kind in RANKED_KINDS]


def check_top(spec: OperatorSpec, state: str) -> int:
    """The state's index, or the InvalidRequest (400) saying why it has no top-N."""
    a = spec.states[state]
    if spec.window.kind == "session":
        raise InvalidRequest(
            f"{spec.job}/{spec.operator} has session windows: each key's sessions start and "
            "end on their own, so there is no one window to rank keys in; read keys "
            "(GET /v1/state) or rank a tumbling or sliding operator")
    if a.kind not in RANKED_KINDS:
        raise InvalidRequest(f"state {state!r} is {a.kind}: top-N ranks "
                             f"{', '.join(RANKED_KINDS)} states")
    return spec.state_index[state]


def current_start(spec: OperatorSpec, watermark_ms: int) -> int:
    """The window ``window=current`` means: the oldest one still open (its end is after the
    watermark), the most complete window still counting (``NO_WINDOW``: unwindowed)."""
    if not spec.windowed:
        return NO_WINDOW
    w = spec.window
    return first_open_start(watermark_ms, w.size_ms, w.slide)


def ranks_of(spec: OperatorSpec, records: np.ndarray, state: int
             ) -> tuple[np.ndarray, np.ndarray]:
    """Each record's value of ``state`` as an order-preserving u64, and which have one.
    Longs flip the sign bit; doubles flip it too, or every bit when negative, so -inf <
    ... < -0 = 0 < ... < inf < NaN (Spark orders NaN above every number)."""
    vals, has = ranked(spec, records, state)
    if stored_as_long(list(spec.states.values())[state]):
        return vals.astype(np.int64).view(np.uint64) ^ _SHIFT, has
    bits = (vals.astype(np.float64) + 0.0).view(np.uint64)  # + 0.0: -0.0 ranks as 0.0
    return np.where(bits >> np.uint64(63), ~bits, bits | _SHIFT), has


def value_of_rank(a: Aggregate, rank: int) -> int | float:
    """The answer a rank stands for, typed as the state's answers are."""
    if stored_as_long(a):
        return a.typed(rank - (1 << 63))  # type: ignore[return-value]
    bits = rank ^ (1 << 63) if rank >> 63 else ~rank & _MASK
    return a.typed(struct.unpack(">d", bits.to_bytes(8, "big"))[0])  # type: ignore[return-value]


def rank_of(a: Aggregate, value: int | float) -> int:
    """``ranks_of`` of one answer: how answers of one state sort (NaN above every number),
    for the few a top-N merges, not the hot path."""
    if stored_as_long(a):
        return int(value) + (1 << 63)
    (bits,) = struct.unpack(">Q", struct.pack(">d", float(value) + 0.0))
    return int(bits) ^ _MASK if bits >> 63 else int(bits) | (1 << 63)
