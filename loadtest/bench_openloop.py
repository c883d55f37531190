"""Point reads at a constant arrival rate under ``make run``'s ingest, qstate beside Redis.

    python -m loadtest.bench_openloop                      # 1K, 2K, 5K, 10K req/s, 60 s each
    python -m loadtest.bench_openloop --rates 2000 --duration 60

``python -m qstate run`` (what ``make run`` starts: broker, two shards, the router, the tweets
and ads jobs and their generators at 5K + 1K ev/s) runs in a fresh home. Once every operator
has committed, ``KEYS`` tweet keys that answer are picked at random, and a ``redis-server``
gets each one's answer (the same JSON bytes the router sends) under ``tw:<key>``; the raw
ASGI server of ``bench_router`` (uvicorn answering from a dict: a Python server with no
work) holds as many keys. Then for each rate the router, the raw server and Redis in turn
take the same schedule of GETs over their keys
from ``qstate-openloop`` (loadtest/openloop, built by ``make bench-setup``): request i is due
at i/rate whether or not earlier ones were answered, and its latency counts from when it was
due, so queueing delay counts (wrk, a closed loop, hides it). Both run while the demo
ingests. Results: a table in loadtest/results/router.md and router_latency.png beside it.

Exit codes: 0 measured; 1 the demo did not become ready; 2 a tool is missing.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx

from loadtest import results
from loadtest.bench_ingest import start_redis
from loadtest.bench_router import start_raw
from loadtest.openloop_tool import openloop_binary, run_openloop
from loadtest.soak import TWEET_KEYS, DemoRun, Soak

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[1]
STATE = "/v1/state/tweets/per_tweet_1h/impressions/"
KEYS = 2000
PREFIX = "tw:"


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
    import redis

    r = redis.Redis(port=port)
    r.mset({PREFIX + k: v for k, v in answers.items()})
    r.close()


def row(name: str, r: dict[str, float]) -> str:
    bad = r["errors"] + r["missing"]
    return (f"| {name} | {r['offered_rate']:,.0f} | {r['achieved_rate']:,.0f} | "
            f"{r['p50_ms']:.2f} | {r['p90_ms']:.2f} | {r['p99_ms']:.2f} | "
            f"{r['p999_ms']:.2f} | {r['max_ms']:.1f} | {bad:.0f} |")


Run = tuple[int, dict[str, float], dict[str, float], dict[str, float]]  # rate, qstate, raw, Redis


def plot(runs: list[Run], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = [run[0] for run in runs]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, i, style in (("qstate router", 1, "-"), ("raw ASGI", 2, ":"),
                            ("Redis GET", 3, "--")):
        for q, marker in (("p50_ms", "o"), ("p99_ms", "s"), ("p999_ms", "^")):
            ax.plot(rates, [r[i][q] for r in runs], style, marker=marker,  # type: ignore[index]
                    label=f"{label} {q[:-3]}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(rates, [f"{r // 1000}K" for r in rates])
    ax.set_xlabel("offered GET/s (constant arrival rate), under make run's ingest")
    ax.set_ylabel("latency from due time, ms")
    ax.axhline(5, color="grey", linewidth=0.8)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title("point GET latency vs offered rate, 2 cores shared with the demo")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rates", default="1000,2000,5000,10000",
                    help="offered GET/s, comma-separated (default: %(default)s)")
    ap.add_argument("--duration", type=int, default=60, help="seconds per rate and target "
                    "(default: %(default)s)")
    ap.add_argument("--out", type=Path, default=ROOT / "loadtest" / "results" / "router.md")
    args = ap.parse_args()
    rates = [int(r) for r in args.rates.split(",")]
    binary = openloop_binary()
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server is missing: `make bench-setup`")
    tmp = Path(tempfile.mkdtemp(prefix="qstate-openloop-"))
    demo = DemoRun(tmp / "demo").start()
    soak = Soak(demo)
    redis_proc, raw = None, None
    runs: list[Run] = []
    try:
        print(f"qstate run starting in {tmp} ...", file=sys.stderr, flush=True)
        try:
            ready = soak.wait_ready()
        except (RuntimeError, TimeoutError) as exc:
            print(exc, file=sys.stderr)
            raise SystemExit(1) from None
        print(f"ready in {ready:.0f}s; picking {KEYS} keys that answer", file=sys.stderr)
        answers = pick_keys(demo.url, KEYS)
        keys = tmp / "keys.txt"
        keys.write_text("\n".join(answers) + "\n")
        redis_proc, port = start_redis(tmp)
        load_redis(port, answers)
        raw, raw_base = start_raw(tmp, KEYS)
        raw_url = raw_base + "/v1/state/shop/views_1m/views/"
        raw_keys = tmp / "raw-keys.txt"
        raw_keys.write_text("".join(f"page-{i}\n" for i in range(KEYS)))
        for rate in rates:
            print(f"{rate}/s for {args.duration}s: router, raw ASGI, Redis", file=sys.stderr,
                  flush=True)
            q = run_openloop(binary, ["-http", demo.url + STATE], keys, rate, args.duration)
            a = run_openloop(binary, ["-http", raw_url], raw_keys, rate, args.duration)
            r = run_openloop(binary, ["-redis", f"127.0.0.1:{port}", "-prefix", PREFIX], keys,
                             rate, args.duration)
            runs.append((rate, q, a, r))
            print(f"  p99: router {q['p99_ms']:.2f} ms, raw ASGI {a['p99_ms']:.2f} ms, Redis "
                  f"{r['p99_ms']:.2f} ms", file=sys.stderr, flush=True)
    finally:
        soak.close()
        demo.ctrl_c()
        if raw is not None:
            raw.stop()
        if redis_proc is not None:
            redis_proc.terminate()
            redis_proc.wait(10)
    png = args.out.with_name("router_latency.png")
    if len(runs) > 1:
        plot(runs, png)
    lines = [f"\n## point GET at a constant arrival rate under `make run`'s ingest, "
             f"{args.duration} s a rate, {KEYS:,} random tweet keys\n",
             f"`{results.command('loadtest.bench_openloop')}` ({time.strftime('%Y-%m-%d %H:%M')}"
             ", 2 cores shared with the demo: broker, 2 shards, router, 2 jobs, 2 generators "
             "at 5K + 1K ev/s; qstate-openloop, latency from due time)\n",
             "| target | offered/s | achieved/s | p50 ms | p90 ms | p99 ms | p999 ms | max ms "
             "| errors |", "|---|---|---|---|---|---|---|---|---|"]
    for _, q, a, r in runs:
        lines += [row("qstate router (HTTP GET)", q),
                  row("raw ASGI server (uvicorn, a dict; no work)", a),
                  row("Redis GET, same keys and bytes", r)]
    if len(runs) > 1:
        lines.append(f"\n![latency vs offered rate]({png.name})\n")
    results.append(args.out, "\n".join(lines))


if __name__ == "__main__":
    main()
