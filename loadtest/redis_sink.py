"""The classic architecture, as a benchmark baseline: the same job's per-batch partial
aggregates pushed from the executors to Redis (redis-py pipelines, HINCRBY), where a
dashboard would read them.

Redis gets its best case: partials of one batch, not every event, and only aggregates Redis
can add in place (count, integral sum: HINCRBY; floating sum: HINCRBYFLOAT). A sliding window
is written window by window, as a Redis-backed job writes it (Redis cannot combine panes
when read). Sketches are not pushed at all, which only flatters Redis.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from jobs.sinks import OperatorReport
from service.core.operator import OperatorSpec
from service.core.windows import ALL_WINDOWS

__all__ = ["RedisSink"]

_CLIENTS: dict[tuple[str, int], Any] = {}
_CHUNK = 10_000


def _client(host: str, port: int) -> Any:
    import redis  # a benchmark dependency (pip install '.[bench]')

    c = _CLIENTS.get((host, port))
    if c is None:
        c = _CLIENTS[(host, port)] = redis.Redis(host=host, port=port)
    return c


def _pusher(spec: OperatorSpec, host: str, port: int, fields: list[tuple[str, str]]
            ) -> Any:
    prefix = f"{spec.job}:{spec.operator}:"

    def push(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        r = _client(host, port)
        n = 0
        for b in batches:
            cols = b.to_pydict()
            keys, starts = cols["key"], cols["start"]
            pipe = r.pipeline(transaction=False)
            for i in range(b.num_rows):
                h = f"{prefix}{keys[i]}:{starts[i]}"
                for name, op in fields:
                    v = cols[name][i]
                    if v is not None:
                        (pipe.hincrby if op == "int" else pipe.hincrbyfloat)(h, name, v)
                if (i + 1) % _CHUNK == 0:
                    pipe.execute()
            pipe.execute()
            n += b.num_rows
        yield pa.RecordBatch.from_arrays([pa.array([n], pa.int64())], ["rows"])

    return push


class RedisSink:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port

    def prepare(self, specs: list[OperatorSpec]) -> None:
        _client(self.host, self.port).flushall()

    def write(self, spec: OperatorSpec, partials: DataFrame, batch: int,
              watermark_ms: int) -> OperatorReport:
        t0 = time.perf_counter()
        fields = [(name, "int" if a.type == "long" else "float")
                  for name, a in spec.states.items() if a.kind in ("count", "sum")]
        rows = partials
        if spec.panes:  # one write per window, as the classic job does
            w = spec.window
            first = F.col("start") - F.lit(w.size_ms) - F.pmod(
                F.col("start") - F.lit(w.size_ms), F.lit(w.slide_ms)) + F.lit(w.slide_ms)
            first = F.when(F.col("tag") == F.lit(ALL_WINDOWS), first).otherwise(F.col("tag"))
            last = F.col("start") - F.pmod(F.col("start"), F.lit(w.slide_ms))
            rows = rows.withColumn("start", F.explode(F.sequence(first, last,
                                                                 F.lit(w.slide_ms))))
            rows = rows.groupBy("key", "start").agg(*[F.sum(n).alias(n) for n, _ in fields])
        rows = rows.select("key", "start", *[n for n, _ in fields])
        done = rows.mapInArrow(_pusher(spec, self.host, self.port, fields), "rows long")
        n = sum(r["rows"] for r in done.collect())
        return OperatorReport(n, time.perf_counter() - t0)
