"""The stored value of one (key, window) of an operator, and how values combine.

A value is a fixed-size little-endian record (a numpy structured dtype made from the spec),
followed by one length-prefixed blob per sketch::

    end:i8 | per aggregate: count n:i8 | sum, min, max, value v:i8|f8 has:u1
           | avg s:f8 n:i8 | approx_count_distinct (none: its sketch is a blob)
    then per approx_count_distinct: len:u4 | DataSketches HLL bytes

Fixed-size records let a batch be decoded, combined and encoded as numpy arrays rather than
row by row, which is what makes the shard's apply fast (no JSON per row). ``combine`` is
how a batch's partial aggregates meet the stored ones (merge mode) or replace them
(spark-state values); ``fold`` combines several records into one (the panes of a sliding
window, at read time); ``answers`` turns a record into what a client reads.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from qstate.core.records.operator import Aggregate, OperatorSpec

__all__ = ["INT64_MAX", "INT64_MIN", "OVERFLOWED", "Codec", "add_saturating", "ranked",
           "stored_as_long"]

_U32 = struct.Struct("<I")
# A long sum never wraps (docs/architecture.md §3): past int64 it saturates at the bound it
# crossed and stays there, marked in its ``__has`` byte, whatever comes after; a partial
# at a bound (the executors saturate theirs the same way) counts as one that overflowed.
INT64_MAX, INT64_MIN = np.iinfo(np.int64).max, np.iinfo(np.int64).min
OVERFLOWED = 2  # ``__has``: 0 no value, 1 a value, 2 a long sum saturated at its bound


def add_saturating(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """a + b for int64 arrays, saturated where it overflows, a side already at a bound
    winning (the first: ``a``); and where either happened."""
    with np.errstate(over="ignore"):
        s = a + b  # wraps; two's complement tells where
    wrapped = ((a ^ s) & (b ^ s)) < 0
    s = np.where(wrapped, np.where(a > 0, INT64_MAX, INT64_MIN), s)
    a_at = (a == INT64_MAX) | (a == INT64_MIN)
    b_at = (b == INT64_MAX) | (b == INT64_MIN)
    return np.where(a_at, a, np.where(b_at, b, s)), wrapped | a_at | b_at


def stored_as_long(agg: Aggregate) -> bool:
    """Whether a record keeps ``agg``'s value as int64, else float64: counts, and the sums,
    mins, maxes and values of longs (an average keeps a double sum and a count)."""
    return agg.kind == "count" or (agg.kind != "avg" and agg.type == "long")


# ---- one aggregate's rules, by kind: the table every method below goes through ----------------
# (as the engine's ``Slot`` does, engine/core/src/partition/codec.rs): the fields it keeps in
# the record, how a batch's partial reads into them, how two records combine, how several
# fold, what a client reads, and the value a top-N ranks it by.


class _Slot:
    """An aggregate ``name`` of kind ``agg`` in a record."""

    def __init__(self, name: str, agg: Aggregate) -> None:
        self.name, self.agg = name, agg

    def fields(self) -> list[tuple[str, str]]:
        raise NotImplementedError

    def from_delta(self, rec: np.ndarray, delta: pa.Table) -> None:
        raise NotImplementedError

    def combine(self, out: np.ndarray, old: np.ndarray, present: np.ndarray,
                new: np.ndarray) -> None:
        """``out`` (a copy of ``new``) given the stored ``old``: merged aggregates combine."""

    def fold(self, acc: np.ndarray, records: np.ndarray) -> None:
        """``acc`` (the last record) given every record of the panes, in order."""

    def answer(self, record: Any, blob: bytes | None) -> int | float | None:
        raise NotImplementedError

    def answer_of(self, fixed: Iterator[Any], blob: bytes | None) -> int | float | None:
        """The answer from the record's fields as ``struct`` unpacked them, in order."""
        raise NotImplementedError

    def ranked(self, records: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each record's value as a number to rank by, and which have one."""
        raise NotImplementedError


class _Count(_Slot):
    def fields(self) -> list[tuple[str, str]]:
        return [(self.name, "<i8")]

    def from_delta(self, rec: np.ndarray, delta: pa.Table) -> None:
        rec[self.name] = delta.column(self.name).fill_null(0).to_numpy()

    def combine(self, out: np.ndarray, old: np.ndarray, present: np.ndarray,
                new: np.ndarray) -> None:
        out[self.name] = old[self.name] + new[self.name]

    def fold(self, acc: np.ndarray, records: np.ndarray) -> None:
        acc[self.name] = records[self.name].sum()

    def answer(self, record: Any, blob: bytes | None) -> int | float | None:
        return self.agg.typed(int(record[self.name]))

    def answer_of(self, fixed: Iterator[Any], blob: bytes | None) -> int | float | None:
        return self.agg.typed(next(fixed))

    def ranked(self, records: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return records[self.name], np.ones(len(records), bool)


class _Avg(_Slot):
    def fields(self) -> list[tuple[str, str]]:
        return [(f"{self.name}__sum", "<f8"), (f"{self.name}__n", "<i8")]

    def from_delta(self, rec: np.ndarray, delta: pa.Table) -> None:
        rec[f"{self.name}__sum"] = delta.column(f"{self.name}__sum").fill_null(0.0).to_numpy()
        rec[f"{self.name}__n"] = delta.column(f"{self.name}__n").fill_null(0).to_numpy()

    def combine(self, out: np.ndarray, old: np.ndarray, present: np.ndarray,
                new: np.ndarray) -> None:
        for part in (f"{self.name}__sum", f"{self.name}__n"):
            out[part] = old[part] + new[part]

    def fold(self, acc: np.ndarray, records: np.ndarray) -> None:
        for part in (f"{self.name}__sum", f"{self.name}__n"):
            acc[part] = records[part].sum()

    def answer(self, record: Any, blob: bytes | None) -> int | float | None:
        n = int(record[f"{self.name}__n"])
        return self.agg.typed(float(record[f"{self.name}__sum"]) / n if n else None)

    def answer_of(self, fixed: Iterator[Any], blob: bytes | None) -> int | float | None:
        total, n = next(fixed), next(fixed)
        return self.agg.typed(total / n if n else None)

    def ranked(self, records: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = records[f"{self.name}__n"]
        has = n > 0
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(has, records[f"{self.name}__sum"] / np.where(has, n, 1), 0.0), has


class _Sketch(_Slot):
    """approx_count_distinct: nothing in the record; its sketch is a blob after it."""

    def fields(self) -> list[tuple[str, str]]:
        return []

    def from_delta(self, rec: np.ndarray, delta: pa.Table) -> None:
        pass

    def answer(self, record: Any, blob: bytes | None) -> int | float | None:
        return self.agg.typed(_estimate(blob))

    def answer_of(self, fixed: Iterator[Any], blob: bytes | None) -> int | float | None:
        return self.agg.typed(_estimate(blob))

    def ranked(self, records: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise ValueError("a sketch has no rank index")


class _Number(_Slot):
    """sum, min, max, and a Spark-state value: the value and whether there is one."""

    def fields(self) -> list[tuple[str, str]]:
        return [(self.name, "<i8" if stored_as_long(self.agg) else "<f8"),
                (f"{self.name}__has", "u1")]

    def from_delta(self, rec: np.ndarray, delta: pa.Table) -> None:
        col = delta.column(self.name)
        rec[self.name] = col.fill_null(0).to_numpy()
        rec[f"{self.name}__has"] = col.is_valid().to_numpy(zero_copy_only=False)

    def combine(self, out: np.ndarray, old: np.ndarray, present: np.ndarray,
                new: np.ndarray) -> None:
        kind, name, has = self.agg.kind, self.name, f"{self.name}__has"
        if kind == "value":  # a Spark-state value is replaced
            return
        o_has = (old[has] >= 1) & present
        n_has = new[has] >= 1
        o, v = old[name], new[name]
        if kind == "sum" and self.agg.type == "long":
            # sticky: a saturated sum sits at its bound, which add_saturating keeps
            s, over = add_saturating(np.where(o_has, o, 0), np.where(n_has, v, 0))
            out[name] = s
            out[has] = np.where(over, OVERFLOWED, (o_has | n_has).astype(np.uint8))
            return
        if kind == "sum":
            out[name] = np.where(o_has, o, 0) + np.where(n_has, v, 0)
        else:
            # Spark orders NaN above every number: min skips it, max keeps it
            pick = np.fmin if kind == "min" else np.maximum
            out[name] = np.where(o_has & n_has, pick(o, v), np.where(o_has, o, v))
        out[has] = o_has | n_has

    def fold(self, acc: np.ndarray, records: np.ndarray) -> None:
        kind, name, has_name = self.agg.kind, self.name, f"{self.name}__has"
        if kind == "value":  # the last one's
            return
        has = records[has_name] >= 1
        vals = records[name][has]
        acc[has_name] = bool(has.any())
        if kind == "sum" and self.agg.type == "long":
            # in order, as combine would: exact in Python ints, then the bound (a saturated
            # record sits at its bound)
            total, sat = 0, False
            for v in vals.tolist():
                if v in (INT64_MAX, INT64_MIN):
                    sat, total = True, v
                    break
                if not INT64_MIN < (total := total + v) < INT64_MAX:
                    sat, total = True, INT64_MAX if total > 0 else INT64_MIN
                    break
            acc[name] = total
            if sat:
                acc[has_name] = OVERFLOWED
        elif kind == "sum":
            acc[name] = vals.sum()
        elif len(vals):
            # Spark orders NaN above every number: min skips it, max keeps it. A zero is +0.0:
            # which of 0.0 and -0.0 numpy's reduce keeps depends on its SIMD blocking (9+
            # panes), so the engine could not answer the same sign (docs/architecture.md §5,
            # one format; the engine's fold does the same)
            x = (np.fmin if kind == "min" else np.maximum).reduce(vals)
            acc[name] = x + 0.0 if self.agg.type == "double" else x

    def answer(self, record: Any, blob: bytes | None) -> int | float | None:
        if record[f"{self.name}__has"]:
            return self.agg.typed(record[self.name].item())
        return None

    def answer_of(self, fixed: Iterator[Any], blob: bytes | None) -> int | float | None:
        v, has = next(fixed), next(fixed)
        return self.agg.typed(v) if has else None

    def ranked(self, records: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return records[self.name], records[f"{self.name}__has"] >= 1


_SLOTS: dict[str, type[_Slot]] = {"count": _Count, "avg": _Avg,
                                  "approx_count_distinct": _Sketch, "sum": _Number,
                                  "min": _Number, "max": _Number, "value": _Number}


def ranked(spec: OperatorSpec, records: np.ndarray, state: int) -> tuple[np.ndarray, np.ndarray]:
    """Each record's value of the ``state``-th aggregate as a number to rank by, and which
    have one (``qstate.partition.ranking`` orders them)."""
    name, agg = list(spec.states.items())[state]
    return _SLOTS[agg.kind](name, agg).ranked(records)


class Codec:
    def __init__(self, spec: OperatorSpec) -> None:
        self.spec = spec
        self.slots = [_SLOTS[a.kind](name, a) for name, a in spec.states.items()]
        fields: list[tuple[str, str]] = [("end", "<i8")]
        for slot in self.slots:
            fields += slot.fields()
        self.sketches: list[str] = [s.name for s in self.slots if isinstance(s, _Sketch)]
        self.dtype = np.dtype(fields)
        self.width = self.dtype.itemsize
        # one stored value without numpy (a point read decodes one): the same packed layout
        self._struct = struct.Struct("<" + "".join(
            {"<i8": "q", "<f8": "d", "u1": "B"}[t] for _, t in fields))
        assert self._struct.size == self.width
        self.lg_k = {n: spec.states[n].lg_k for n in self.sketches}

    # ---- bytes <-> arrays -----------------------------------------------------------
    # A value written before aggregates were added to its operator (docs/upgrading.md) is
    # shorter: it has the fields of the aggregates it had, which come first, and none of the
    # added ones', which read as zero (no value, a count of 0) and no sketch. One read with
    # the spec from before they were added (a router not yet refreshed) reads the fields it
    # knows, which come first.
    def _fixed(self, v: bytes) -> bytes:
        w = self.width
        return v[:w] if len(v) >= w else v.ljust(w, b"\0")

    def _blobs(self, v: bytes) -> list[bytes | None]:
        out: list[bytes | None] = []
        pos = self.width
        for _ in self.sketches:
            if pos + 4 > len(v):
                out.append(None)  # added since the value was written
                continue
            (size,) = _U32.unpack_from(v, pos)
            out.append(v[pos + 4:pos + 4 + size])
            pos += 4 + size
        return out

    def decode(self, values: Sequence[bytes | None]) -> tuple[np.ndarray, np.ndarray,
                                                              list[list[bytes | None]]]:
        """Records (zero where absent), which were present, and each sketch's blobs."""
        n = len(values)
        present = np.fromiter((v is not None for v in values), bool, n)
        zero = bytes(self.width)
        if not self.sketches:
            buf = b"".join(v if v is not None else zero for v in values)
            if len(buf) != n * self.width:  # values of another layout among them
                buf = b"".join(self._fixed(v) if v is not None else zero for v in values)
            return np.frombuffer(buf, self.dtype, n).copy(), present, []
        blobs: list[list[bytes | None]] = [[] for _ in self.sketches]
        fixed = []
        for v in values:
            if v is None:
                fixed.append(zero)
                for b in blobs:
                    b.append(None)
                continue
            fixed.append(self._fixed(v))
            for b, blob in zip(blobs, self._blobs(v), strict=True):
                b.append(blob)
        return np.frombuffer(b"".join(fixed), self.dtype, n).copy(), present, blobs

    def encode(self, records: np.ndarray, blobs: list[list[bytes | None]]) -> list[bytes]:
        raw = records.tobytes()
        w = self.width
        out = [raw[i * w:(i + 1) * w] for i in range(len(records))]
        for sketch in blobs:
            for i, b in enumerate(sketch):
                b = b or b""
                out[i] += _U32.pack(len(b)) + b
        return out

    # ---- combining --------------------------------------------------------------------
    def from_delta(self, delta: pa.Table) -> tuple[np.ndarray, list[list[bytes | None]]]:
        """A delta's rows as records (its ``end`` column included)."""
        rec = np.zeros(delta.num_rows, self.dtype)
        end = delta.column("end")
        rec["end"] = end.fill_null(0).to_numpy() if end.null_count else end.to_numpy()
        for slot in self.slots:
            slot.from_delta(rec, delta)
        return rec, [delta.column(s).to_pylist() for s in self.sketches]

    def combine(self, old: np.ndarray, present: np.ndarray, old_blobs: list[list[bytes | None]],
                new: np.ndarray, new_blobs: list[list[bytes | None]]
                ) -> tuple[np.ndarray, list[list[bytes | None]]]:
        """Stored records (``present`` marks the real ones) met by a batch's records, row for
        row: merged aggregates combine, spark-state values are replaced."""
        out = new.copy()
        for slot in self.slots:
            slot.combine(out, old, present, new)
        blobs = [[_union(o, n, self.lg_k[s]) for o, n in zip(ob, nb, strict=True)]
                 for s, ob, nb in zip(self.sketches, old_blobs, new_blobs, strict=True)]
        return out, blobs

    def fold(self, records: np.ndarray, blobs: list[list[bytes | None]]
             ) -> tuple[np.ndarray, list[bytes | None]]:
        """Several records of one key combined into one (the panes of a window), in order:
        the same result as ``combine`` applied pairwise, one reduction per field."""
        acc = records[-1:].copy()  # end and replaced (spark-state) values: the last one's
        for slot in self.slots:
            slot.fold(acc, records)
        out_blobs: list[bytes | None] = []
        for s, b in zip(self.sketches, blobs, strict=True):
            merged = b[0]
            for blob in b[1:]:
                merged = _union(merged, blob, self.lg_k[s])
            out_blobs.append(merged)
        return acc[0], out_blobs

    # ---- answers ----------------------------------------------------------------------
    def answers_of(self, value: bytes) -> tuple[int, list[int | float | None]]:
        """One stored value's ``end`` and answers: ``answers`` of ``decode([value])``, without
        building arrays (the point read's path)."""
        fixed = iter(self._struct.unpack_from(self._fixed(value) if len(value) < self.width
                                              else value))
        end = next(fixed)
        blobs = dict(zip(self.sketches, self._blobs(value), strict=True))
        return end, [slot.answer_of(fixed, blobs.get(slot.name)) for slot in self.slots]

    def answers(self, record: np.void | np.ndarray, blobs: Sequence[bytes | None]
                ) -> list[int | float | None]:
        """What a client reads for each aggregate, in the spec's order."""
        sketches = dict(zip(self.sketches, blobs, strict=True))
        return [slot.answer(record, sketches.get(slot.name)) for slot in self.slots]



def _union(a: bytes | None, b: bytes | None, lg_k: int) -> bytes | None:
    if not a:
        return b
    if not b:
        return a
    import datasketches as ds

    u = ds.hll_union(lg_k)
    u.update(ds.hll_sketch.deserialize(a))
    u.update(ds.hll_sketch.deserialize(b))
    result: bytes = u.get_result(ds.tgt_hll_type.HLL_8).serialize_updatable()
    return result


def _estimate(blob: bytes | None) -> int:
    if not blob:
        return 0
    import datasketches as ds

    return round(ds.hll_sketch.deserialize(blob).get_estimate())

