"""How the committed vectors of this folder were made (docs/architecture.md §5, one read core):
``python -m tests.vectors.generate`` writes them from the Python side of each rule. They are
the contract: ``cargo test`` (``engine/core/src/vectors.rs``) and pytest (``test_vectors.py``)
both read them, so a change to either language that changes an answer fails until the file is
made again on purpose, and the diff shows what changed.

- ``address.json``: the partitions of fixed keys (Spark's ``pmod(xxhash64(key), P)``; the
  Spark test in ``tests/service/core/test_address.py`` holds Spark to the same numbers), names
  and keys with the message that refuses each, keys' lengths in bytes;
- ``times.json``: what each time string a query may carry means at a fixed now, or that it is
  refused;
- ``json.json``: doubles and strings as answers write them;
- ``errors.json``: each error class's HTTP status and gRPC code, and error bodies' bytes;
- ``values.json``: stored values (the bytes the shard writes) and what a client reads of each
  state, one value or a window's panes folded, every aggregate kind and edge;
- ``settings.json``: the defaults of the settings the engine answers under.
"""

from __future__ import annotations

import json
import math
import random
import struct
from pathlib import Path
from typing import Any, cast

import numpy as np
import orjson

from qstate.core.address import check_key, check_name, partition_of
from qstate.core.config import DEFAULTS, ENGINE_SETTINGS
from qstate.core.errors import InvalidRequest, QStateError, error_classes
from qstate.core.records.operator import AggKind, Aggregate, OperatorSpec, StateType, WindowSpec
from qstate.partition.codec import INT64_MAX, INT64_MIN, OVERFLOWED, Codec

HERE = Path(__file__).parent
NOW_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def text(s: str) -> Any:
    """A vector's text: long runs written as {"repeat", "times", "then"}."""
    if len(s) > 64 and len(set(s)) == 1:
        return {"repeat": s[0], "times": len(s)}
    if len(s) > 64 and len(set(s[:-1])) == 1:
        return {"repeat": s[0], "times": len(s) - 1, "then": s[-1]}
    return s


def refusal(check: Any, *args: str) -> str | None:
    try:
        check(*args)
    except QStateError as exc:
        return exc.message
    return None


def address() -> dict[str, Any]:
    keys = ["", "a", "tw-1", "tw-2", "page-0", "page-199", "ü", "ünï/cødé key", "😀", "a" * 100,
            "x" * 1024, "k\x00k", "12345", "-", "big-count"]
    parts = [{"key": text(k), "partitions": p, "partition": partition_of(k, p)}
             for k in keys for p in (1, 8, 16, 64, 1000, 4096)]
    names = ["per_tweet_1h", "a.b-c", "_x", "A" * 64, "a" * 65, "", ".a", "-a", "a b", "a/b",
             "ü", "a\n", 'a"b', "a\\b", "views:x", "a%b", "x" * 100]
    keyset = ["k", "é" * 512, "é" * 513, "😀" * 256, "😀" * 257, "a" * 1024, "a" * 1025, "",
              "x\x00y", "a/b", " "]
    return {
        "partitions": parts,
        "names": [{"value": text(n), "message": refusal(check_name, "job", n)} for n in names],
        "keys": [{"value": text(k), "bytes": len(k.encode()), "message": refusal(check_key, k)}
                 for k in keyset],
    }


def times() -> dict[str, Any]:
    # each with what it means at NOW_MS, as the read core's parser says (the Python pattern
    # of the OpenAPI document is held to these by test_vectors.py)
    from qstate._engine import parse_time

    cases = ["0", "1", "-1", "-0", "60000", " 60000 ", "\t60000", "00060000",
             "9223372036854775807", "9999999999999999999", "-9999999999999999999",
             "10000000000000000000", "6e4", "60_000", "+60000", "٦0000", "\x1c60000",
             "now", "now-1h", "now+5m", "now 5m", "now-1ms", "now-999999999999w",
             "now-1000000000000s", "now-1y", "now-", "nowms", " now ", "NOW", "now+0s",
             "2026-01-01", "2026-01-01T10:00", "2026-01-01T10:00:00Z", "2026-01-01T10:00:00.5",
             "2026-01-01T10:00:00.000001", "2026-01-01T10:00:00.0000001", "2024-02-29",
             "2025-02-29", "2026-02-30", "2026-13-01", "2026-00-10", "0000-01-01",
             "0001-01-01", "9999-12-31T23:59:59.999999", "2026-01-01T24:00", "2026-01-01T10:60",
             "2026-01-01T10:00:60", "2026-01-01T10:00+01:00", "2026-01-01T10:00-00:30",
             "2026-01-01T10:00+0100", "2026-01-01T10:00z", "2026-01-01 10:00",
             "1970-01-01T00:00:00.0005", "1969-12-31T23:59:59.9995", "", " ", "x", "ü",
             "2026-01-01Tä0:00"]
    out = []
    for c in cases:
        try:
            ms: int | None = parse_time("from", c, NOW_MS)
        except InvalidRequest:
            ms = None
        out.append({"value": c, "ms": ms})
    return {"now_ms": NOW_MS, "times": out}


def bits(v: float) -> str:
    return struct.pack(">d", v).hex()


def json_forms() -> dict[str, Any]:
    rnd = random.Random(54)
    doubles = [1e16, 1e15, 1.5, 0.1, 1e-7, 1e-5, 1e-4, 123456.789, 5e-324, 1.7976931348623157e308,
               -0.0, 0.0, 100.0, 1e21, 12345678901234567.0, 2.5e-8, 9007199254740992.0,
               30000000000.0, 4.35e-6, -1.25, 2**53 + 1.0, 1 / 3]
    doubles += [struct.unpack(">d", rnd.getrandbits(64).to_bytes(8, "big"))[0]
                for _ in range(40)]
    doubles += [rnd.uniform(-1e6, 1e6) for _ in range(20)]
    strings = ["tw-1", "a\x00\x1f\x7f\"\\\n\t\r\x08\x0c\u2028 é", "😀", "", "'\"", "/", "<>&"]
    return {
        "doubles": [{"bits": bits(d), "json": orjson.dumps(d).decode()} for d in doubles
                    if not (math.isnan(d) or math.isinf(d))]
                   + [{"bits": bits(d), "json": "null"} for d in (math.nan, math.inf, -math.inf)],
        "strings": [{"value": s, "json": orjson.dumps(s).decode()} for s in strings],
    }


def errors() -> dict[str, Any]:
    classes = [{"class": c.__name__, "http": c.http_status, "grpc": c.grpc_code.name}
               for c in error_classes() if c.__module__ == "qstate.core.errors"]
    from qstate.core.errors import NotFound, Overloaded, TooLarge, Unavailable

    samples: list[QStateError] = [
        Unavailable("partition j/o/3 is being restored on a:1", 1.0, reason="restoring",
                    partition=3),
        Unavailable("behind", 2.5, reason="behind", partition=0, batch=7),
        NotFound('key "k" has no data in j/o/s as of batch 2', batch=2, watermark=120000),
        TooLarge("request body over 1024 bytes", limit_bytes=1024),
        Overloaded("busy", retry_after_s=1.0), InvalidRequest("say \"what\"\n")]
    bodies = [{"class": type(e).__name__, "message": e.message,
               "detail": [[k, v] for k, v in e.detail.items()],
               "body": orjson.dumps(e.body()).decode()} for e in samples]
    return {"classes": classes, "bodies": bodies}


MERGED = [("count", "long"), ("sum", "long"), ("sum", "double"), ("min", "long"),
          ("max", "long"), ("min", "double"), ("max", "double"), ("avg", "double"),
          ("avg", "long"), ("approx_count_distinct", "long")]
EDGE_LONGS = [0, 1, -1, INT64_MAX, INT64_MIN, INT64_MAX - 1, INT64_MIN + 1, 2**53 + 1, 42]
EDGE_DOUBLES = [0.0, -0.0, 1.5, -2.25, math.inf, -math.inf, math.nan, 5e-324, 1e308, 1e16,
                1e-7, 0.1, 3.0]


def spec_of(aggs: list[tuple[str, str]], window: WindowSpec) -> OperatorSpec:
    states = {f"a{i}": Aggregate(cast(AggKind, kind), cast(StateType, ty),
                                 12 if kind == "approx_count_distinct" else 0)
              for i, (kind, ty) in enumerate(aggs)}
    return OperatorSpec("j", "o", "k", states, window=window)


def sketch(users: range) -> bytes:
    import datasketches as ds

    s = ds.hll_sketch(12, ds.tgt_hll_type.HLL_8)
    for u in users:
        s.update(u)
    out: bytes = s.serialize_updatable()
    return out


def records(codec: Codec, n: int, rnd: random.Random) -> tuple[np.ndarray, list[list]]:
    rec = np.zeros(n, codec.dtype)
    for name in codec.dtype.names or ():
        kind = codec.dtype[name]
        for i in range(n):
            if kind == np.uint8:
                rec[name][i] = rnd.choice([0, 1, 1, 1, OVERFLOWED])
            elif kind == np.int64:
                rec[name][i] = rnd.choice(EDGE_LONGS + [rnd.randint(-10**12, 10**12)] * 4)
            else:
                rec[name][i] = rnd.choice(EDGE_DOUBLES + [rnd.uniform(-1e6, 1e6)] * 4)
    blobs = [[rnd.choice([None, sketch(range(rnd.randint(0, 10**6), rnd.randint(1, 3000)))])
              for _ in range(n)] for _ in codec.sketches]
    return rec, blobs


def answer(v: int | float | None) -> Any:
    if v is None:
        return None
    if isinstance(v, float):
        return {"f64": bits(v)}
    return {"i64": str(v)}


def answers(codec: Codec, values: list[bytes]) -> list[Any]:
    if len(values) == 1 and not codec.spec.panes:
        return [answer(a) for a in codec.answers_of(values[0])[1]]
    recs, _, blobs = codec.decode(values)
    rec, rec_blobs = codec.fold(recs, blobs)
    return [answer(a) for a in codec.answers(rec, rec_blobs)]


def values() -> dict[str, Any]:
    rnd = random.Random(5454)
    cases = []

    def case(name: str, spec: OperatorSpec, vals: list[bytes], read_with: OperatorSpec) -> None:
        cases.append({"name": name, "spec": json.loads(read_with.to_json()),
                      "values": [v.hex() for v in vals],
                      "end": Codec(read_with).answers_of(vals[0])[0] if len(vals) == 1 else None,
                      "answers": answers(Codec(read_with), vals)})

    tumbling = WindowSpec("tumbling", 60_000)
    for n in range(12):  # every kind, random and edge values
        aggs = rnd.sample(MERGED, rnd.randint(1, 5))
        spec = spec_of(aggs, tumbling)
        rec, blobs = records(Codec(spec), 1, rnd)
        case(f"merged {n}", spec, Codec(spec).encode(rec, blobs), spec)
    spec = spec_of([("sum", "long"), ("sum", "double"), ("avg", "double"),
                    ("approx_count_distinct", "long"), ("min", "double"), ("count", "long")],
                   tumbling)
    codec = Codec(spec)
    rec = np.zeros(1, codec.dtype)
    rec["a0"], rec["a0__has"] = INT64_MAX, OVERFLOWED
    rec["a1__has"] = 0  # no value
    rec["a4"], rec["a4__has"] = -0.0, 1
    case("saturated sum, absent values, an average of nothing, no sketch, -0.0", spec,
         codec.encode(rec, [[None]]), spec)
    for name, window in (("session", WindowSpec("session", gap_ms=30_000)),
                         ("unwindowed", WindowSpec())):
        spec = spec_of([("count", "long"), ("max", "double")], window)
        rec, blobs = records(Codec(spec), 1, rnd)
        case(name, spec, Codec(spec).encode(rec, blobs), spec)
    for ty in ("long", "double"):
        spec = spec_of([("value", ty), ("value", "double")], tumbling)
        rec, blobs = records(Codec(spec), 1, rnd)
        case(f"spark-state values ({ty})", spec, Codec(spec).encode(rec, blobs), spec)
    # written before aggregates were added: read with the spec that has them
    old = spec_of([("sum", "long"), ("count", "long")], tumbling)
    new = spec_of([("sum", "long"), ("count", "long"), ("avg", "double"), ("max", "long")],
                  tumbling)
    rec, blobs = records(Codec(old), 1, rnd)
    case("written before aggregates were added", old, Codec(old).encode(rec, blobs), new)
    # a sliding window's panes folded: numpy's pairwise sums change steps at 8 and 128,
    # min/max of zeros and NaN, long sums saturating across panes, sketches unioned
    sliding = WindowSpec("sliding", 60_000, 10_000)
    for n in (1, 2, 7, 8, 9, 16, 40, 130):
        aggs = rnd.sample(MERGED, rnd.randint(2, 6))
        spec = spec_of(aggs, sliding)
        rec, blobs = records(Codec(spec), n, rnd)
        case(f"{n} panes", spec, Codec(spec).encode(rec, blobs), spec)
    spec = spec_of([("min", "double"), ("max", "double"), ("sum", "long")], sliding)
    codec = Codec(spec)
    rec = np.zeros(10, codec.dtype)
    rec["a0"], rec["a0__has"] = [0.0, -0.0] * 5, 1
    rec["a1"], rec["a1__has"] = [-0.0, 0.0] * 5, 1
    rec["a2"], rec["a2__has"] = [INT64_MAX - 3, 2, 2, 1, -5, 0, 0, 0, 0, 0], 1
    case("10 panes of zeros of both signs, a long sum that leaves int64", spec,
         codec.encode(rec, []), spec)
    return {"cases": cases}


def settings() -> dict[str, Any]:
    return {name: getattr(DEFAULTS, name) for name in ENGINE_SETTINGS}


def main() -> None:
    for name, make in (("address", address), ("times", times), ("json", json_forms),
                       ("errors", errors), ("values", values), ("settings", settings)):
        (HERE / f"{name}.json").write_text(json.dumps(make(), indent=1, ensure_ascii=False)
                                           + "\n")
        print(f"wrote {HERE / name}.json")


if __name__ == "__main__":
    main()
