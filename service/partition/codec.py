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
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from qstate.core.records.operator import Aggregate, OperatorSpec

__all__ = ["INT64_MAX", "INT64_MIN", "OVERFLOWED", "Codec", "add_saturating", "stored_as_long"]

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


def _num(agg: Aggregate) -> str:
    return "<i8" if stored_as_long(agg) else "<f8"


class Codec:
    def __init__(self, spec: OperatorSpec) -> None:
        self.spec = spec
        fields: list[tuple[str, str]] = [("end", "<i8")]
        self.sketches: list[str] = []
        for name, a in spec.states.items():
            if a.kind == "count":
                fields.append((name, "<i8"))
            elif a.kind == "avg":
                fields += [(f"{name}__sum", "<f8"), (f"{name}__n", "<i8")]
            elif a.kind == "approx_count_distinct":
                self.sketches.append(name)
            else:
                fields += [(name, _num(a)), (f"{name}__has", "u1")]
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
        n = delta.num_rows
        rec = np.zeros(n, self.dtype)
        end = delta.column("end")
        rec["end"] = end.fill_null(0).to_numpy() if end.null_count else end.to_numpy()
        for name, a in self.spec.states.items():
            if a.kind == "count":
                rec[name] = delta.column(name).fill_null(0).to_numpy()
            elif a.kind == "avg":
                rec[f"{name}__sum"] = delta.column(f"{name}__sum").fill_null(0.0).to_numpy()
                rec[f"{name}__n"] = delta.column(f"{name}__n").fill_null(0).to_numpy()
            elif a.kind != "approx_count_distinct":
                col = delta.column(name)
                rec[name] = col.fill_null(0).to_numpy()
                rec[f"{name}__has"] = col.is_valid().to_numpy(zero_copy_only=False)
        blobs = [delta.column(s).to_pylist() for s in self.sketches]
        return rec, blobs

    def combine(self, old: np.ndarray, present: np.ndarray, old_blobs: list[list[bytes | None]],
                new: np.ndarray, new_blobs: list[list[bytes | None]]
                ) -> tuple[np.ndarray, list[list[bytes | None]]]:
        """Stored records (``present`` marks the real ones) met by a batch's records, row for
        row: merged aggregates combine, spark-state values are replaced."""
        out = new.copy()
        for name, a in self.spec.states.items():
            if a.kind == "value" or a.kind == "approx_count_distinct":
                continue
            if a.kind == "count":
                out[name] = old[name] + new[name]
            elif a.kind == "avg":
                for part in (f"{name}__sum", f"{name}__n"):
                    out[part] = old[part] + new[part]
            else:
                has = f"{name}__has"
                o_has = (old[has] >= 1) & present
                n_has = new[has] >= 1
                o, v = old[name], new[name]
                if a.kind == "sum" and a.type == "long":
                    # sticky: a saturated sum sits at its bound, which add_saturating keeps
                    s, over = add_saturating(np.where(o_has, o, 0), np.where(n_has, v, 0))
                    out[name] = s
                    out[has] = np.where(over, OVERFLOWED, (o_has | n_has).astype(np.uint8))
                    continue
                if a.kind == "sum":
                    out[name] = np.where(o_has, o, 0) + np.where(n_has, v, 0)
                else:
                    # Spark orders NaN above every number: min skips it, max keeps it
                    pick = np.fmin if a.kind == "min" else np.maximum
                    both = pick(o, v)
                    out[name] = np.where(o_has & n_has, both, np.where(o_has, o, v))
                out[has] = o_has | n_has
        blobs = [[_union(o, n, self.lg_k[s]) for o, n in zip(ob, nb, strict=True)]
                 for s, ob, nb in zip(self.sketches, old_blobs, new_blobs, strict=True)]
        return out, blobs

    def fold(self, records: np.ndarray, blobs: list[list[bytes | None]]
             ) -> tuple[np.ndarray, list[bytes | None]]:
        """Several records of one key combined into one (the panes of a window), in order:
        the same result as ``combine`` applied pairwise, one reduction per field."""
        acc = records[-1:].copy()  # end and replaced (spark-state) values: the last one's
        for name, a in self.spec.states.items():
            if a.kind == "count":
                acc[name] = records[name].sum()
            elif a.kind == "avg":
                for part in (f"{name}__sum", f"{name}__n"):
                    acc[part] = records[part].sum()
            elif a.kind in ("sum", "min", "max"):
                has = records[f"{name}__has"] >= 1
                vals = records[name][has]
                acc[f"{name}__has"] = bool(has.any())
                if a.kind == "sum" and a.type == "long":
                    # in order, as combine would: exact in Python ints, then the bound (a
                    # saturated record sits at its bound)
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
                        acc[f"{name}__has"] = OVERFLOWED
                elif a.kind == "sum":
                    acc[name] = vals.sum()
                elif len(vals):
                    # Spark orders NaN above every number: min skips it, max keeps it. A zero
                    # is +0.0: which of 0.0 and -0.0 numpy's reduce keeps depends on its SIMD
                    # blocking (9+ panes), so the engine could not answer the same sign
                    # (docs/architecture.md §5, one format; the engine's fold does the same)
                    x = (np.fmin if a.kind == "min" else np.maximum).reduce(vals)
                    acc[name] = x + 0.0 if a.type == "double" else x
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
        out: list[int | float | None] = []
        for name, a in self.spec.states.items():
            if a.kind == "count":
                out.append(a.typed(next(fixed)))
            elif a.kind == "avg":
                total, n = next(fixed), next(fixed)
                out.append(a.typed(total / n if n else None))
            elif a.kind == "approx_count_distinct":
                out.append(a.typed(_estimate(blobs[name])))
            else:
                v, has = next(fixed), next(fixed)
                out.append(a.typed(v) if has else None)
        return end, out

    def answers(self, record: np.void | np.ndarray, blobs: Sequence[bytes | None]
                ) -> list[int | float | None]:
        """What a client reads for each aggregate, in the spec's order."""
        out: list[int | float | None] = []
        sketches = dict(zip(self.sketches, blobs, strict=True))
        for name, a in self.spec.states.items():
            if a.kind == "count":
                out.append(a.typed(int(record[name])))
            elif a.kind == "avg":
                n = int(record[f"{name}__n"])
                out.append(a.typed(float(record[f"{name}__sum"]) / n if n else None))
            elif a.kind == "approx_count_distinct":
                out.append(a.typed(_estimate(sketches[name])))
            elif record[f"{name}__has"]:
                out.append(a.typed(record[name].item()))
            else:
                out.append(None)
        return out


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

