"""Router reads, native front vs Python front vs Redis vs a raw-ASGI dict server, one run.

Issue 45; docs/architecture.md §5 and §8.

    python -m loadtest.bench_router --keys 100000 --duration 10 --rounds 2

Stands up checkpoint storage with one operator of ``--keys`` keys (one window each, written
as delta files and committed through the coordinator) and two shard servers; then, for each
of ``--fronts``, a router reading the co-located partitions in-process ("local") and one
reading them from the shards over gRPC (``--no-local-reads``, "the hop"). ``native`` is the
read engine's front (Rust: the point GET and ``:batchGet`` answered without Python, gRPC
``Get``/``MultiGet`` with the engine's bytes); ``python`` is the same router with
``QSTATE_NATIVE_FRONT=false`` (uvicorn, the raw-ASGI fast path and FastAPI, gRPC encoded in
Python): the "before" of every figure. Beside them ``loadtest.raw_asgi`` (uvicorn answering
from a dict: Python with no work) and a ``redis-server`` holding, under the names
redis-benchmark's ``-r`` makes (``page-<12 digits>``), the router's own answer bytes for every
key (fetched from the first front's router; the other routers' bytes are compared with them).

Point GETs of random keys: ``wrk -t1 -c32`` against each HTTP server (the requests built up
front and cycled, so wrk's Lua costs little per request) and ``redis-benchmark -c 32 GET``
against Redis, ``--rounds`` times, the order reversed each round. Batches, for each of
``--batches`` keys a call: gRPC ``MultiGet`` (8 calls in flight from a client process, the
request bytes built up front, the answers counted, not decoded), HTTP ``:batchGet``
(``wrk -c8``, 16 bodies built up front and cycled) and redis-benchmark's ``MGET`` (``-c 8``).

Every load generator runs on ``--client-cpus`` and every server (shards, routers, the raw
server, Redis) on ``--server-cpus`` (taskset). A server's CPU time over a run (utime + stime of
its process, every thread) over the requests it answered is its CPU µs a request; the
shards' is given beside it (the hop's other half). With ``--pipeline`` the tweets job and a
5K ev/s generator run beside it the whole time, on every core. Appends a section to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import http.client
import io
import math
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from urllib.parse import urlsplit

import grpc
import pyarrow as pa

from loadtest import results
from loadtest.bench_ingest import start_redis
from loadtest.cpu import cpu_seconds, pin, pin_self, pinned
from qstate.control.coordinator import Coordinator
from qstate.core.address import PartitionId, partition_of
from qstate.core.records import delta as deltas
from qstate.core.records.operator import OperatorSpec, WindowSpec, save_spec
from qstate.core.records.storage import Storage
from qstate.embedded.kafka import KafkaBroker
from qstate.embedded.ports import free_port, wait_for_port
from qstate.embedded.procs import Child, RouterProcess, ShardProcess, qstate_command
from qstate.jobs.runtime.commit import Committer
from qstate.proto import qstate_pb2 as qpb

__all__ = ["batch_script", "file_pick", "get_script", "load", "page_pick", "redis_benchmark",
           "redis_requests", "run_wrk", "start_raw", "wrk"]

P = 16
SPEC = OperatorSpec("shop", "views_1m", "page", {"views": "long"}, partitions=P,
                    window=WindowSpec("tumbling", 60_000))
STATE_PATH = "/v1/state/shop/views_1m/views/"
BATCH_PATH = "/v1/state/shop/views_1m/views:batchGet"
MULTIGET = "/qstate.v1.QueryableState/MultiGet"
# QSTATE_NATIVE_FRONT of each front; python: the router before the engine's front
FRONTS = {"native": "true", "python": "false"}
FRONT_NAMES = {"native": "native front", "python": "Python front"}
# GET/s over the hop in issue 45's bench (2026-11-27 03:33): the goal is 3x
HOP_BEFORE = 7_036
Result = dict[str, float]

# wrk: requests built once per thread and cycled (a Lua call per request would take a share
# of the load generator's core, a 1,000-key body most of it)
WRK_LUA = """
local reqs, i = {}, 0
init = function(args)
  math.randomseed({seed})
  {pick}
  for n = 1, {count} do
    {build}
  end
end
request = function()
  i = i % #reqs + 1
  return reqs[i]
end
"""
GET_BUILD = 'reqs[n] = wrk.format("GET", "{prefix}" .. pick())'
BATCH_BUILD = """local keys = {}
    for k = 1, {batch} do keys[k] = '"' .. pick() .. '"' end
    reqs[n] = wrk.format("POST", "{path}", {["Content-Type"] = "application/json"},
                         '{"keys": [' .. table.concat(keys, ",") .. ']}')"""


def page_pick(keys: int) -> str:
    """Lua: ``pick()`` gives a random ``page-<i>`` of the ``keys`` loaded."""
    return f'local pick = function() return "page-" .. math.random(0, {keys - 1}) end'


def file_pick(path: Path) -> str:
    """Lua: ``pick()`` gives a random line of ``path``."""
    return ('local keys = {}\n  for line in io.lines("' + str(path) + '") do '
            'keys[#keys + 1] = line end\n'
            '  local pick = function() return keys[math.random(1, #keys)] end')


def get_script(prefix: str, pick: str, count: int = 20_000) -> str:
    """GETs of ``prefix`` + a picked key: ``count`` requests built, then cycled."""
    return (WRK_LUA.replace("{seed}", "42").replace("{pick}", pick)
            .replace("{count}", str(count)).replace("{build}", GET_BUILD)
            .replace("{prefix}", prefix))


def batch_script(path: str, pick: str, batch: int, count: int = 16) -> str:
    """:batchGet of ``batch`` picked keys a request: ``count`` bodies built, then cycled."""
    return (WRK_LUA.replace("{seed}", "43").replace("{pick}", pick)
            .replace("{count}", str(count)).replace("{build}", BATCH_BUILD)
            .replace("{batch}", str(batch)).replace("{path}", path))


def run_wrk(url: str, lua: str, duration: int, tmp: Path, connections: int = 32,
            cpus: str = "") -> Result:
    """``wrk -t1`` with ``lua`` against ``url``, on ``cpus``: requests/s, p50/p99 ms, answers
    that were not 2xx, socket errors, requests."""
    script = tmp / f"wrk-{time.monotonic_ns()}.lua"
    script.write_text(lua)
    out = subprocess.run(pinned(["wrk", "-t1", f"-c{connections}", f"-d{duration}s",
                                 "--latency", "-s", str(script), url], cpus),
                         capture_output=True, text=True, check=True).stdout

    def ms(label: str) -> float:
        m = re.search(rf"{label}\s+([\d.]+)(us|ms|s)\b", out)
        assert m, out
        return float(m.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]

    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    done = re.search(r"(\d+) requests in", out)
    assert rps and done, out
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)",
                       out)
    return {"rps": float(rps.group(1)), "p50": ms("50%"), "p99": ms("99%"),
            "non2xx": float(non2xx.group(1)) if non2xx else 0.0,
            "errors": float(sum(map(int, socket.groups()))) if socket else 0.0,
            "requests": float(done.group(1))}


def wrk(url: str, keys: int, duration: int, tmp: Path, batch: int = 0,
        connections: int = 32, cpus: str = "") -> Result:
    """GETs of random ``page-<i>`` keys, or ``batch`` > 0: :batchGet of that many a request."""
    pick = page_pick(keys)
    lua = batch_script(BATCH_PATH, pick, batch) if batch else get_script(STATE_PATH, pick)
    return run_wrk(url, lua, duration, tmp, connections, cpus)


def _redis_csv(port: int, command: list[str], keys: int, clients: int, n: int, cpus: str
               ) -> dict[str, str]:
    out = subprocess.run(pinned(["redis-benchmark", "-p", str(port), "-c", str(clients), "-n",
                                 str(n), "-r", str(keys), "--csv", *command], cpus),
                         capture_output=True, text=True, check=True).stdout
    return list(csv.DictReader(io.StringIO(out)))[-1]


def redis_requests(port: int, command: list[str], keys: int, clients: int, duration: float,
                   cpus: str = "") -> int:
    """How many requests make about ``duration`` seconds of ``command`` (redis-benchmark
    runs a count, not a time): from a short first run's rate."""
    rate = float(_redis_csv(port, command, keys, clients, 20_000, cpus)["rps"])
    return max(20_000, int(rate * duration))


def redis_benchmark(port: int, command: list[str], keys: int, clients: int, n: int,
                    cpus: str = "") -> Result:
    """``redis-benchmark -c clients -n n -r keys command`` on ``cpus``: requests/s, p50/p99."""
    row = _redis_csv(port, command, keys, clients, n, cpus)
    return {"rps": float(row["rps"]), "p50": float(row["p50_latency_ms"]),
            "p99": float(row["p99_latency_ms"]), "non2xx": 0.0, "errors": 0.0,
            "requests": float(n)}


def measure(run: Callable[[], Result], pids: tuple[int, ...], shards: tuple[int, ...]
            ) -> Result:
    """``run``, and the CPU seconds the servers ``pids`` and the shards spent meanwhile."""
    c0, s0, t0 = cpu_seconds(*pids), cpu_seconds(*shards), time.perf_counter()
    r = run()
    r["wall_s"] = time.perf_counter() - t0
    r["cpu_s"] = cpu_seconds(*pids) - c0
    r["shard_cpu_s"] = cpu_seconds(*shards) - s0
    return r


async def _multiget(address: str, requests: list[bytes], batch: int, duration: float,
                    in_flight: int = 8) -> Result:
    opts = [("grpc.max_receive_message_length", 64 << 20)]
    async with grpc.aio.insecure_channel(address, options=opts) as ch:
        call = ch.unary_unary(MULTIGET)  # bytes in, bytes out: the client decodes nothing
        first = qpb.MultiGetResponse.FromString(await call(requests[0], timeout=10))
        assert len(first.results) == batch and all(r.found for r in first.results)
        calls, deadline = 0, time.perf_counter() + duration

        async def worker(n: int) -> None:
            nonlocal calls
            while time.perf_counter() < deadline:
                await call(requests[n % len(requests)], timeout=10)
                calls += 1
                n += in_flight

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(in_flight)))
        took = time.perf_counter() - t0
    return {"rps": calls / took, "requests": float(calls), "non2xx": 0.0, "errors": 0.0}


def multiget_client(address: str, requests: list[bytes], batch: int, duration: float
                    ) -> Result:
    """gRPC MultiGet at 8 calls in flight for ``duration`` s (run in the client process)."""
    return asyncio.run(_multiget(address, requests, batch, duration))


def multiget_requests(keys: int, batch: int, n: int = 16) -> list[bytes]:
    rng = random.Random(1)
    return [qpb.MultiGetRequest(job="shop", operator="views_1m", state="views",
                                keys=[f"page-{rng.randrange(keys)}" for _ in range(batch)]
                                ).SerializeToString() for _ in range(n)]


def load(storage: Storage, shards: list[ShardProcess], keys: int) -> None:
    save_spec(storage, SPEC)
    coord = Coordinator(storage, "shop", [s.address for s in shards])
    coord.register(SPEC)
    names = [f"page-{i}" for i in range(keys)]
    by_p: dict[int, list[str]] = {}
    for k in names:
        by_p.setdefault(partition_of(k, P), []).append(k)
    written = {}
    for p, ks in by_p.items():
        t = pa.table({"key": ks, "start": [120_000] * len(ks), "end": [180_000] * len(ks),
                      "tag": pa.nulls(len(ks), pa.int64()),
                      "views": [int(k[5:]) for k in ks]}).cast(deltas.delta_schema(SPEC))
        deltas.write_delta(storage, PartitionId(SPEC.job, SPEC.operator, p), 0, t)
        written[p] = {0: t.num_rows}
    Committer(coord).commit(SPEC, 0, 120_000, written)


def start_raw(log_dir: Path, keys: int, cpus: str = "") -> tuple[Child, str]:
    """``loadtest.raw_asgi`` on a free port (on ``cpus``), holding ``page-0`` ..
    ``page-<keys - 1>``: the child and its base URL."""
    port = free_port()
    raw = Child("raw", pinned([sys.executable, "-m", "uvicorn", "loadtest.raw_asgi:app",
                               "--http", "httptools", "--port", str(port), "--log-level",
                               "warning", "--no-access-log"], cpus), log_dir / "raw.log",
                env={**os.environ, "RAW_KEYS": str(keys)}).start()
    wait_for_port("127.0.0.1", port, 30, raw.proc)
    return raw, f"http://127.0.0.1:{port}"


def fetch_answers(url: str, names: list[str], threads: int = 4) -> list[bytes]:
    """The body of ``GET <url><STATE_PATH><name>`` for each name, in order (each must be a
    200)."""
    u = urlsplit(url)

    def part(chunk: list[str]) -> list[bytes]:
        conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=30)
        out = []
        for k in chunk:
            conn.request("GET", STATE_PATH + k)
            r = conn.getresponse()
            body = r.read()
            if r.status != 200:
                raise RuntimeError(f"{url}: GET {k} answered {r.status}: {body[:200]!r}")
            out.append(body)
        conn.close()
        return out

    step = max(1, math.ceil(len(names) / threads))
    with ThreadPoolExecutor(threads) as ex:
        parts = list(ex.map(part, [names[i:i + step] for i in range(0, len(names), step)]))
    return [b for p in parts for b in p]


def load_redis(port: int, answers: list[bytes]) -> None:
    """Key i's answer bytes under the name redis-benchmark's ``-r`` makes:
    ``page-<12 digits>``."""
    import redis

    r = redis.Redis(port=port)
    for lo in range(0, len(answers), 10_000):
        r.mset({f"page-{i:012d}": answers[i]
                for i in range(lo, min(lo + 10_000, len(answers)))})
    r.close()


@dataclass
class Target:
    """A server measured: its label in the tables, where it answers, what counts its CPU."""

    label: str
    url: str = ""
    grpc: str = ""
    pid: int = 0
    redis_port: int = 0


@dataclass
class Bench:
    args: argparse.Namespace
    tmp: Path
    shard_pids: tuple[int, ...]

    def point(self, t: Target) -> Result:
        a = self.args
        if not t.redis_port:
            return measure(lambda: wrk(t.url, a.keys, a.duration, self.tmp,
                                       cpus=a.client_cpus), (t.pid,), self.shard_pids)
        cmd = ["GET", "page-__rand_int__"]
        n = redis_requests(t.redis_port, cmd, a.keys, 32, a.duration, a.client_cpus)
        return measure(lambda: redis_benchmark(t.redis_port, cmd, a.keys, 32, n,
                                               a.client_cpus), (t.pid,), self.shard_pids)

    def http_batch(self, t: Target, batch: int) -> Result:
        a = self.args
        return measure(lambda: wrk(t.url, a.keys, a.duration, self.tmp, batch, 8,
                                   a.client_cpus), (t.pid,), self.shard_pids)

    def grpc_batch(self, t: Target, batch: int, client: ProcessPoolExecutor) -> Result:
        requests = multiget_requests(self.args.keys, batch)
        return measure(lambda: client.submit(multiget_client, t.grpc, requests, batch,
                                             self.args.duration).result(),
                       (t.pid,), self.shard_pids)

    def mget(self, t: Target, batch: int) -> Result:
        a = self.args
        cmd = ["MGET", *(["page-__rand_int__"] * batch)]
        n = redis_requests(t.redis_port, cmd, a.keys, 8, a.duration, a.client_cpus)
        return measure(lambda: redis_benchmark(t.redis_port, cmd, a.keys, 8, n,
                                               a.client_cpus), (t.pid,), self.shard_pids)


def summary(runs: list[Result]) -> Result:
    """Rounds of one target as one: mean rate, median latencies, CPU over all requests."""
    requests = sum(r["requests"] for r in runs)
    return {"rps": statistics.fmean(r["rps"] for r in runs),
            "p50": statistics.median(r.get("p50", math.nan) for r in runs),
            "p99": statistics.median(r.get("p99", math.nan) for r in runs),
            "bad": sum(r["non2xx"] + r["errors"] for r in runs),
            "busy": sum(r["cpu_s"] for r in runs) / sum(r["wall_s"] for r in runs),
            "us": 1e6 * sum(r["cpu_s"] for r in runs) / requests if requests else math.nan,
            "shard_us": 1e6 * sum(r["shard_cpu_s"] for r in runs) / requests
            if requests else math.nan}


def _ms(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:.2f}"


def point_table(args: argparse.Namespace, got: dict[str, list[Result]],
                load_of: dict[str, str]) -> list[str]:
    lines = [f"| server (CPU {args.server_cpus or 'any'}) | load generator "
             f"(CPU {args.client_cpus or 'any'}) | GET/s (each round) | p50 ms | p99 ms | "
             "non-2xx + errors | server CPU busy | server CPU µs a GET | shards' CPU µs a GET |",
             "|---|---|---|---|---|---|---|---|---|"]
    for label, runs in got.items():
        s = summary(runs)
        each = " / ".join(f"{r['rps']:,.0f}" for r in runs)
        lines.append(f"| {label} | {load_of[label]} | **{s['rps']:,.0f}** ({each}) | "
                     f"{_ms(s['p50'])} | {_ms(s['p99'])} | {s['bad']:.0f} | "
                     f"{100 * s['busy']:.0f}% | {s['us']:.1f} | {s['shard_us']:.1f} |")
    return lines


def ratios(fronts: list[str], got: dict[str, list[Result]]) -> list[str]:
    rps = {label: summary(runs)["rps"] for label, runs in got.items()}
    us = {label: summary(runs)["us"] for label, runs in got.items()}
    redis, raw = rps.get(REDIS_GET, math.nan), rps.get(RAW, math.nan)
    out = []
    for f in fronts:
        local, hop = rps[local_label(f)], rps[hop_label(f)]
        out.append(f"- {FRONT_NAMES[f]}, local: **{local / redis:.2f}x Redis GET**, "
                   f"**{local / raw:.2f}x the raw ASGI server**, {us[local_label(f)]:.1f} "
                   f"µs of router CPU a GET; over the hop {hop:,.0f} GET/s = "
                   f"**{hop / HOP_BEFORE:.2f}x the 7,036 of issue 45's bench**.")
    if "native" in fronts and "python" in fronts:
        out.append(f"- native / Python front (same run): local "
                   f"{rps[local_label('native')] / rps[local_label('python')]:.2f}x, over the "
                   f"hop {rps[hop_label('native')] / rps[hop_label('python')]:.2f}x; router "
                   f"CPU a GET {us[local_label('python')] / us[local_label('native')]:.1f}x "
                   "less (local).")
    return out


def before_after(args: argparse.Namespace, got: dict[str, list[Result]],
                 batch_rows: list[tuple[int, str, Result]]) -> list[str]:
    """With --before: each front's figures over its before's, same run."""
    if args.before is None:
        return []
    rps = {label: summary(runs)["rps"] for label, runs in got.items()}
    us = {label: summary(runs)["us"] for label, runs in got.items()}
    keys = {(b, how): b * r["rps"] for b, how, r in batch_rows}
    out = [f"- after / before (`--before {args.before}`, same run):"]
    for f in args.fronts:
        for where, label in (("local", local_label), ("over the hop", hop_label)):
            now, then = label(f), label(f, True)
            line = (f"  - {FRONT_NAMES[f]}, {where}: GET **{rps[now] / rps[then]:.2f}x** "
                    f"({rps[then]:,.0f} → {rps[now]:,.0f} GET/s; router CPU a GET "
                    f"{us[then]:.1f} → {us[now]:.1f} µs)")
            for b in args.batch_sizes:
                for how in ("gRPC MultiGet", "HTTP :batchGet"):
                    a, z = keys.get((b, f"{how}, {now}")), keys.get((b, f"{how}, {then}"))
                    if a and z:
                        line += f"; {how} {b:,} **{a / z:.2f}x**"
            out.append(line)
    return out


REDIS_GET = "Redis 7 GET, the router's answer bytes"
RAW = "raw ASGI dict server (uvicorn)"


BEFORE = " (before)"  # a front of --before's checkout


def local_label(front: str, before: bool = False) -> str:
    return f"router, {FRONT_NAMES[front]}{BEFORE * before}, local partitions"


def hop_label(front: str, before: bool = False) -> str:
    return f"router, {FRONT_NAMES[front]}{BEFORE * before}, over the hop (--no-local-reads)"


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=100_000,
                    help="keys of the operator, one window each (default: %(default)s)")
    ap.add_argument("--duration", type=int, default=10,
                    help="seconds of each measured run (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=2,
                    help="point-GET rounds, the order reversed each round (default: "
                    "%(default)s)")
    ap.add_argument("--fronts", default="native,python",
                    help="routers' HTTP fronts, comma-separated: native (the engine's) and "
                    "python (QSTATE_NATIVE_FRONT=false, the before) (default: %(default)s)")
    ap.add_argument("--batches", default="100,1000",
                    help="keys a call of the batch runs (MultiGet, :batchGet, Redis MGET); "
                    "empty: none (default: %(default)s)")
    ap.add_argument("--workers", type=int, default=1,
                    help="also a native router of this many processes (qstate router "
                    "--workers) reading in-process, on --server-cpus; 1: none "
                    "(default: %(default)s)")
    ap.add_argument("--server-cpus", default="1",
                    help="taskset CPU list of every server: shards, routers, the raw server, "
                    "Redis; empty: any (default: %(default)s)")
    ap.add_argument("--client-cpus", default="0",
                    help="taskset CPU list of every load generator: wrk, redis-benchmark, "
                    "the gRPC client process; empty: any (default: %(default)s)")
    ap.add_argument("--pipeline", action="store_true",
                    help="run the tweets job and a 5K ev/s generator meanwhile, on any core")
    ap.add_argument("--before", type=Path, default=None,
                    help="a checkout of an earlier qstate, set up (its .venv): each front also "
                    "runs from it, beside this one's, the before and after in one run "
                    "(default: none)")
    ap.add_argument("--out", type=Path, default=Path("loadtest/results/router.md"),
                    help="Markdown file the section is appended to (default: %(default)s)")
    args = ap.parse_args()
    args.fronts = [f for f in args.fronts.split(",") if f]
    if not args.fronts or any(f not in FRONTS for f in args.fronts):
        ap.error(f"--fronts: some of {', '.join(FRONTS)}")
    args.batch_sizes = [int(b) for b in args.batches.split(",") if b]
    if args.before is not None and not (args.before / ".venv/bin/python").exists():
        ap.error(f"--before: {args.before} has no .venv/bin/python (run make setup there)")
    return args


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main() -> None:
    args = parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="qstate-router-bench-"))
    logs = tmp / "logs"
    storage = Storage(str(tmp / "storage"))
    children: list[Child] = []
    broker = None
    redis_proc = None
    point: dict[str, list[Result]] = {}
    batch_rows: list[tuple[int, str, Result]] = []
    load_of: dict[str, str] = {}
    same: dict[str, str] = {}
    client = ProcessPoolExecutor(1, mp_context=get_context("spawn"), initializer=pin_self,
                                 initargs=(args.client_cpus,))
    try:
        shards = []
        for i in range(2):
            s = ShardProcess.make(f"b{i}", tmp / "shards", storage.uri, logs)
            s.args = pinned(s.args, args.server_cpus)
            shards.append(s.start_and_wait())
        children += shards
        load(storage, shards, args.keys)
        routers: dict[str, RouterProcess] = {}
        versions = [False, True] if args.before is not None else [False]
        for front in args.fronts:
            env = {**os.environ, "QSTATE_NATIVE_FRONT": FRONTS[front]}
            for before in versions:
                for label, extra in ((local_label(front, before), ()),
                                     (hop_label(front, before), ("--no-local-reads",))):
                    name = f"router-{front}{'-before' * before}{'-hop' * bool(extra)}"
                    r = RouterProcess.make(storage.uri, logs, name, env, *extra)
                    if before:  # the same command, the earlier checkout's interpreter
                        r.args = [str(args.before / ".venv/bin/python"), *r.args[1:]]
                    r.args = pinned(r.args, args.server_cpus)
                    routers[label] = r.start_and_wait()
                    children.append(r)
        if args.workers > 1:
            r = RouterProcess.make(storage.uri, logs, "router-workers", None, "--workers",
                                   str(args.workers))
            r.args = pinned(r.args, args.server_cpus)
            routers[f"router, native front, {args.workers} workers, local partitions"] = \
                r.start_and_wait()
            children.append(r)
        # the same key set as the router's (else its misses are cheap 404s, the ratio void)
        raw, raw_url = start_raw(logs, args.keys, args.server_cpus)
        children.append(raw)
        if args.pipeline:
            broker = KafkaBroker(tmp / "broker").start()
            children.append(Child("gen", qstate_command(
                "generate", "tweets", "--bootstrap", broker.bootstrap, "--rate", "5000",
                "--keys", "100000", "--no-progress"), logs / "gen.log").start())
            children.append(Child("job", qstate_command(
                "job", "tweets", "--bootstrap", broker.bootstrap, "--storage", storage.uri,
                "--checkpoints", str(tmp / "ckpt"), "--shards",
                ",".join(s.address for s in shards), "--partitions", "16", "--no-live"),
                logs / "job.log").start())
            time.sleep(45)  # past Spark's start-up, into steady batches
        for r in routers.values():  # warm-up (and every worker up)
            wrk(r.url, args.keys, 2, tmp, cpus=args.client_cpus)
        names = [f"page-{i}" for i in range(args.keys)]
        first = routers[local_label(args.fronts[0])]
        say(f"fetching the router's answers for {args.keys:,} keys")
        answers = fetch_answers(first.url, names)
        sample = random.Random(5).sample(range(args.keys), min(1000, args.keys))
        for label, r in routers.items():
            got = fetch_answers(r.url, [names[i] for i in sample])
            same[label] = f"{sum(g == answers[i] for g, i in zip(got, sample, strict=True))}" \
                          f"/{len(sample)}"
        redis_proc, redis_port = start_redis(tmp)
        pin(redis_proc.pid, args.server_cpus)
        load_redis(redis_port, answers)
        targets = [Target(REDIS_GET, pid=redis_proc.pid, redis_port=redis_port),
                   Target(RAW, url=raw_url, pid=raw.pid),
                   *(Target(label, r.url, r.grpc_address, r.pid) for label, r in routers.items())]
        bench = Bench(args, tmp, tuple(s.pid for s in shards))
        for t in targets:
            point[t.label] = []
            load_of[t.label] = "redis-benchmark -c 32" if t.redis_port else "wrk -t1 -c32"
        for rnd in range(args.rounds):
            for t in targets if rnd % 2 == 0 else targets[::-1]:
                res = bench.point(t)
                cpu_us = 1e6 * res['cpu_s'] / res['requests']
                say(f"round {rnd + 1}: {t.label}: {res['rps']:,.0f} GET/s, "
                    f"p99 {res['p99']:.2f} ms, CPU {cpu_us:.1f} µs a GET")
                point[t.label].append(res)
        batch_targets = [t for t in targets if t.grpc and "workers" not in t.label]
        for b in args.batch_sizes:
            for t in batch_targets:
                for how, res in ((f"gRPC MultiGet, {t.label}", bench.grpc_batch(t, b, client)),
                               (f"HTTP :batchGet, {t.label}", bench.http_batch(t, b))):
                    say(f"{b} keys a call: {how}: {b * res['rps']:,.0f} keys/s")
                    batch_rows.append((b, how, res))
            res = bench.mget(targets[0], b)
            say(f"{b} keys a call: Redis MGET: {b * res['rps']:,.0f} keys/s")
            batch_rows.append((b, "Redis 7 MGET (redis-benchmark -c 8)", res))
    finally:
        client.shutdown()
        if redis_proc is not None:
            redis_proc.terminate()
            redis_proc.wait(10)
        for c in reversed(children):
            c.stop()
        if broker is not None:
            broker.stop()
    write(args, point, load_of, same, batch_rows)


def write(args: argparse.Namespace, point: dict[str, list[Result]], load_of: dict[str, str],
          same: dict[str, str], batch_rows: list[tuple[int, str, Result]]) -> None:
    command = results.command("loadtest.bench_router")
    pinning = (f"servers (shards, routers, raw server, Redis) on CPU {args.server_cpus}, load "
               f"generators (wrk, redis-benchmark, the gRPC client) on CPU {args.client_cpus}"
               if args.server_cpus or args.client_cpus else "nothing pinned")
    text = [f"\n## point GET and batches: native front vs Python front vs Redis vs raw ASGI, "
            f"{args.keys:,} keys, {args.duration} s a run"
            f"{', pipeline running (tweets job + 5K ev/s)' if args.pipeline else ''}\n",
            f"`{command}` ({time.strftime('%Y-%m-%d %H:%M')}, 2 cores; taskset: {pinning})\n",
            *point_table(args, point, load_of), "", *ratios(args.fronts, point),
            *before_after(args, point, batch_rows),
            "- answer bytes equal to the first front's (a sample of keys): "
            + ", ".join(f"{label}: {n}" for label, n in same.items()), ""]
    if batch_rows:
        text += [f"Batches of random keys ({args.duration} s each; gRPC and HTTP 8 calls in "
                 "flight; Redis holds the router's answer bytes per key):\n",
                 "| read | keys a call | keys/s | calls/s | non-2xx + errors | server CPU busy "
                 "| server CPU µs a key | shards' CPU µs a key |",
                 "|---|---|---|---|---|---|---|---|"]
        for b, how, r in batch_rows:
            keys = b * r["requests"]
            text.append(f"| {how} | {b:,} | **{b * r['rps']:,.0f}** | {r['rps']:,.0f} | "
                        f"{r['non2xx'] + r['errors']:.0f} | "
                        f"{100 * r['cpu_s'] / r['wall_s']:.0f}% | "
                        f"{1e6 * r['cpu_s'] / keys:.2f} | {1e6 * r['shard_cpu_s'] / keys:.2f} |")
        text.append("")
    results.append(args.out, "\n".join(text))


if __name__ == "__main__":
    main()
