"""What a delta row costs a shard's apply, without Spark (issue 56; docs/architecture.md §8).

    python -m loadtest.bench_apply --keys 1000000 --rows 250000 --partitions 16 --batches 24

One partition of ``--partitions`` on a shard's ``PartitionStore`` in-process, fed the tweets
job's two operators' deltas as its executors write them (``jobs/examples/tweets.py``:
``per_tweet_1h``, tumbling 1 h, counts of impressions and clicks, both ranked;
``per_tweet_1m``, sliding 1 min by 10 s, stored as panes), as ``bench_ingest`` runs that job
(16 partitions, 250,000 events a trigger): each batch the partition's share of ``--rows``
draws over its share of ``--keys`` tweet ids (the distinct ones are its delta rows), 5 s of
event time after the last, the watermark 10 s behind. ``--partitions 1``: the whole key space
in one partition, its state soon out of the memtable. The CPU of the whole process
(``process_time``: RocksDB's flush and compaction threads count) per delta row, each batch,
beside the floor of the same binding: the batch's value entries written as one
WriteBatch with no read, no fold, no index, synced as the shard's (``raw rocksdict``). The
state grows batch by batch; the cost of a row grows with it once the state is out of the
memtable (the multi-get reads SST blocks). Appends a section to ``--out``.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
from rocksdict import WriteBatch, WriteOptions

from loadtest import results
from qstate.core.records.delta import delta_schema
from qstate.core.records.operator import Aggregate, OperatorSpec, WindowSpec
from qstate.partition import layout
from qstate.partition.codec import Codec
from qstate.shard.store import PartitionStore

HOUR, MINUTE, PANE = 3_600_000, 60_000, 10_000
STEP_MS = 5_000  # event time between batches
LAG_MS = 10_000  # the job's watermark delay
T0 = 1_700_000_000_000 // HOUR * HOUR

COUNT = Aggregate("count", "long")
OPERATORS = {
    "per_tweet_1h": OperatorSpec("tweets", "per_tweet_1h", "tweet_id",
                                 {"impressions": COUNT, "clicks": COUNT}, partitions=1,
                                 window=WindowSpec("tumbling", HOUR), retention_ms=24 * HOUR),
    "per_tweet_1m": OperatorSpec("tweets", "per_tweet_1m", "tweet_id", {"impressions": COUNT},
                                 partitions=1, window=WindowSpec("sliding", MINUTE, PANE),
                                 retention_ms=HOUR),
}


def delta(spec: OperatorSpec, rng: np.random.Generator, keys: int, rows: int,
          now: int) -> pa.Table:
    """One batch's delta of ``spec`` at event time ``now``: a row a distinct key drawn."""
    ids = np.unique(rng.integers(0, keys, rows))  # this partition's share of each
    n = len(ids)
    size = PANE if spec.panes else spec.window.size_ms
    start = np.full(n, now - now % size, dtype=np.int64)
    tag = pa.array(np.zeros(n, dtype=np.int64)) if spec.panes else pa.nulls(n, pa.int64())
    schema = delta_schema(spec)
    cols = [pa.array([f"t{i:07d}" for i in ids]), pa.array(start), pa.array(start + size), tag,
            *(pa.array(rng.integers(1, 4, n)) for _ in list(schema)[4:])]
    return pa.Table.from_arrays(cols, schema=schema)


def cpu_per_row(apply: Callable[[pa.Table], None], t: pa.Table) -> float:
    c0 = time.process_time()
    apply(t)
    return 1e6 * (time.process_time() - c0) / t.num_rows


def run(spec: OperatorSpec, args: argparse.Namespace, tmp: Path) -> dict[str, list[float]]:
    """Per side, the CPU µs a delta row of each batch."""
    out: dict[str, list[float]] = {"qstate apply": [], "raw rocksdict": []}
    store = PartitionStore(tmp / spec.operator / "qstate", spec)
    raw = PartitionStore(tmp / spec.operator / "raw", spec)  # its options, written around it
    codec = Codec(spec)
    synced = WriteOptions()
    synced.sync = True  # as the shard writes a batch (docs/architecture.md §4)
    rng = np.random.default_rng(args.seed)
    try:
        for b in range(args.batches):
            now = T0 + b * STEP_MS
            t = delta(spec, rng, args.keys // args.partitions, args.rows // args.partitions, now)

            def qstate(t: pa.Table, b: int = b, now: int = now) -> None:
                store.apply(b, now - LAG_MS, 1, t, spec.retention_ms)

            def floor(t: pa.Table) -> None:
                starts = t["start"].to_numpy()
                tags = t["tag"].to_numpy() if spec.panes else None
                keys = layout.data_keys(t["key"].combine_chunks(), starts, tags)
                values = codec.encode(*codec.from_delta(t))
                wb = WriteBatch(raw_mode=True)
                for k, v in zip(keys.to_pylist(), values, strict=True):
                    wb.put(k, v)
                raw.db.write(wb, synced)

            out["qstate apply"].append(cpu_per_row(qstate, t))
            out["raw rocksdict"].append(cpu_per_row(floor, t))
            print(f"{spec.operator} batch {b}: {t.num_rows:,} rows, "
                  + ", ".join(f"{k} {v[-1]:.2f} µs" for k, v in out.items()), flush=True)
    finally:
        store.close()
        raw.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--keys", type=int, default=1_000_000, help="tweet ids drawn from")
    ap.add_argument("--rows", type=int, default=250_000, help="draws a batch (events)")
    ap.add_argument("--partitions", type=int, default=16,
                    help="the job's; one partition's share is applied")
    ap.add_argument("--batches", type=int, default=24)
    ap.add_argument("--operators", default=",".join(OPERATORS), help="a comma list")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", type=Path, default=Path("loadtest/results/apply.md"))
    args = ap.parse_args()
    unknown = set(args.operators.split(",")) - set(OPERATORS)
    if unknown:
        ap.error(f"--operators: no operator {', '.join(sorted(unknown))} "
                 f"(there are {', '.join(OPERATORS)})")
    if min(args.keys, args.rows) < args.partitions or args.batches < 1:
        ap.error("--keys and --rows must be at least --partitions, --batches at least 1")
    tmp = Path(tempfile.mkdtemp(prefix="qstate-apply-"))
    lines = [f"## apply: CPU a delta row, {args.keys:,} keys, {args.rows:,} draws a batch, "
             f"one partition of {args.partitions}", "",
             f"`{results.command('loadtest.bench_apply')}` "
             f"({time.strftime('%Y-%m-%d %H:%M')}, one partition in-process)", "",
             "| operator | side | µs CPU a delta row, each batch | mean after the first | "
             "vs raw |", "|---|---|---|---|---|"]
    try:
        for name in args.operators.split(","):
            per = run(OPERATORS[name], args, tmp)
            means = {k: float(np.mean(v[1:] or v)) for k, v in per.items()}
            for side, v in per.items():
                lines.append(f"| {name} | {side} | {' / '.join(f'{x:.2f}' for x in v)} | "
                             f"**{means[side]:.2f}** | "
                             f"{means[side] / means['raw rocksdict']:.2f}x |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    results.append(args.out, "\n".join(lines) + "\n\n")


if __name__ == "__main__":
    main()
