"""Top-N latency at a million keys while the tweets job ingests.

    python -m loadtest.bench_top --keys 1000000 --events 2000000 --rate 10000 \\
        --top-rate 20 --n 10,100 --duration 60

An Apache Kafka broker, two shard servers and a router on this machine; Spark and the
generator at nice +10, as ``make run`` starts its jobs and generators (serving first, batch
work with what is left: the machine has 2 cores). The tweets job
first loads ``--events`` events over ``--keys`` keys, all in one hour H (so H's window of
``per_tweet_1h`` holds about that many keys), then keeps running while a generator produces
``--rate`` events a second in the same hour. Meanwhile ``qstate-openloop`` (``make
bench-setup``) asks ``GET /v1/top/<job>/per_tweet_1h/impressions?n=N`` at ``--top-rate``
a second for ``--duration`` seconds, for each N of ``--n`` in turn: request i is due at
i/rate whether or not earlier ones were answered, and its latency counts from then. The
same for the sliding ``per_tweet_1m`` (its window folded from panes) at ``--sliding-rate``.
Results are appended to ``loadtest/results/top.md``. What the rank index costs ingest is
``python -m loadtest.bench_ingest --sinks qstate-norank,qstate`` (same run, same topic).

Exit codes: 0 measured; 2 a tool is missing.
"""

from __future__ import annotations

import argparse
import itertools
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from loadtest import results
from loadtest.bench_ingest import P, live_cluster, wait_all
from loadtest.openloop_tool import openloop_binary, run_openloop
from qstate.core.config import DEFAULTS
from qstate.core.records.assignment import list_servers
from qstate.core.records.storage import Storage
from qstate.embedded.demo import BATCH_NICE
from qstate.embedded.generate import produce
from qstate.jobs.examples import tweets
from qstate.jobs.examples.workloads import Tweets, events_over_span
from qstate.jobs.job import JobContext
from qstate.jobs.runtime.launch import start_job
from qstate.jobs.runtime.spark import spark_session

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[1]
HOUR = 3_600_000
JOB = "top"


def _nice(by: int) -> bool:
    """This thread's niceness changed by ``by`` (threads and processes it starts inherit
    it); False when not allowed (lowering it back needs root)."""
    try:
        os.nice(by)
    except PermissionError:
        print(f"cannot change niceness by {by}: Spark runs at this process's", flush=True)
        return False
    return True


def _row(what: str, n: int, r: dict[str, Any], shard: tuple[str, str],
         router: tuple[str, str]) -> str:
    return (f"| {what} | {n} | {r['achieved_rate']:.1f} | {r['p50_ms']:.1f} | "
            f"{r['p99_ms']:.1f} | {r['p999_ms']:.1f} | {r['ok']:,} | {r['errors']:,} | "
            f"{shard[0]} | {shard[1]} | {router[0]} | {router[1]} |")


ROUTE = "/v1/top/{job}/{operator}/{state}"


def top_buckets(urls: list[str], name: str = "qstate_shard_top_seconds_bucket",
                **labels: str) -> dict[float, float]:
    """A histogram's buckets (cumulative, summed over ``urls``): by default the shards'
    ``qstate_shard_top_seconds``."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[float, float] = {}
    for url in urls:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        for f in text_string_to_metric_families(text):
            for s in f.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    le = float(s.labels["le"])
                    out[le] = out.get(le, 0.0) + s.value
    return out


def shard_quantiles(before: dict[float, float], after: dict[float, float]
                    ) -> tuple[str, str]:
    """p50 and p99 of what a histogram observed between two scrapes, as the bucket they fall
    in ("<= 5 ms")."""
    counts = {le: after.get(le, 0.0) - before.get(le, 0.0) for le in sorted(after)}
    total = counts.get(float("inf"), 0.0)
    top = max((le for le in counts if le != float("inf")), default=0.0)

    def q(p: float) -> str:
        if not total:
            return "-"
        le = next(le for le, c in counts.items() if c >= p * total)
        return f"> {top * 1000:g} ms" if le == float("inf") else f"<= {le * 1000:g} ms"

    return q(0.5), q(0.99)


def bench(args: argparse.Namespace) -> str:
    tool = openloop_binary()
    tmp = Path(tempfile.mkdtemp(prefix="qstate-top-"))
    rows: list[str] = []
    with live_cluster(tmp, "t") as (broker, storage, shards, router):
        niced = _nice(BATCH_NICE)  # Spark's JVM and the generator thread inherit it
        spark = spark_session("bench-top", "local[2]")
        wl = Tweets(keys=args.keys, seed=5)
        hour = (int(time.time() * 1000) // HOUR) * HOUR  # H: every event falls in it
        topic = "tweets-top"
        print(f"producing {args.events:,} events over {args.keys:,} keys", flush=True)
        produce(broker.bootstrap, topic, events_over_span(wl, args.events, t0_ms=hour,
                                                          span_ms=HOUR // 2, seed=5),
                total=args.events, progress=True, partitions=4)
        ctx = JobContext(broker.bootstrap, storage, tmp / "ckpt", P, DEFAULTS.trigger_interval,
                         max_rows_per_trigger=250_000, topic=topic, job=JOB,
                         shards=[s.address for s in shards])
        running = start_job(spark, tweets.build, ctx)
        stop = threading.Event()
        try:
            t0 = time.perf_counter()
            wait_all(list(running.queries.values()), args.events)
            print(f"loaded in {time.perf_counter() - t0:.0f} s", flush=True)

            def live() -> Iterator[dict[str, Any]]:
                start = time.time()
                for _ in itertools.count():
                    if stop.is_set():
                        return
                    # the second half of H, at the pace of the clock: H stays the current hour
                    yield wl.event(hour + HOUR // 2 + int((time.time() - start) * 1000))

            gen = threading.Thread(target=lambda: produce(
                broker.bootstrap, topic, live(), rate=args.rate, progress=False,
                partitions=4), daemon=True)
            gen.start()
            if niced:
                _nice(-BATCH_NICE)  # back: the load tool this thread starts is not batch work
            board = httpx.get(f"{router.url}/v1/top/{JOB}/per_tweet_1h/impressions",
                              params={"n": 3}, timeout=30).json()
            info = httpx.get(f"{router.url}/v1/jobs/{JOB}", timeout=30).json()
            print("current board:", board, flush=True)
            metric_urls = [f"http://{i.metrics}" for i in list_servers(Storage(storage))]
            for op, rate in (("per_tweet_1h", args.top_rate),
                             ("per_tweet_1m", args.sliding_rate)):
                if rate <= 0:
                    continue
                for n in (int(x) for x in args.n.split(",")):
                    keys = tmp / f"n-{n}.txt"
                    keys.write_text(f"{n}\n")  # the tool appends a "key" to the URL: here, n
                    url = f"{router.url}/v1/top/{JOB}/{op}/impressions?n="
                    print(f"{op} n={n}: {rate}/s for {args.duration} s", flush=True)
                    before = top_buckets(metric_urls)
                    handled = top_buckets([router.url], "qstate_router_http_request_seconds_bucket",
                                          route=ROUTE)
                    r = run_openloop(tool, ["-http", url], keys, rate, args.duration)
                    rows.append(_row(op, n, r, shard_quantiles(before, top_buckets(metric_urls)),
                                     shard_quantiles(handled, top_buckets(
                                         [router.url], "qstate_router_http_request_seconds_bucket",
                                         route=ROUTE))))
                    print(rows[-1], flush=True)
        finally:
            stop.set()
            running.stop()
            spark.stop()
    ops = {o["name"]: o for o in info["operators"]}
    return "\n".join([
        f"### top-N at {args.keys:,} keys while the job ingests {args.rate:,} events/s "
        f"({time.strftime('%Y-%m-%d %H:%M')}, local[2], {P} partitions, 2 shard servers, "
        "a router, Apache Kafka 4.1 single node)", "",
        f"`{results.command('loadtest.bench_top')}`", "",
        f"The job loaded {args.events:,} events over {args.keys:,} keys in one hour first "
        f"(batch {ops['per_tweet_1h']['last_batch']} when the reads began); the board then "
        f"began {board['entries']}. Constant arrival rate (`qstate-openloop`), latency from "
        "due time, ms.", "",
        "| operator | n | top-N/s | p50 | p99 | p999 | answered | errors | shard Top p50 | "
        "shard Top p99 | router p50 | router p99 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|", *rows, "",
        "shard Top p50/p99: the shards' own time per Top call (all its partitions; "
        "`qstate_shard_top_seconds` buckets), apart from the router and the network. router "
        "p50/p99: the router's own time from the request to the start of its answer "
        "(`qstate_router_http_request_seconds` buckets), apart from the queues before it "
        "(the kernel's, the load tool's) that the open-loop latency counts."])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--keys", type=int, default=1_000_000, help="tweet keys")
    ap.add_argument("--events", type=int, default=2_000_000, help="events loaded first")
    ap.add_argument("--rate", type=int, default=10_000, help="events/s while reading")
    ap.add_argument("--top-rate", type=int, default=20, help="top-N/s of the hourly window")
    ap.add_argument("--sliding-rate", type=int, default=2,
                    help="top-N/s of the sliding minute (0: not asked)")
    ap.add_argument("--n", default="10,100", help="n of each top-N, a comma list")
    ap.add_argument("--duration", type=int, default=60, help="seconds per n")
    ap.add_argument("--out", type=Path, default=ROOT / "loadtest" / "results" / "top.md")
    args = ap.parse_args()
    results.append(args.out, bench(args))


if __name__ == "__main__":
    main()
