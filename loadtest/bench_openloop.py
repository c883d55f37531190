"""Point reads under ``make run``'s ingest: native front vs Python front vs Redis, one run.

Issue 45; docs/architecture.md §5 and §8.

    python -m loadtest.bench_openloop                      # 1K, 2K, 5K GET/s, 60 s each
    python -m loadtest.bench_openloop --rates 2000 --duration 30 --closed-duration 0

``python -m qstate run`` (what ``make run`` starts: broker, two shards, the router, the tweets
and ads jobs and their generators at 5K + 1K ev/s) runs in a fresh home; its router has the
native front (the engine's, the default). Once every operator has committed, a second router
on the same storage and shards is started with ``QSTATE_NATIVE_FRONT=false`` (the Python
front: uvicorn, the raw-ASGI fast path, FastAPI; the "before"; with ``--unfollowed`` two
more, alike but for the read engine's follower, QSTATE_ROUTER_FOLLOW_MS), ``--keys`` tweet
keys that answer are picked at random, and a ``redis-server`` gets each one's answer (the
JSON bytes the router sends) under ``tw:<key>`` (for qstate-openloop) and ``tw:<12 digits>``
(the i-th key, for redis-benchmark's ``-r``). The raw ASGI server of ``bench_router``
(uvicorn answering from a dict: Python with no work) holds as many keys. Then, while the
demo ingests:

0. ``--warmup`` s of ingest alone (the start-up backlog's batches);
1. quiet: ``--duration`` s without reads (the job's ingest and commits without them);
2. closed loop: ``wrk -t1 -c32`` GETs of random picked keys against each router, and
   ``redis-benchmark -c 32 GET`` of them against Redis, ``--closed-duration`` s each;
3. open loop: for each of ``--rates``, each target in turn takes the same schedule of GETs
   from ``qstate-openloop`` (loadtest/openloop, built by ``make bench-setup``): request i is
   due at i/rate whether or not earlier ones were answered, and its latency counts from when
   it was due, so queueing delay counts (a closed loop hides it);
4. quiet again.

For every window the tweets job's ingest (events read a second, its lag at the end) and its
batches' commit latency and duration come from the job's metrics; each router's CPU time
over the requests it answered is its CPU µs a GET. Routers, the raw server and Redis run on
``--server-cpus``, every load generator on ``--client-cpus`` (taskset); the demo's other
processes (broker, shards, Spark, generators) run on any core. Results: tables appended to
``--out`` and the latency-vs-offered-rate plot beside it (router_latency.png).

Exit codes: 0 measured; 1 the demo did not become ready; 2 a tool is missing.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from loadtest import results
from loadtest.bench_ingest import start_redis
from loadtest.bench_router import (
    file_pick,
    get_script,
    redis_benchmark,
    redis_requests,
    run_wrk,
    start_raw,
)
from loadtest.cpu import cpu_seconds, pin, pinned
from loadtest.openloop_tool import openloop_binary, run_openloop
from loadtest.soak import TWEET_KEYS, DemoRun, Soak
from qstate.embedded.procs import RouterProcess

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[1]
STATE = "/v1/state/tweets/per_tweet_1h/impressions/"
RAW_STATE = "/v1/state/shop/views_1m/views/"
PREFIX = "tw:"
NATIVE = "router, native front"
PYTHON = "router, Python front (before)"
UNFOLLOWED = "router, native front, no follower (QSTATE_ROUTER_FOLLOW_MS=0)"
FOLLOWED = "router, native front, follower (QSTATE_ROUTER_FOLLOW_MS=20)"
RAW = "raw ASGI dict server (uvicorn)"
REDIS = "Redis 7 GET, same keys and bytes"
ROUTERS = (NATIVE, UNFOLLOWED, FOLLOWED, PYTHON)
Result = dict[str, float]


def pick_keys(url: str, n: int, seed: int = 11) -> dict[str, bytes]:
    """``n`` random tweet keys that answer now, with the router's answer for each."""
    rng = random.Random(seed)
    out: dict[str, bytes] = {}
    with httpx.Client(base_url=url, timeout=10) as http:
        while len(out) < n:
            key = f"tw-{rng.randrange(TWEET_KEYS)}"
            r = http.get(STATE + key)
            if r.status_code == 200:
                out[key] = r.content
    return out


def load_redis(port: int, answers: dict[str, bytes]) -> None:
    """Each answer under ``tw:<key>`` and, the i-th, under ``tw:<i, 12 digits>``."""
    import redis

    r = redis.Redis(port=port)
    r.mset({PREFIX + k: v for k, v in answers.items()})
    r.mset({f"{PREFIX}{i:012d}": v for i, v in enumerate(answers.values())})
    r.close()


# ---- the job's metrics, per window ----------------------------------------------------------

@dataclass
class JobSample:
    t: float
    events: float = 0.0
    lag: float = 0.0
    commit_sum: float = 0.0
    commit_count: float = 0.0
    commit_le: dict[float, float] = field(default_factory=dict)
    batch_sum: float = 0.0
    batch_count: float = 0.0


def job_sample(port: int, job: str = "tweets") -> JobSample:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    s = JobSample(time.monotonic())
    for fam in text_string_to_metric_families(text):
        for m in fam.samples:
            if m.labels.get("job") != job:
                continue
            if m.name == "qstate_job_events_total":
                s.events += m.value
            elif m.name == "qstate_job_lag_events":
                s.lag += m.value
            elif m.name == "qstate_sink_commit_seconds_sum":
                s.commit_sum += m.value
            elif m.name == "qstate_sink_commit_seconds_count":
                s.commit_count += m.value
            elif m.name == "qstate_sink_commit_seconds_bucket":
                le = float(m.labels["le"])
                s.commit_le[le] = s.commit_le.get(le, 0.0) + m.value
            elif m.name == "qstate_job_batch_seconds_sum":
                s.batch_sum += m.value
            elif m.name == "qstate_job_batch_seconds_count":
                s.batch_count += m.value
    return s


def quantile_of(buckets: dict[float, float], q: float) -> float:
    """``histogram_quantile``: the ``q`` quantile of cumulative bucket counts, interpolated
    linearly inside the bucket it falls in."""
    edges = sorted(buckets)
    total = buckets[edges[-1]] if edges else 0.0
    if total <= 0:
        return math.nan
    lo, below = 0.0, 0.0
    for le in edges:
        if buckets[le] >= q * total:
            if math.isinf(le):
                return lo
            return lo + (le - lo) * (q * total - below) / max(buckets[le] - below, 1e-9)
        lo, below = le, buckets[le]
    return lo


def window(a: JobSample, b: JobSample) -> Result:
    """The tweets job between two samples: ingest, lag at the end, its batches' commits."""
    commits = b.commit_count - a.commit_count
    batches = b.batch_count - a.batch_count
    return {"ev_s": (b.events - a.events) / (b.t - a.t), "lag": b.lag,
            "commits": commits,
            "commit_ms": 1000 * (b.commit_sum - a.commit_sum) / commits if commits else math.nan,
            "commit_p90_ms": 1000 * quantile_of(
                {le: b.commit_le[le] - a.commit_le.get(le, 0.0) for le in b.commit_le}, 0.9),
            "batch_s": (b.batch_sum - a.batch_sum) / batches if batches else math.nan}


# ---- targets -------------------------------------------------------------------------------

@dataclass
class Target:
    label: str
    url: str = ""  # HTTP: the prefix a key is appended to
    keys: Path | None = None  # the file of keys its load generator picks from
    pid: int = 0  # the server whose CPU counts
    redis_port: int = 0


@dataclass
class Run:
    """What the bench measured, window by window."""

    closed: list[tuple[Target, Result, Result]] = field(default_factory=list)
    open: list[tuple[int, Target, Result, Result]] = field(default_factory=list)
    quiet: list[Result] = field(default_factory=list)


class Bench:
    def __init__(self, args: argparse.Namespace, tmp: Path, job_port: int, binary: str
                 ) -> None:
        self.args, self.tmp, self.job_port, self.binary = args, tmp, job_port, binary
        self.run = Run()

    def _timed(self, t: Target, go: Callable[[], Result]) -> tuple[Result, Result]:
        """``go()``, with the server's CPU and the job's window around it."""
        a, c0 = job_sample(self.job_port), cpu_seconds(t.pid)
        r = go()
        r["cpu_s"] = cpu_seconds(t.pid) - c0
        b = job_sample(self.job_port)
        time.sleep(self.args.settle)  # what the run left queued drains before the next
        return r, window(a, b)

    def quiet(self) -> None:
        a = job_sample(self.job_port)
        time.sleep(self.args.duration)
        self.run.quiet.append(window(a, job_sample(self.job_port)))

    def closed(self, t: Target) -> None:
        a = self.args
        if t.redis_port:
            cmd = ["GET", PREFIX + "__rand_int__"]
            n = redis_requests(t.redis_port, cmd, a.keys, 32, a.closed_duration,
                               a.client_cpus)
            r, w = self._timed(t, lambda: redis_benchmark(t.redis_port, cmd, a.keys, 32, n,
                                                          a.client_cpus))
        else:
            assert t.keys is not None
            base, path = t.url.split("/v1/", 1)
            lua = get_script("/v1/" + path, file_pick(t.keys))
            r, w = self._timed(t, lambda: run_wrk(base, lua, a.closed_duration, self.tmp, 32,
                                                  a.client_cpus))
        self.run.closed.append((t, r, w))
        say(f"closed loop, {t.label}: {r['rps']:,.0f} GET/s, p99 {r['p99']:.2f} ms")

    def open(self, rate: int, t: Target) -> None:
        a = self.args
        target = ["-redis", f"127.0.0.1:{t.redis_port}", "-prefix", PREFIX] \
            if t.redis_port else ["-http", t.url]
        assert t.keys is not None
        keys = t.keys

        r, w = self._timed(t, lambda: run_openloop(self.binary, target, keys, rate,
                                                   a.duration, a.client_cpus))
        self.run.open.append((rate, t, r, w))
        say(f"{rate}/s, {t.label}: p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, "
            f"errors {r['errors'] + r['missing']:.0f}")


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ---- results -------------------------------------------------------------------------------

def _f(v: float, fmt: str = ".2f") -> str:
    return "-" if math.isnan(v) else format(v, fmt)


def window_cells(w: Result) -> str:
    return (f"{w['ev_s']:,.0f} | {w['lag']:,.0f} | {w['commits']:.0f} | "
            f"{_f(w['commit_ms'], '.0f')} | {_f(w['commit_p90_ms'], '.0f')} | "
            f"{_f(w['batch_s'])}")


def tables(args: argparse.Namespace, run: Run) -> list[str]:
    lines: list[str] = []
    redis_closed = next((r for t, r, _ in run.closed if t.label == REDIS), None)
    if run.closed:
        lines += [f"Closed loop, {args.closed_duration} s each, 32 connections, random keys of "
                  f"the {args.keys:,} (wrk -t1 -c32; Redis: redis-benchmark -c 32):\n",
                  "| target | GET/s | p50 ms | p99 ms | non-2xx + errors | x Redis | server CPU "
                  "µs a GET |", "|---|---|---|---|---|---|---|"]
        for t, r, _ in run.closed:
            x = r["rps"] / redis_closed["rps"] if redis_closed else math.nan
            lines.append(f"| {t.label} | **{r['rps']:,.0f}** | {r['p50']:.2f} | "
                         f"{r['p99']:.2f} | {r['non2xx'] + r['errors']:.0f} | **{x:.2f}** | "
                         f"{1e6 * r['cpu_s'] / r['requests']:.1f} |")
        lines.append("")
    redis_p99 = {rate: r["p99_ms"] for rate, t, r, _ in run.open if t.label == REDIS}
    lines += [f"Open loop, {args.duration} s a rate and target (qstate-openloop, latency from "
              "due time, 5 s timeout):\n",
              "| target | offered/s | achieved/s | p50 ms | p90 ms | p99 ms | p999 ms | max ms "
              "| errors | p99 / Redis p99 | server CPU µs a GET |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for rate, t, r, _ in run.open:
        bad = r["errors"] + r["missing"]
        sent = r["sent"] or 1
        lines.append(f"| {t.label} | {r['offered_rate']:,.0f} | {r['achieved_rate']:,.0f} | "
                     f"{r['p50_ms']:.2f} | {r['p90_ms']:.2f} | **{r['p99_ms']:.2f}** | "
                     f"{r['p999_ms']:.2f} | {r['max_ms']:.1f} | {bad:.0f} | "
                     f"**{r['p99_ms'] / redis_p99.get(rate, math.nan):.2f}** | "
                     f"{1e6 * r['cpu_s'] / sent:.1f} |")
    lines += ["", "The tweets job in each window (its metrics: events read a second, lag at the "
              "window's end, batches committed, commit time on the shards, whole batch):\n",
              "| window | tweets ev/s | lag | commits | commit mean ms | commit p90 ms | "
              "batch mean s |", "|---|---|---|---|---|---|---|"]
    for i, w in enumerate(run.quiet):
        lines.append(f"| quiet {i + 1} (no reads) | {window_cells(w)} |")
    for t, _, w in run.closed:
        lines.append(f"| closed loop, {t.label} | {window_cells(w)} |")
    for rate, t, _, w in run.open:
        lines.append(f"| {rate:,}/s, {t.label} | {window_cells(w)} |")
    lines += ["", *goals(run)]
    return lines


def goals(run: Run) -> list[str]:
    """The ratios issue 45 sets goals on, in words."""
    out = []
    rps = {t.label: r["rps"] for t, r, _ in run.closed}
    if REDIS in rps:
        out += [f"- closed loop: {label} **{rps[label] / rps[REDIS]:.2f}x Redis** (goal ≥ 0.5)"
                for label in ROUTERS if label in rps]
    p99 = {(rate, t.label): r for rate, t, r, _ in run.open}
    for rate in sorted({rate for rate, _ in p99}):
        redis = p99.get((rate, REDIS))
        for label in ROUTERS:
            r = p99.get((rate, label))
            if r is None or redis is None:
                continue
            out.append(f"- {rate:,}/s, {label}: p99 {r['p99_ms']:.2f} ms = "
                       f"**{r['p99_ms'] / redis['p99_ms']:.2f}x Redis's** (goal ≤ 1.5), errors "
                       f"{r['errors'] + r['missing']:.0f} (goal 0)")
    if run.quiet:
        ev = sum(w["ev_s"] for w in run.quiet) / len(run.quiet)
        commits = sum(w["commit_ms"] * w["commits"] for w in run.quiet)
        commit = commits / max(1.0, sum(w["commits"] for w in run.quiet))
        for rate, t, _, w in run.open:
            if t.label in ROUTERS and rate == max(r for r, *_ in run.open):
                out.append(f"- {rate:,} GET/s through {t.label}: tweets ingest "
                           f"**{w['ev_s'] / ev:.2f}x** of quiet ({w['ev_s']:,.0f} vs {ev:,.0f} "
                           f"ev/s), commit time **{commit / w['commit_ms']:.2f}x** (quiet mean "
                           f"{commit:.0f} ms / {w['commit_ms']:.0f} ms; goal ≥ 0.9 both)")
    return out


def plot(run: Run, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(dict.fromkeys(t.label for _, t, _, _ in run.open))
    styles = {NATIVE: "-", PYTHON: "-.", RAW: ":", REDIS: "--"}
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for label in labels:
        pts = sorted((rate, r) for rate, t, r, _ in run.open if t.label == label)
        rates = [p[0] for p in pts]
        for q, marker in (("p50_ms", "o"), ("p99_ms", "s")):
            ax.plot(rates, [max(p[1][q], 0.01) for p in pts], styles.get(label, "-"),
                    marker=marker, label=f"{label} {q[:-3]}")
    rates = sorted({rate for rate, *_ in run.open})
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(rates, [f"{r / 1000:g}K" for r in rates])
    ax.minorticks_off()
    ax.set_xlabel("offered GET/s (constant arrival rate), under make run's ingest")
    ax.set_ylabel("latency from due time, ms")
    ax.axhline(5, color="grey", linewidth=0.8)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title("point GET latency vs offered rate, 2 cores shared with the demo")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="1000,2000,5000",
                    help="offered GET/s of the open loop, comma-separated (default: "
                    "%(default)s)")
    ap.add_argument("--duration", type=int, default=60,
                    help="seconds per rate and target, and of each quiet window (default: "
                    "%(default)s)")
    ap.add_argument("--closed-duration", type=int, default=20,
                    help="seconds of each closed-loop run; 0: none (default: %(default)s)")
    ap.add_argument("--keys", type=int, default=2000,
                    help="tweet keys picked (that answer) and read at random (default: "
                    "%(default)s)")
    ap.add_argument("--no-python", action="store_true",
                    help="no Python-front router (no before figures)")
    ap.add_argument("--no-raw", action="store_true", help="no raw ASGI server in the open loop")
    ap.add_argument("--unfollowed", action="store_true",
                    help="two more routers, native front, alike but for the read engine's "
                    "follower: without it (QSTATE_ROUTER_FOLLOW_MS=0: the first read after a "
                    "commit catches its partition up), then with it (the default)")
    ap.add_argument("--warmup", type=int, default=60,
                    help="seconds of ingest after every operator's first commit, before "
                    "anything is measured (the start-up backlog's batches) (default: "
                    "%(default)s)")
    ap.add_argument("--settle", type=float, default=5.0,
                    help="seconds between two runs, for what one left queued (default: "
                    "%(default)s)")
    ap.add_argument("--server-cpus", default="1",
                    help="taskset CPU list of the routers, the raw server and Redis; empty: "
                    "any (default: %(default)s)")
    ap.add_argument("--client-cpus", default="0",
                    help="taskset CPU list of every load generator (qstate-openloop, wrk, "
                    "redis-benchmark); empty: any (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=ROOT / "loadtest" / "results" / "router.md",
                    help="Markdown file the section is appended to; the plot goes beside it "
                    "(default: %(default)s)")
    return ap.parse_args()


def start_router(demo: DemoRun, cpus: str, name: str, **settings: str) -> RouterProcess:
    """One more router on the demo's storage and shards (its host token, in the demo's
    home), with ``settings`` (QSTATE_ names)."""
    home = demo.home / "home"
    env = {**os.environ, "QSTATE_HOME": str(home), **settings}
    r = RouterProcess.make(str(home / "storage"), demo.home / "logs", name, env)
    r.args = pinned(r.args, cpus)
    return r.start_and_wait()


def wait_answers(url: str, key: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + STATE + key, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} does not answer {key}")


def main() -> None:
    args = parse_args()
    rates = [int(r) for r in args.rates.split(",") if r]
    binary = openloop_binary()
    for tool in ("redis-server", "redis-benchmark", "wrk", "taskset"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is missing: `make bench-setup`")
    tmp = Path(tempfile.mkdtemp(prefix="qstate-openloop-"))
    demo = DemoRun(tmp / "demo").start()
    soak = Soak(demo)
    redis_proc, raw = None, None
    routers: list[RouterProcess] = []
    bench = None
    try:
        say(f"qstate run starting in {tmp} ...")
        try:
            ready = soak.wait_ready()
        except (RuntimeError, TimeoutError) as exc:
            print(exc, file=sys.stderr)
            raise SystemExit(1) from None
        router_pid = next(pid for pid, role in demo.see().items() if role == "router")
        pin(router_pid, args.server_cpus)
        say(f"ready in {ready:.0f}s; picking {args.keys} keys that answer")
        answers = pick_keys(demo.url, args.keys)
        keys = tmp / "keys.txt"
        keys.write_text("\n".join(answers) + "\n")
        redis_proc, port = start_redis(tmp)
        pin(redis_proc.pid, args.server_cpus)
        load_redis(port, answers)
        targets = [Target(NATIVE, demo.url + STATE, keys, router_pid)]
        more = []
        if not args.no_python:
            more.append((PYTHON, "router-python", {"QSTATE_NATIVE_FRONT": "false"}))
        if args.unfollowed:
            more += [(UNFOLLOWED, "router-unfollowed", {"QSTATE_ROUTER_FOLLOW_MS": "0"}),
                     (FOLLOWED, "router-followed", {"QSTATE_ROUTER_FOLLOW_MS": "20"})]
        for label, name, settings in more:
            r = start_router(demo, args.server_cpus, name, **settings)
            routers.append(r)
            wait_answers(r.url, next(iter(answers)))
            targets.append(Target(label, r.url + STATE, keys, r.pid))
        open_targets = list(targets)
        if not args.no_raw:
            raw, raw_base = start_raw(tmp, args.keys, args.server_cpus)
            raw_keys = tmp / "raw-keys.txt"
            raw_keys.write_text("".join(f"page-{i}\n" for i in range(args.keys)))
            open_targets.append(Target(RAW, raw_base + RAW_STATE, raw_keys, raw.pid))
        redis = Target(REDIS, keys=keys, pid=redis_proc.pid, redis_port=port)
        open_targets.append(redis)
        bench = Bench(args, tmp, demo.job_metrics, binary)
        say(f"warm-up {args.warmup}s")
        time.sleep(args.warmup)
        say(f"quiet {args.duration}s")
        bench.quiet()
        if args.closed_duration:
            for t in [*targets, redis]:
                bench.closed(t)
        for rate in rates:
            for t in open_targets:
                bench.open(rate, t)
        say(f"quiet {args.duration}s")
        bench.quiet()
    finally:
        soak.close()
        for r in routers:
            r.stop()
        demo.ctrl_c()
        if raw is not None:
            raw.stop()
        if redis_proc is not None:
            redis_proc.terminate()
            redis_proc.wait(10)
    write(args, bench.run if bench else Run())


def write(args: argparse.Namespace, run: Run) -> None:
    png = args.out.with_name("router_latency.png")
    if len({rate for rate, *_ in run.open}) > 1:
        plot(run, png)
    pinning = (f"routers, raw server and Redis on CPU {args.server_cpus}, load generators on "
               f"CPU {args.client_cpus}, the demo's other processes on any"
               if args.server_cpus or args.client_cpus else "nothing pinned")
    lines = [f"\n## point GET under `make run`'s ingest: native front vs Python front vs "
             f"Redis, {args.keys:,} random tweet keys\n",
             f"`{results.command('loadtest.bench_openloop')}` ({time.strftime('%Y-%m-%d %H:%M')}"
             ", 2 cores shared with the demo: broker, 2 shards, 2 routers, 2 jobs, 2 "
             f"generators at 5K + 1K ev/s; taskset: {pinning})\n", *tables(args, run)]
    if len({rate for rate, *_ in run.open}) > 1:
        lines.append(f"\n![latency vs offered rate]({png.name})\n")
    results.append(args.out, "\n".join(lines))


if __name__ == "__main__":
    main()
