"""Pipeline throughput: how many events/s the tweets job sustains, and where the time goes.

    python -m loadtest.bench_pipeline --keys 1000 --events 600000
    python -m loadtest.bench_pipeline --keys 1000000 --events 1200000

Starts a fresh dev broker and two shard servers, produces ``--events`` tweet events over
exactly ``--keys`` distinct tweet ids (round robin, event time advancing 1 ms per 10 events),
then runs both tweets operators from the start of the topic with ``--max-rows`` per batch
and records every StreamingQueryProgress and the sink's write/commit time per batch.
Appends a section to ``--out``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console

from jobs.job import JobContext
from jobs.runner import start_job
from jobs.spark import spark_session
from loadtest import results
from service.embedded.kafka import KafkaBroker
from service.embedded.generate import produce
from service.embedded.procs import ShardProcess

console = Console(stderr=True)
T0 = 1_767_225_600_000


def events(n: int, keys: int) -> Iterator[dict[str, object]]:
    for i in range(n):
        kind = "url-click" if i % 10 == 9 else "impression"
        yield {"tweet_id": f"tw-{i % keys}", "event": kind, "time": T0 + i // 10}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--events", type=int, default=600_000)
    ap.add_argument("--max-rows", type=int, default=100_000, help="maxRowsPerTrigger")
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--out", type=Path, default=Path("loadtest/results/pipeline.md"))
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="qstate-bench-"))
    broker = KafkaBroker(tmp / "broker").start()
    shards = [ShardProcess.make(f"b{i}", tmp / "shards", str(tmp / "storage"), tmp / "logs")
              .start_and_wait() for i in range(2)]
    try:
        t = time.perf_counter()
        produce(broker.bootstrap, "tweet-events", events(args.events, args.keys),
                total=args.events)
        produce_s = time.perf_counter() - t
        spark = spark_session("bench", "local[2]")
        cfg = JobContext(broker.bootstrap, str(tmp / "storage"), tmp / "ckpt", args.partitions,
                         "0 seconds", max_rows_per_trigger=args.max_rows,
                         shards=[s.address for s in shards])
        t = time.perf_counter()
        job = start_job(spark, "tweets", cfg)
        with console.status("processing...") as status:
            while True:
                job.check()
                done = {n: sum(p.numInputRows for p in q.recentProgress)
                        for n, q in job.queries.items()}
                status.update(f"rows processed per operator: {done}")
                if all(v >= args.events for v in done.values()):
                    break
                time.sleep(0.5)
        wall = time.perf_counter() - t
        progress = {n: list(q.recentProgress) for n, q in job.queries.items()}
        job.stop()
        spark.stop()
    finally:
        for s in shards:
            s.stop()
        broker.stop()

    command = results.command("loadtest.bench_pipeline")
    lines = [f"\n## tweets job, {args.keys:,} keys, {args.events:,} events, "
             f"maxRowsPerTrigger {args.max_rows:,}, P={args.partitions}\n",
             f"`{command}` ({time.strftime('%Y-%m-%d %H:%M')}, local[2], 2 shard servers, "
             "dev broker)\n",
             f"- produced in {produce_s:.1f}s ({args.events / produce_s:,.0f} ev/s)",
             f"- both operators (two streaming queries sharing 2 cores) consumed all events in "
             f"{wall:.1f}s: **{args.events / wall:,.0f} events/s sustained** per operator "
             f"(both run concurrently)\n",
             "| operator | batches | rows/batch | processed rows/s (median, steady) "
             "| batch s p50 / max | addBatch s | sink write s | sink commit p50 / max "
             "| other ms (latestOffset+planning+wal+commit) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, ps in progress.items():
        steady = [p for p in ps if p.numInputRows > 0][1:] or ps
        stats = [r for r in job.stats[name].reports if r.rows > 0][1:]
        d = [p.durationMs for p in steady]
        other = [x.get("latestOffset", 0) + x.get("queryPlanning", 0) + x.get("walCommit", 0)
                 + x.get("commitOffsets", 0) for x in d]
        lines.append(
            f"| {name} | {len([p for p in ps if p.numInputRows])} | "
            f"{statistics.median(p.numInputRows for p in steady):,.0f} | "
            f"{statistics.median(p.processedRowsPerSecond for p in steady):,.0f} | "
            f"{statistics.median(x['triggerExecution'] for x in d) / 1000:.2f} / "
            f"{max(x['triggerExecution'] for x in d) / 1000:.2f} | "
            f"{statistics.median(x.get('addBatch', 0) for x in d) / 1000:.2f} | "
            f"{statistics.median(r.write_s for r in stats) if stats else 0:.2f} | "
            f"{pct([r.commit_s for r in stats], .5) * 1000:.0f} ms / "
            f"{max((r.commit_s for r in stats), default=0) * 1000:.0f} ms | "
            f"{statistics.median(other):.0f} |")
    text = "\n".join(lines) + "\n"
    results.append(args.out, text)


if __name__ == "__main__":
    main()
