"""The classic architecture, as a benchmark baseline: the same job's per-batch partial
aggregates pushed from the executors to Redis (redis-py pipelines, HINCRBY), where a
dashboard would read them.

Redis gets its best case: partials of one batch, not every event, and only aggregates Redis
can add in place (count, integral sum: HINCRBY; floating sum: HINCRBYFLOAT). A sliding window
is written window by window, as a Redis-backed job writes it (Redis cannot combine panes
when read). Sketches are not pushed at all, which only flatters Redis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from qstate.core.records.manifest import Fragments
from qstate.core.records.operator import OperatorSpec
from qstate.core.windows import ALL_WINDOWS
from qstate.jobs.runtime.partials import Plan, Target
from qstate.jobs.runtime.reports import OperatorReport

__all__ = ["RedisSink"]

_CLIENTS: dict[tuple[str, int], Any] = {}
_CHUNK = 10_000


def _client(host: str, port: int) -> Any:
    import redis  # a benchmark dependency (pip install '.[bench]')

    c = _CLIENTS.get((host, port))
    if c is None:
        c = _CLIENTS[(host, port)] = redis.Redis(host=host, port=port)
    return c


def _windows(table: pa.Table, spec: OperatorSpec) -> pa.Table:
    """Pane partials as window partials: each pane row repeated in every window it counts in
    (its tag's first window on), then summed per (key, window)."""
    w = spec.window
    starts = table.column("start").to_numpy()
    tags = table.column("tag").to_numpy()
    first = starts - w.size_ms - (starts - w.size_ms) % w.slide_ms + w.slide_ms
    first = np.where(tags == ALL_WINDOWS, first, tags)
    last = starts - starts % w.slide_ms
    counts = (last - first) // w.slide_ms + 1
    rows = np.repeat(np.arange(len(starts)), counts)
    offsets = np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)
    exploded = table.take(pa.array(rows)).set_column(
        table.schema.get_field_index("start"), "start",
        pa.array(np.repeat(first, counts) + offsets * w.slide_ms))
    names = [n for n in exploded.column_names if n not in ("key", "start", "end", "tag")]
    summed = exploded.group_by(["key", "start"]).aggregate([(n, "sum") for n in names])
    return summed.rename_columns([n.removesuffix("_sum") for n in summed.column_names])


@dataclass(frozen=True)
class RedisTarget:
    """Pushes a task's partial rows to Redis: HINCRBY (HINCRBYFLOAT) per field and window."""

    host: str
    port: int

    def consume(self, plan: Plan, rows: pa.Table, fragment: int) -> list[tuple[int, int]]:
        spec = plan.spec
        fields = [(name, "int" if a.type == "long" else "float")
                  for name, a in spec.states.items() if a.kind in ("count", "sum")]
        if spec.panes:  # one write per window, as the classic job does
            rows = _windows(rows.drop_columns(["_qs_p"]), spec)
        prefix = f"{spec.job}:{spec.operator}:"
        cols = rows.to_pydict()
        keys, starts = cols["key"], cols["start"]
        pipe = _client(self.host, self.port).pipeline(transaction=False)
        for i in range(rows.num_rows):
            h = f"{prefix}{keys[i]}:{starts[i]}"
            for name, op in fields:
                v = cols[name][i]
                if v is not None:
                    (pipe.hincrby if op == "int" else pipe.hincrbyfloat)(h, name, v)
            if (i + 1) % _CHUNK == 0:
                pipe.execute()
        pipe.execute()
        return [(-1, rows.num_rows)]


class RedisSink:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port

    def prepare(self, specs: list[OperatorSpec]) -> None:
        _client(self.host, self.port).flushall()

    def target(self) -> Target:
        return RedisTarget(self.host, self.port)

    def flush(self, operator: str | None = None) -> None:
        pass

    def finish(self, plan: Plan, written: dict[int, Fragments], watermark_ms: int
               ) -> OperatorReport:
        return OperatorReport(sum(sum(f.values()) for f in written.values()))
