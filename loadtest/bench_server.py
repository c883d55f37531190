"""The HTTP server under the router: uvicorn (httptools, uvloop; the default) against
granian (Rust, embedded in the same asyncio loop), for the raw ASGI dict server and for the
router, in one run (issue: a server replaces uvicorn only if it is >= 1.5x on this bench).

    python -m loadtest.bench_server --keys 100000 --duration 10

The shards, keys and wrk load of ``loadtest.bench_router`` (GETs of random keys, -c32, the
router reading co-located shards in-process), each server measured ``--rounds`` times in
turn; appends a section to ``--out``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from loadtest import results
from loadtest.bench_router import load, start_raw, wrk
from qstate.core.records.storage import Storage
from qstate.embedded.ports import free_port, wait_for_port
from qstate.embedded.procs import Child, RouterProcess, ShardProcess


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("loadtest/results/router.md"))
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="qstate-server-bench-"))
    storage = Storage(str(tmp / "storage"))
    children: list[Child] = []
    got: dict[str, list[dict[str, float]]] = {}
    try:
        shards = [ShardProcess.make(f"b{i}", tmp / "shards", storage.uri, tmp / "logs")
                  .start_and_wait() for i in range(2)]
        children += shards
        load(storage, shards, args.keys)
        raw, raw_url = start_raw(tmp / "logs", args.keys)
        port = free_port()
        graw = Child("raw-granian", [sys.executable, "-m", "loadtest.raw_granian", str(port)],
                     tmp / "logs" / "raw-granian.log",
                     env={**os.environ, "RAW_KEYS": str(args.keys)}).start()
        children += [raw, graw]
        wait_for_port("127.0.0.1", port, 30, graw.proc)
        router = RouterProcess.make(storage.uri, tmp / "logs").start_and_wait()
        grouter = RouterProcess.make(storage.uri, tmp / "logs", "router-granian")
        grouter.args = [sys.executable, "-m", "loadtest.granian_router",
                        *grouter.args[grouter.args.index("router") + 1:]]
        grouter.start_and_wait()
        children += [router, grouter]
        servers = {"raw ASGI dict, uvicorn": raw_url,
                   "raw ASGI dict, granian": f"http://127.0.0.1:{port}",
                   "qstate router, uvicorn": router.url,
                   "qstate router, granian": grouter.url}
        for url in servers.values():
            wrk(url, args.keys, 2, tmp)  # warm-up
        for _ in range(args.rounds):
            for name, url in servers.items():
                got.setdefault(name, []).append(wrk(url, args.keys, args.duration, tmp))
    finally:
        for c in reversed(children):
            c.stop()

    def rps(name: str) -> float:
        return statistics.median(r["rps"] for r in got[name])

    def ratio(a: str, b: str) -> str:
        return f"{rps(a) / rps(b):.2f}"

    rows = [f"| {name} | " + " / ".join(f"{r['rps']:,.0f}" for r in runs) +
            f" | {statistics.median(r['p99'] for r in runs):.2f} |"
            for name, runs in got.items()]
    text = "\n".join([
        f"\n## HTTP server under the router: uvicorn vs granian, {args.keys:,} keys, "
        f"wrk -t1 -c32 -d{args.duration}s\n",
        f"`{results.command('loadtest.bench_server')}` ({time.strftime('%Y-%m-%d %H:%M')}, "
        "2 cores shared by everything; the rounds in turn)\n",
        "| server | GET req/s, each round | p99 ms (median) |", "|---|---|---|", *rows,
        f"\ngranian / uvicorn: raw {ratio('raw ASGI dict, granian', 'raw ASGI dict, uvicorn')}x, "
        f"router {ratio('qstate router, granian', 'qstate router, uvicorn')}x. Router / raw "
        f"on the same server: uvicorn {ratio('qstate router, uvicorn', 'raw ASGI dict, uvicorn')}"
        f", granian {ratio('qstate router, granian', 'raw ASGI dict, granian')}.\n"])
    results.append(args.out, text)


if __name__ == "__main__":
    main()
