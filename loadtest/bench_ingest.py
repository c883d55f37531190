"""Ingest throughput of one job through several sinks, side by side in one run.

    python -m loadtest.bench_ingest --workload tweets --keys 1000000 --events 2000000 \\
        --sinks qstate,spark-state,redis,noop --json results.json
    python -m loadtest.bench_ingest --workload tweets --keys 1000000 --events 2000000 \\
        --sinks read,parse,qstate

Starts an Apache Kafka broker (``qstate.embedded.kafka``), produces ``--events`` events of
the workload over ``--keys`` keys into one topic, then runs the job over that same topic
once per sink (``--rounds N``: N times, the order reversed each round, since the later a sink
runs the faster it goes), from the earliest offset, with batches capped at ``--max-rows``:

* ``read``: Spark's Kafka source alone, into Spark's noop sink;
* ``parse``: source + qstate's parsing (and dead-letter checks), into the noop sink;
* ``noop``: the whole merge-mode job (one pass, every operator's partials) dropped: Spark's
  own ceiling for this aggregation;
* ``qstate``: merge mode, delta files and commits on two shard servers;
* ``qstate+reads``: the same, with a router reading the job's state beside it at a constant
  ``--read-rate`` GET/s of random keys (``qstate-openloop``, ``make bench-setup``) for the
  whole run: the ingest a read load leaves, and the reads' latency meanwhile;
* ``qstate+top``: the same, with ``--top-rate`` top-N requests a second (n = ``--top-n``,
  the current hour of ``per_tweet_1h``) beside it: top-N latency while the job ingests;
* ``qstate-norank``: ``qstate`` with shards that keep no rank index (QSTATE_RANK_INDEX=false):
  beside ``qstate``, what the index top-N reads costs ingest;
* ``spark-state``: the same operators as Spark stateful aggregations (RocksDB state store),
  served by qstate's sink: what qstate did before merge mode;
* ``redis``: the classic architecture, the partials pushed to a ``redis-server`` the bench
  starts (``loadtest.redis_sink``).

``events_per_s`` is the whole run (events / time from the query's start to its last batch's
end); ``steady_events_per_s`` leaves the first batch out (its start-up). Where a batch's time
goes (read+parse, aggregate+write, commit), partial rows and state writes per event, and the
shards' merge speed (rows applied per second of apply time) come with each sink. Results are
appended to ``--out`` (markdown) and written to ``--json``.

``--freshness RATE`` instead runs the job live at RATE events/s for ``--duration`` seconds with
a router, and measures how long an event takes to be visible through it (p50/p99).
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery
from rich.console import Console

from loadtest import results
from loadtest.openloop_tool import openloop_binary
from loadtest.redis_sink import RedisSink
from qstate.control.coordinator import release
from qstate.core.config import DEFAULTS
from qstate.embedded.generate import produce
from qstate.embedded.kafka import KafkaBroker
from qstate.embedded.ports import free_port, wait_for_port
from qstate.embedded.procs import RouterProcess, ShardProcess
from qstate.jobs.examples import ads, tweets
from qstate.jobs.examples.workloads import Ads, Tweets, Workload, events_over_span, write_mapping
from qstate.jobs.job import JobContext
from qstate.jobs.parse import parse_events
from qstate.jobs.queryable import QueryableJob
from qstate.jobs.runtime import pipeline
from qstate.jobs.runtime.launch import start_job
from qstate.jobs.runtime.reports import Reports
from qstate.jobs.runtime.sinks import NoopSink, PartialsSink, QStateSink
from qstate.jobs.runtime.spark import spark_session
from qstate.jobs.source import read_kafka

console = Console(stderr=True)
SINKS = ("read", "parse", "noop", "qstate", "qstate+reads", "qstate+top", "qstate-norank",
         "spark-state", "redis")
SHARD_SINKS = ("qstate", "qstate+reads", "qstate+top", "qstate-norank", "spark-state")
T0 = 1_767_225_600_000  # 2026-01-01T00:00Z
P = 16
log = logging.getLogger(__name__)


@dataclass
class Run:
    sink: str
    events: int
    seconds: float
    steady_events_per_s: float
    batches: int
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0


def workload(name: str, keys: int) -> Workload:
    return Tweets(keys=keys, seed=1) if name == "tweets" else Ads(keys=max(1, keys // 10),
                                                                  seed=1)


def events(wl: Workload, n: int) -> Iterator[dict[str, Any]]:
    # one hour of event time however many events, 3 s out of order: no event is late
    return events_over_span(wl, n, t0_ms=T0, span_ms=3_600_000, disorder_ms=3_000, seed=1)


def build(name: str, spark: SparkSession, ctx: JobContext) -> QueryableJob:
    return (tweets if name == "tweets" else ads).build(spark, ctx)


def progress_rates(queries: list[StreamingQuery], n: int) -> tuple[float, float, int]:
    """Whole-run seconds, steady events/s (first batch left out), data batches."""
    rows = []
    for q in queries:
        for p in q.recentProgress:
            if p.numInputRows:
                start = _ts(p.timestamp)
                rows.append((start, start + p.durationMs.get("triggerExecution", 0) / 1000,
                             p.numInputRows))
    rows.sort()
    if not rows:
        return 0.0, 0.0, 0
    whole = max(e for _, e, _ in rows) - min(s for s, _, _ in rows)
    per_query = len(queries)
    later = rows[per_query:]
    steady_time = max(e for _, e, _ in rows) - min(e for _, e, _ in rows[:per_query])
    steady = sum(r for _, _, r in later) / per_query / steady_time if later and steady_time \
        else 0.0
    return whole, steady, len(rows) // per_query


def _ts(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def wait_all(queries: list[StreamingQuery], n: int, timeout: float = 3600) -> None:
    deadline = time.monotonic() + timeout
    with console.status("running") as status:
        while True:
            done = [sum(p.numInputRows for p in q.recentProgress) for q in queries]
            status.update(f"events read per query: {done} of {n:,}")
            for q in queries:
                if q.exception() is not None:
                    raise RuntimeError(f"query failed: {q.exception()}")
            if all(d >= n for d in done):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"not done in {timeout}s: {done}")
            time.sleep(0.5)


def stage_shares(reports: Reports) -> dict[str, float]:
    """Mean seconds per batch in each stage: the Spark job (source, parse, every operator's
    partials, delta files) and the commits (concurrent per operator: their slowest)."""
    bs = list(reports.batches)[1:] or list(reports.batches)
    if not bs:
        return {}
    return {
        "spark_s": statistics.mean(b.spark_s for b in bs),
        "commit_s": statistics.mean(max(o.commit_s for o in b.operators.values()) for b in bs),
        "batch_s": statistics.mean(b.total_s for b in bs),
        "partial_rows_per_event": sum(o.rows for b in reports.batches
                                      for o in b.operators.values())
        / max(1, sum(b.events for b in reports.batches)),
    }


def shard_merge(shards: list[ShardProcess], storage: str, n: int) -> dict[str, float]:
    """From the shards' own counters: rows merged per second of a shard's Commit calls
    (wall time of the call, every partition of the batch in it; the mean over shards), and
    state writes per event."""
    from qstate.core.records.assignment import list_servers
    from qstate.core.records.storage import Storage

    urls = {i.address: f"http://{i.metrics}" for i in list_servers(Storage(storage))}
    writes = 0.0
    per_shard = []
    for s in shards:
        url = urls[s.address]
        rows = metric_sum(url, "qstate_shard_applied_rows_total")
        wall = metric_sum(url, "qstate_shard_commit_seconds_sum")
        writes += metric_sum(url, "qstate_shard_state_writes_total")
        per_shard.append(rows / wall if wall else 0.0)
    return {"shard_merge_rows_per_s": statistics.mean(per_shard) if per_shard else 0.0,
            "state_writes_per_event": writes / n if n else 0.0}


def metric_sum(url: str, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name)


def run_sink(sink: str, spark: SparkSession, wname: str, broker: KafkaBroker, topic: str,
             n: int, tmp: Path, max_rows: int, redis_port: int | None,
             options: dict[str, str]) -> Run:
    """A sink that needs no shard server: read, parse, noop, redis."""
    tag = f"{sink}{int(time.time()) % 100000}"
    ckpt = tmp / f"ckpt-{tag}"
    detail: dict[str, Any] = {}
    if sink in ("read", "parse"):
        raw = read_kafka(spark, broker.bootstrap, topic, max_offsets_per_trigger=max_rows)
        fields = (tweets if wname == "tweets" else ads).FIELDS
        frame = raw if sink == "read" else parse_events(
            raw, fields, dlq_topic=f"{topic}.dlq", bootstrap=broker.bootstrap)
        queries = [frame.writeStream.format("noop").option("checkpointLocation", str(ckpt))
                   .trigger(processingTime="0 seconds").start()]
        try:
            wait_all(queries, n)
        finally:
            queries[0].stop()
    else:
        ctx = JobContext(broker.bootstrap, str(tmp / f"storage-{tag}"), ckpt, P, "0 seconds",
                         max_rows_per_trigger=max_rows, topic=topic, job=tag, options=options)
        target: PartialsSink = NoopSink() if sink == "noop" else RedisSink(
            "127.0.0.1", redis_port or 0)
        reports = Reports()
        queries = [pipeline.start(build(wname, spark, ctx), str(ckpt / "merged"), target,
                                  partitions=P, retention_ms=DEFAULTS.retention_ms,
                                  trigger_interval="0 seconds", reports=reports)]
        try:
            wait_all(queries, n)
        finally:
            queries[0].stop()
        detail.update(stage_shares(reports))
    whole, steady, batches = progress_rates(queries, n)
    return Run(sink, n, whole, steady, batches, detail)


def _with(ctx: JobContext, options: dict[str, str]) -> JobContext:
    from dataclasses import replace

    return replace(ctx, options={**ctx.options, **options})


def start_redis(tmp: Path) -> tuple[subprocess.Popen, int]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("the redis sink needs redis-server: `apt-get install redis-server` "
                         "(or `make bench-setup`)")
    port = free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    wait_for_port("127.0.0.1", port, 10, proc)
    return proc, port


def ordered(sinks: list[str], rounds: int) -> Iterator[tuple[int, str]]:
    """(round, sink) in the order they run: the sinks as given, then reversed, and so on,
    so that no sink is always the first (the slowest) or the last."""
    for n in range(rounds):
        for sink in (sinks if n % 2 == 0 else sinks[::-1]):
            yield n, sink


def combine(runs: list[Run]) -> Run:
    """One sink's rounds as one: its events over its time, the steady rate and the details
    averaged (the first failure, if any round failed)."""
    failed = [r for r in runs if "failed" in r.detail]
    if failed or len(runs) == 1:
        return (failed or runs)[0]
    numbers = {k for r in runs for k, v in r.detail.items() if isinstance(v, int | float)}
    detail = {k: sum(r.detail[k] for r in runs) / len(runs) for k in numbers
              if all(k in r.detail for r in runs)}
    return Run(runs[0].sink, sum(r.events for r in runs), sum(r.seconds for r in runs),
               sum(r.steady_events_per_s for r in runs) / len(runs),
               sum(r.batches for r in runs) // len(runs), detail)


def table(runs: list[Run], header: str) -> str:
    by = {r.sink: r for r in runs}
    ref = {k: by[k].events_per_s for k in ("redis", "noop") if k in by}
    lines = [header, "",
             "| sink | events/s (whole run) | steady events/s | vs redis | vs noop | batches | "
             "batch s | spark job s | commit wait s | partial rows/event | "
             "state writes/event | shard merge rows/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        d = r.detail
        ratio = {k: f"{r.events_per_s / v:.2f}x" if v else "-" for k, v in ref.items()}

        def f(key: str, fmt: str = "{:.2f}", d: dict = d) -> str:
            return fmt.format(d[key]) if key in d else "-"

        if "failed" in d:
            lines.append(f"| {r.sink} | failed: {d['failed']} |" + " - |" * 10)
            continue
        lines.append(
            f"| {r.sink} | {r.events_per_s:,.0f} | {r.steady_events_per_s:,.0f} | "
            f"{ratio.get('redis', '-')} | {ratio.get('noop', '-')} | {r.batches} | "
            f"{f('batch_s')} | {f('spark_s')} | {f('commit_s')} | "
            f"{f('partial_rows_per_event')} | "
            f"{f('state_writes_per_event')} | {f('shard_merge_rows_per_s', '{:,.0f}')} |")
    beside = [f"- {r.sink}: {r.detail[w + '_per_s']:,} {what}/s beside the job, p50 "
              f"{r.detail[w + '_p50_ms']:.1f} ms, p99 {r.detail[w + '_p99_ms']:.1f} ms, p999 "
              f"{r.detail.get(w + '_p999_ms') or 0:.1f} ms (from due time), "
              f"{r.detail[w + '_answered']:,} answered, {r.detail[w + '_failed']:,} failed"
              for r in runs for w, what in (("reads", "GET"), ("top", "top-N"))
              if f"{w}_per_s" in r.detail]
    return "\n".join(lines + (["", *beside] if beside else []))


def bench(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="qstate-ingest-"))
    sinks = [s for s in args.sinks.split(",") if s]
    unknown = set(sinks) - set(SINKS)
    if unknown:
        raise SystemExit(f"unknown sinks {sorted(unknown)}: choose from {SINKS}")
    broker = KafkaBroker(tmp / "broker", log_path=tmp / "broker.log").start()
    redis = start_redis(tmp) if "redis" in sinks else None
    spark = spark_session("bench-ingest", "local[2]")
    out: dict[str, Any] = {"workload": args.workload, "events": args.events, "runs": []}
    try:
        # JIT and Python workers warm before anything is measured, so the first sink of
        # the run does not pay for them
        warm = workload(args.workload, 10_000)
        options: dict[str, str] = {}
        if isinstance(warm, Ads):
            options["mapping"] = str(write_mapping(warm.mapping, tmp / "campaigns.json"))
        produce(broker.bootstrap, "warm-up", events(warm, 300_000), progress=False,
                partitions=4)
        console.print("warming up Spark")
        run_sink("noop", spark, args.workload, broker, "warm-up", 300_000, tmp,
                 args.max_rows, None, options)
        for keys in [int(k) for k in str(args.keys).split(",")]:
            wl = workload(args.workload, keys)
            options = {}
            if isinstance(wl, Ads):
                options["mapping"] = str(write_mapping(wl.mapping, tmp / "campaigns.json"))
            topic = f"{args.workload}-{keys}"
            t = time.perf_counter()
            produce(broker.bootstrap, topic, events(wl, args.events), total=args.events,
                    progress=True, partitions=4)
            console.print(f"produced {args.events:,} events over {keys:,} keys in "
                          f"{time.perf_counter() - t:.1f}s")
            rounds: dict[str, list[Run]] = {sink: [] for sink in sinks}
            for n, sink in ordered(sinks, args.rounds):
                console.print(f"[bold]{sink}[/bold] ({keys:,} keys, round {n + 1})")
                try:
                    if sink in SHARD_SINKS:
                        run = run_with_shards(sink, spark, args, broker, topic, tmp, options)
                    else:
                        run = run_sink(sink, spark, args.workload, broker, topic, args.events,
                                       tmp, args.max_rows, redis[1] if redis else None,
                                       options)
                except Exception as exc:  # the other sinks of the run still count
                    log.exception("sink %s failed", sink)
                    console.print(f"  [red]failed: {exc}[/red]")
                    rounds[sink].append(Run(sink, args.events, 0.0, 0.0, 0, {
                        "failed": f"{type(exc).__name__}: {exc}"[:200]}))
                    continue
                console.print(f"  {run.events_per_s:,.0f} events/s, steady "
                              f"{run.steady_events_per_s:,.0f}")
                rounds[sink].append(run)
            runs = [combine(rounds[sink]) for sink in sinks]
            header = (f"### {args.workload}, {keys:,} keys, {args.events:,} events, batches of "
                      f"{args.max_rows:,} ({time.strftime('%Y-%m-%d %H:%M')}, local[2], "
                      f"2 shard servers, Apache Kafka 4.1 single node)\n\n"
                      f"`{results.command('loadtest.bench_ingest')}`\n\n"
                      "batch s, spark job s (source + parse + every operator's partials + "
                      "delta files, one Spark job) and commit wait s are means per batch, "
                      "first batch excluded; commit wait is how long a batch waited for its "
                      "commits (qstate: the previous batch's, delivered while Spark computed "
                      "this one). Shard merge rows/s: delta rows applied per second of a "
                      "shard's Commit calls." + (
                          f" {args.rounds} rounds, the sinks' order reversed each round (the "
                          "later a sink runs, the faster: JIT, caches): events/s are all "
                          "the rounds' events over their time, the other columns means; "
                          "each round's events/s below the table." if args.rounds > 1
                          else ""))
            each = [f"- {sink}, each round: " + " / ".join(
                f"{r.events_per_s:,.0f}" for r in rounds[sink]) for sink in sinks]
            results.append(args.out, table(runs, header) + (
                "\n\n" + "\n".join(each) if args.rounds > 1 else ""))
            out["runs"].append({"keys": keys, "sinks": {r.sink: {
                "events_per_s": round(r.events_per_s), "steady_events_per_s":
                    round(r.steady_events_per_s), "batches": r.batches, **r.detail,
                "rounds": [round(x.events_per_s) for x in rounds[r.sink]]}
                for r in runs}})
    finally:
        spark.stop()
        if redis is not None:
            redis[0].terminate()
        broker.stop()
    # the last key count's sinks, at the top level (the documented shape)
    out["sinks"] = out["runs"][-1]["sinks"] if out["runs"] else {}
    return out


def run_with_shards(sink: str, spark: SparkSession, args: argparse.Namespace,
                    broker: KafkaBroker, topic: str, tmp: Path, options: dict[str, str]) -> Run:
    """Two shard servers live as long as the sink's run, over its own storage, so their
    counters are the run's."""
    storage = tmp / f"storage-{sink}-{int(time.time())}"
    env = {**os.environ, "QSTATE_RANK_INDEX": "false"} if sink == "qstate-norank" else None
    live = [ShardProcess.make(f"b{i}", tmp / f"data-{sink}-{int(time.time())}", str(storage),
                              tmp / "logs", env=env).start_and_wait() for i in range(2)]
    job_name = f"{sink.replace('-', '').replace('+', '')}{int(time.time()) % 100000}"
    reads = None
    if sink in ("qstate+reads", "qstate+top"):
        reads = ReadLoad(tmp, str(storage), job_name, args, top=sink == "qstate+top")
    try:
        run = run_sink_on(sink, spark, args, broker, topic, tmp, live, str(storage), options,
                          job_name, reads)
        run.detail.update(shard_merge(live, str(storage), args.events))
        if reads is not None:
            run.detail.update(reads.result())
        return run
    finally:
        if reads is not None:
            reads.stop()
        for s in live:
            s.stop()


class ReadLoad:
    """A router over the run's storage and ``qstate-openloop`` GETs of random tweet keys of
    the job at ``--read-rate``/s (``top``: ``--top-rate`` top-N requests of the current
    hour), from the job's start until ``result``."""

    def __init__(self, tmp: Path, storage: str, job: str, args: argparse.Namespace,
                 top: bool = False) -> None:
        self.router = RouterProcess.make(storage, tmp / "logs", f"router-{job}").start_and_wait()
        keys = tmp / f"read-keys-{job}.txt"
        self.proc: subprocess.Popen[str] | None = None
        self.top = top
        if top:  # the tool appends a "key" to the URL: here, n
            keys.write_text(f"{args.top_n}\n")
            url, rate = f"{self.router.url}/v1/top/{job}/per_tweet_1h/impressions?n=", \
                args.top_rate
        else:
            keys.write_text("".join(f"tw-{i}\n" for i in range(
                0, int(args.keys), max(1, int(args.keys) // 10_000))))
            url, rate = f"{self.router.url}/v1/state/{job}/per_tweet_1h/impressions/", \
                args.read_rate
        self.args = [openloop_binary(), "-http", url, "-keys", str(keys), "-rate", str(rate),
                     "-duration", "3600s"]

    def start(self) -> None:
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, text=True)

    def result(self) -> dict[str, Any]:
        """The reads so far (the run is over): their rate and latency from due time."""
        if self.proc is None:
            return {}
        self.proc.terminate()  # ends the schedule; it reports what it sent
        out, _ = self.proc.communicate(timeout=60)
        self.proc = None
        r = orjson.loads(out)
        what = "top" if self.top else "reads"
        return {f"{what}_per_s": round(r["achieved_rate"], 1), f"{what}_p50_ms": r["p50_ms"],
                f"{what}_p99_ms": r["p99_ms"], f"{what}_p999_ms": r.get("p999_ms"),
                f"{what}_answered": r["ok"] + r["missing"], f"{what}_failed": r["errors"]}

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
        self.router.stop()


def run_sink_on(sink: str, spark: SparkSession, args: argparse.Namespace, broker: KafkaBroker,
                topic: str, tmp: Path, shards: list[ShardProcess], storage: str,
                options: dict[str, str], job_name: str, reads: ReadLoad | None = None) -> Run:
    ckpt = tmp / f"ckpt-{sink}-{int(time.time())}"
    ctx = JobContext(broker.bootstrap, storage, ckpt, P, "0 seconds",
                     max_rows_per_trigger=args.max_rows, topic=topic, job=job_name,
                     shards=[s.address for s in shards], options=dict(options))
    if sink == "spark-state":
        running = start_job(spark, tweets.build if args.workload == "tweets" else ads.build,
                            _with(ctx, {"mode": "spark-state"}))
        queries = list(running.queries.values())
        try:
            wait_all(queries, args.events)
        finally:
            running.stop()
        whole, steady, batches = progress_rates(queries, args.events)
        return Run(sink, args.events, whole, steady, batches, {})
    job = build(args.workload, spark, ctx)
    reports = Reports()
    target = QStateSink(storage, ctx.shards, DEFAULTS.commit_timeout_s)
    query = pipeline.start(job, str(ckpt / "merged"), target, partitions=P,
                           retention_ms=DEFAULTS.retention_ms, trigger_interval="0 seconds",
                           reports=reports)
    if reads is not None:
        reads.start()
    try:
        wait_all([query], args.events)
    finally:
        query.stop()
        target.flush()  # the last batch's commits
        release(storage, job_name)  # its heartbeats end with the run
    whole, steady, batches = progress_rates([query], args.events)
    return Run(sink, args.events, whole, steady, batches, stage_shares(reports))


# ---- freshness ---------------------------------------------------------------------------

@contextmanager
def live_cluster(tmp: Path, prefix: str
                 ) -> Iterator[tuple[KafkaBroker, str, list[ShardProcess], RouterProcess]]:
    """A broker, two shard servers (``prefix``0, 1) over ``tmp``'s storage and a router: the
    serving side of a live run, stopped on exit."""
    broker = KafkaBroker(tmp / "broker", log_path=tmp / "broker.log").start()
    storage = str(tmp / "storage")
    shards: list[ShardProcess] = []
    router: RouterProcess | None = None
    try:
        for i in range(2):
            shards.append(ShardProcess.make(f"{prefix}{i}", tmp / "data", storage,
                                            tmp / "logs").start_and_wait())
        router = RouterProcess.make(storage, tmp / "logs").start_and_wait()
        yield broker, storage, shards, router
    finally:
        if router is not None:
            router.stop()
        for s in shards:
            s.stop()
        broker.stop()


def freshness(args: argparse.Namespace) -> dict[str, Any]:
    """Events at a steady rate, a probe event every 100 ms for key ``probe``: the poller reads
    the probe's hourly count through the router every 20 ms; probe i is visible when the
    count reaches i. Latency = visible - sent."""
    tmp = Path(tempfile.mkdtemp(prefix="qstate-fresh-"))
    with live_cluster(tmp, "f") as (broker, storage, shards, router):
        spark = spark_session("bench-fresh", "local[2]")
        topic = "tweets-live"
        wl = Tweets(keys=args.keys_fresh, seed=3)
        sent: list[float] = []
        stop = threading.Event()

        def live() -> Iterator[dict[str, Any]]:
            next_probe = time.time()
            for _ in itertools.count():
                if stop.is_set():
                    return
                now = time.time()
                if now >= next_probe:
                    sent.append(now)
                    next_probe += 0.1
                    yield {"tweet_id": "probe", "event": "impression", "time": int(now * 1000)}
                yield wl.event(int(now * 1000) - 500)

        gen = threading.Thread(target=lambda: produce(broker.bootstrap, topic, live(),
                                                      rate=args.freshness, progress=False,
                                                      partitions=4), daemon=True)
        ctx = JobContext(broker.bootstrap, storage, tmp / "ckpt", P, DEFAULTS.trigger_interval,
                         max_rows_per_trigger=args.max_rows, topic=topic, job="fresh",
                         shards=[s.address for s in shards], starting_offsets="latest")
        running = start_job(spark, tweets.build, ctx)
        visible: list[float] = []
        try:
            gen.start()
            deadline = time.time() + args.duration
            with httpx.Client(base_url=router.url, timeout=2) as c:
                while time.time() < deadline:
                    r = c.get("/v1/state/fresh/per_tweet_1h/impressions/probe",
                              params={"from": "0", "to": str(1 << 62)})
                    if r.status_code == 200:
                        total = sum(w["value"] for w in r.json()["windows"])
                        now = time.time()
                        while len(visible) < min(total, len(sent)):
                            visible.append(now)
                    time.sleep(0.02)
        finally:
            stop.set()
            running.stop()
            spark.stop()
    warm = args.duration / 4  # leave the start-up out
    lat = [v - s for s, v in zip(sent, visible, strict=False) if s - sent[0] > warm]
    lat.sort()
    res = {"rate": args.freshness, "samples": len(lat),
           "p50_s": round(lat[len(lat) // 2], 3) if lat else None,
           "p99_s": round(lat[int(len(lat) * 0.99)], 3) if lat else None}
    results.append(args.out, f"### freshness at {args.freshness:,} events/s "
                             f"({time.strftime('%Y-%m-%d %H:%M')}, local[2], 2 shards, router)"
                             f"\n\n`{results.command('loadtest.bench_ingest')}`\n\n"
                             f"event produced -> visible through the router: p50 "
                             f"{res['p50_s']} s, p99 {res['p99_s']} s ({res['samples']} probes "
                             f"after {warm:.0f} s of warm-up)")
    return res


def plot_sweep(res: dict[str, Any], out: Path) -> None:
    """Events/s (whole run) against keys, one line per sink, from ``bench``'s result."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = sorted(res["runs"], key=lambda r: r["keys"])
    keys = [r["keys"] for r in runs]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for sink in sorted({s for r in runs for s in r["sinks"]}):
        have = [(r["keys"], r["sinks"][sink]["events_per_s"]) for r in runs if sink in r["sinks"]]
        ax.plot([k for k, _ in have], [v for _, v in have], marker="o", label=sink)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(keys, [f"{k:,}" for k in keys])
    ax.set_xlabel("distinct keys")
    ax.set_ylabel("events/s (whole run)")
    ax.set_title(f"{res['workload']}: {res['events']:,} events per run, local[2], 2 shard "
                 "servers, one machine")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--workload", choices=("tweets", "ads"), default="tweets")
    ap.add_argument("--keys", default="1000000", help="keys, or a comma list for a sweep")
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--sinks", default="qstate,spark-state,redis,noop")
    ap.add_argument("--max-rows", type=int, default=250_000, help="maxOffsetsPerTrigger")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the sinks this many times, their order reversed each round")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=Path("loadtest/results/ingest.md"))
    ap.add_argument("--read-rate", type=int, default=5000,
                    help="qstate+reads: GET/s beside the job (default: %(default)s)")
    ap.add_argument("--top-rate", type=float, default=20.0,
                    help="qstate+top: top-N requests/s beside the job (default: %(default)s)")
    ap.add_argument("--top-n", type=int, default=100,
                    help="qstate+top: n of each (default: %(default)s)")
    ap.add_argument("--freshness", type=int, default=0,
                    help="events/s: measure freshness instead of throughput")
    ap.add_argument("--duration", type=float, default=120.0)
    ap.add_argument("--keys-fresh", type=int, default=100_000)
    ap.add_argument("--plot", type=Path, default=None,
                    help="a PNG of events/s against keys per sink (a sweep)")
    ap.add_argument("--replot", type=Path, default=None,
                    help="only draw --plot from an earlier run's --json")
    args = ap.parse_args()
    if args.replot:
        plot_sweep(orjson.loads(args.replot.read_bytes()), args.plot or Path("sweep.png"))
        return
    res = freshness(args) if args.freshness else bench(args)
    if args.json:
        args.json.write_bytes(orjson.dumps(res, option=orjson.OPT_INDENT_2))
    if args.plot and not args.freshness:
        plot_sweep(res, args.plot)
    console.print_json(orjson.dumps(res).decode())


if __name__ == "__main__":
    main()
