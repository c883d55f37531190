"""Watch delivery at a thousand watchers while `make run`'s jobs ingest.

    python -m loadtest.bench_watch --watchers 1000 --keys 10 --duration 60

Starts ``qstate run`` as ``make run`` does (broker, generators at 5K + 1K events/s, both
example jobs, two shard servers, a router) in a fresh home, unless ``--url`` names a running
router, and waits for the tweets job's batches. Then:

1. **baseline**: the router's CPU (``process_cpu_seconds_total``) over ``--baseline`` seconds
   with no watcher;
2. opens ``--watchers`` Server-Sent Events watches on that router, each of ``--keys`` keys
   drawn from the current hour's top 1,000 of ``tweets/per_tweet_1h/impressions`` (keys that
   change in most batches, as the ones a dashboard shows), and reads them all for
   ``--duration`` seconds: each event's delay is the time it was received minus its
   ``committed_at`` (when the shard applied the batch; same host, same clock), as well as
   what the router itself measured up to handing the event to its socket
   (``qstate_router_watch_delay_seconds``), events, coalesced events and reconnections;
3. the router's CPU over the same time.

The watchers run in this process's event loop (uvloop when installed), at the niceness it
runs with: their reading takes CPU from the same two cores, so the received delay includes
it; the router's own figure does not. Appends to ``loadtest/results/watch.md``.

Exit codes: 0 measured; 1 the demo did not come up, or no event arrived.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from httpx_sse import aconnect_sse
from prometheus_client.parser import text_string_to_metric_families

from loadtest import results
from qstate.embedded.lifeline import die_with_parent

__all__ = ["main"]

RESULTS = Path("loadtest/results/watch.md")
JOB, OP, STATE = "tweets", "per_tweet_1h", "impressions"


def _scrape(url: str) -> dict[str, Any]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    out: dict[str, Any] = {"cpu": 0.0, "buckets": {}}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "process_cpu_seconds_total":
                out["cpu"] = s.value
            elif s.name == "qstate_router_watch_delay_seconds_bucket" and \
                    s.labels.get("form") == "keys":
                le = float(s.labels["le"])
                out["buckets"][le] = out["buckets"].get(le, 0.0) + s.value
    return out


def _histogram_quantile(before: dict[float, float], after: dict[float, float],
                        q: float) -> float:
    """Quantile ``q`` of what was observed between, interpolated in its bucket (as
    Prometheus' histogram_quantile does)."""
    les = sorted(after)
    counts = [after[le] - before.get(le, 0.0) for le in les]
    total = counts[-1] if counts else 0
    if not total:
        return float("nan")
    lo, below = 0.0, 0.0
    for le, c in zip(les, counts, strict=True):
        if c >= q * total:
            if le == float("inf"):
                return lo
            return lo + (le - lo) * (q * total - below) / max(c - below, 1e-9)
        lo, below = le, c
    return float("inf")


@dataclass(frozen=True, slots=True)
class _Event:  # what a WatchEvent says that is measured here
    batch: int
    snapshot: bool
    coalesced: bool
    committed_at: int | None


@dataclass
class Tally:
    delays_ms: list[float] = field(default_factory=list)
    events: int = 0
    seconds: float = 0.0  # measured, from every watch open
    before: dict[str, Any] = field(default_factory=dict)  # the router's metrics then
    after: dict[str, Any] = field(default_factory=dict)
    snapshots: int = 0
    coalesced: int = 0
    reconnects: int = 0
    errors: list[str] = field(default_factory=list)


async def _watcher(client: httpx.AsyncClient, keys: list[str], tally: Tally, until: float,
                   opened: asyncio.Event | None) -> None:
    last: int | None = None
    while time.monotonic() < until:
        params = [("key", k) for k in keys]
        if last is not None:
            params.append(("from_batch", str(last)))
        try:
            async with aconnect_sse(client, "GET", f"/v1/watch/{JOB}/{OP}/{STATE}",
                                    params=params) as es:
                if es.response.status_code != 200:
                    await es.response.aread()
                    tally.errors.append(f"{es.response.status_code} {es.response.text[:100]}")
                    await asyncio.sleep(1)
                    continue
                async for sse in es.aiter_sse():
                    if not sse.data:  # a ping (qstate.client._watch_event)
                        continue
                    now_ms = time.time() * 1000
                    # the fields measured, without a model: this process reads a thousand
                    # streams on the cores the router runs on (the shape is tested elsewhere)
                    ev = _Event(**{k: v for k, v in orjson.loads(sse.data).items()
                                   if k in _Event.__dataclass_fields__})
                    last = ev.batch
                    if opened is not None:
                        opened.set()
                        opened = None
                    tally.events += 1
                    tally.snapshots += ev.snapshot
                    tally.coalesced += ev.coalesced
                    if ev.committed_at is not None and not ev.snapshot:
                        tally.delays_ms.append(now_ms - ev.committed_at)
                    if time.monotonic() >= until:
                        return
        except (httpx.HTTPError, ValueError) as exc:
            tally.reconnects += 1
            if len(tally.errors) < 20:
                tally.errors.append(f"{type(exc).__name__}: {exc}"[:200])
            await asyncio.sleep(0.5)


async def _watch_all(url: str, key_sets: list[list[str]], duration: float) -> Tally:
    tally = Tally()
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx.Timeout(30, read=60)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as client:
        until = time.monotonic() + 10 ** 9  # set once every watch is open
        opened = [asyncio.Event() for _ in key_sets]
        deadline = [until]

        async def one(i: int) -> None:
            await _watcher(client, key_sets[i], tally, deadline[0], opened[i])

        # a few at a time: a thousand connects at once would be a thundering herd
        tasks = []
        for i in range(len(key_sets)):
            tasks.append(asyncio.create_task(one(i)))
            if i % 50 == 49:
                await asyncio.sleep(0.05)
        await asyncio.wait_for(asyncio.gather(*(o.wait() for o in opened)), 120)
        # measuring starts now: what came before was the opening
        tally.before = await asyncio.to_thread(_scrape, url)
        tally.delays_ms.clear()
        tally.events = tally.snapshots = tally.coalesced = 0
        t0 = time.monotonic()
        await asyncio.sleep(duration)
        tally.after = await asyncio.to_thread(_scrape, url)
        tally.seconds = time.monotonic() - t0
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return tally


@contextmanager
def _demo(home: Path) -> Any:
    """``qstate run`` in ``home``, stopped with Ctrl-C's signal at the end (and with this
    process if it dies)."""
    env = {**os.environ, "QSTATE_HOME": str(home)}
    log = open(home / "run.log", "wb")  # noqa: SIM115  # closed below
    proc = subprocess.Popen([sys.executable, "-m", "qstate", "run"], env=env, stdout=log,
                            stderr=subprocess.STDOUT, preexec_fn=die_with_parent(),
                            start_new_session=True)
    try:
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def _wait_for_batches(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ops = httpx.get(f"{url}/v1/jobs/{JOB}", timeout=5).json()["operators"]
            if min(o["last_batch"] for o in ops) >= 3:
                return
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        print("waiting for the tweets job's batches ...", flush=True)
        time.sleep(5)
    raise SystemExit(1)


def bench(args: argparse.Namespace, url: str) -> str:
    _wait_for_batches(url, 300)
    board = httpx.get(f"{url}/v1/top/{JOB}/{OP}/{STATE}", params={"n": 1000},
                      timeout=30).json()["entries"]
    hot = [e["key"] for e in board]
    rng = random.Random(args.seed)
    key_sets = [rng.sample(hot, min(args.keys, len(hot))) for _ in range(args.watchers)]
    print(f"{len(hot)} hot keys; baseline {args.baseline:g} s with no watcher", flush=True)
    a = _scrape(url)
    time.sleep(args.baseline)
    b = _scrape(url)
    idle_cpu = (b["cpu"] - a["cpu"]) / args.baseline
    print(f"opening {args.watchers} watches of {args.keys} keys", flush=True)
    try:
        import uvloop
        runner: Any = uvloop.run
    except ImportError:
        runner = asyncio.run
    tally: Tally = runner(_watch_all(url, key_sets, args.duration))
    before, after, took = tally.before, tally.after, tally.seconds
    watch_cpu = (after["cpu"] - before["cpu"]) / took
    d = tally.delays_ms
    eps = tally.events / took
    server = [_histogram_quantile(before["buckets"], after["buckets"], q) for q in (0.5, 0.99)]
    print(f"events {tally.events} ({eps:.0f}/s), delay p50 {results.quantile(d, .5):.0f} ms "
          f"p99 {results.quantile(d, .99):.0f} ms, router CPU {idle_cpu:.2f} -> "
          f"{watch_cpu:.2f} cores",
          flush=True)
    if not d:
        print("no change event arrived", tally.errors[:5], flush=True)
        raise SystemExit(1)
    return "\n".join([
        f"\n## {time.strftime('%Y-%m-%d %H:%M')} · {args.watchers} watchers × {args.keys} "
        f"keys, {len({k for ks in key_sets for k in ks})} distinct, during `make run`",
        "",
        f"Command: `{results.command('loadtest.bench_watch')}`",
        "",
        "| figure | value |",
        "| --- | --- |",
        f"| events received | {tally.events:,} ({eps:.0f}/s), {tally.snapshots} snapshots, "
        f"{tally.coalesced} coalesced |",
        f"| delay commit → received, p50 / p90 / p99 / max | {results.quantile(d, .5):.0f} / "
        f"{results.quantile(d, .9):.0f} / {results.quantile(d, .99):.0f} / {max(d):.0f} ms |",
        f"| delay commit → event taken for sending (router's histogram, interpolated) p50 / "
        f"p99 | {server[0] * 1000:.0f} / {server[1] * 1000:.0f} ms |",
        f"| router CPU, no watcher → {args.watchers} watchers (cores, whole process) | "
        f"{idle_cpu:.2f} → {watch_cpu:.2f} |",
        f"| reconnections, errors | {tally.reconnects}, {len(tally.errors)} "
        f"{tally.errors[:3] if tally.errors else ''} |",
        ""])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--watchers", type=int, default=1000, help="SSE watches to open")
    p.add_argument("--keys", type=int, default=10, help="keys per watch")
    p.add_argument("--duration", type=float, default=60, help="seconds measured")
    p.add_argument("--baseline", type=float, default=20,
                   help="seconds of the router's CPU with no watcher, first")
    p.add_argument("--seed", type=int, default=1, help="which hot keys each watch takes")
    p.add_argument("--url", default="", help="a running router (default: start `qstate run`)")
    p.add_argument("--out", type=Path, default=RESULTS, help="results file (appended)")
    args = p.parse_args()
    if args.url:
        text = bench(args, args.url)
    else:
        with tempfile.TemporaryDirectory(prefix="qstate-bench-watch-") as home, \
                _demo(Path(home)):
            text = bench(args, "http://127.0.0.1:8000")
    results.append(args.out, text)
    print(text)


if __name__ == "__main__":
    main()
