"""Cluster reads: a key owned by another host, and gRPC reads, against a local HTTP read, one
run (issue 55; docs/architecture.md §5, cluster reads and native gRPC reads).

    python -m loadtest.bench_cluster_reads --keys 100000 --duration 10 --rounds 2

Two deployments over checkpoint storages of their own, each of two shard servers holding one
operator of ``--keys`` keys (``loadtest.bench_router``'s): in ``native``, the shards run the
engine's reader (``QSTATE_SHARD_READER=true``, the default), in ``python`` they do not (their
Python ``MultiGet`` answers the hop: the "before"). Routers: one reading ``native``'s
partitions in-process ("local"), one reading them over the hop (``--no-local-reads``, as a
router on another host: every key's owner is elsewhere), the same over ``python``'s shards,
and a router with ``QSTATE_NATIVE_FRONT=false`` (grpc.aio holds its gRPC port: the gRPC
"before").

Measured, servers on ``--server-cpus`` and load on ``--client-cpus`` (taskset):
- point GETs of random keys (``wrk -t1 -c32``), ``--rounds`` times in alternating order: GET/s,
  and the CPU of one GET summed over every process it touched (the router's and the shards');
  then local and over the hop at each of ``--connections`` in flight, once (a call to an owner
  carries the keys waiting for it: more in flight, fuller calls);
- ``:batchGet`` of each ``--batches`` size (``wrk -c8``), local and over the hop;
- gRPC ``Get`` on the native router's port and on grpc.aio's, against the HTTP GET of the
  same router: ``ghz -c 32`` (random keys from a file of requests; on one core it saturates
  before the router does, its row says how busy the router was) and ``h2load -c 4 -m 8`` (one
  key, gRPC's framing over HTTP/2 from a client in C); ``MultiGet`` of each batch size (8
  calls in flight) against ``:batchGet``; and both tools against a raw gRPC server in Go that
  answers every call with the same bytes (``loadtest/rawgrpc``): what a tool reaches on its
  core when the server costs nearly nothing, the ceiling the router's gRPC rows are read
  against.
Appends a section to ``--out``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import grpc

from loadtest import results
from loadtest.bench_router import (
    Bench,
    Result,
    Target,
    fetch_answers,
    load,
    measure,
    summary,
    wrk,
)
from loadtest.cpu import pin_self, pinned
from qstate.core.records.storage import Storage
from qstate.embedded.ports import free_port, wait_for_port
from qstate.embedded.procs import Child, RouterProcess, ShardProcess
from qstate.proto import qstate_pb2 as qpb

__all__ = ["main"]


def _ms(v: float) -> str:
    return "-" if v != v else f"{v:.2f}"  # NaN: the tool gives no percentile

GET_METHOD = "qstate.v1.QueryableState.Get"
GET_PATH = "/qstate.v1.QueryableState/Get"
GET_ONE = qpb.GetRequest(job="shop", operator="views_1m", state="views", key="page-4242")
GHZ_INSTALL = "make bench-setup (go install github.com/bojand/ghz/cmd/ghz@v0.120.0)"
PROTO = Path(__file__).resolve().parents[1] / "proto" / "qstate.proto"


def tool(name: str, how: str) -> str:
    """A load tool's binary: beside this Python (where `make bench-setup` puts ghz and
    loadtest/rawgrpc's server), else on PATH; else exit saying ``how`` it is installed."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        raise SystemExit(f"{name} is not installed: {how}")
    return found


def ghz(address: str, keys: int, duration: int, tmp: Path, cpus: str) -> Result:
    """``ghz -c 32`` of ``Get`` on random keys (2,000 requests cycled from a file)."""
    rng = random.Random(3)
    data = tmp / "ghz-get.json"
    data.write_text(json.dumps([{"job": "shop", "operator": "views_1m", "state": "views",
                                 "key": f"page-{rng.randrange(keys)}"} for _ in range(2000)]))
    out = subprocess.run(pinned([tool("ghz", GHZ_INSTALL), "--insecure", "--proto", str(PROTO),
                                 "--import-paths", str(PROTO.parent), "--call", GET_METHOD,
                                 "-c", "32", "--connections", "4", "-z", f"{duration}s",
                                 "--data-file", str(data), "--format", "json",
                                 "--skipFirst", "100", address], cpus),
                         capture_output=True, text=True, check=True).stdout
    r = json.loads(out)
    lat = {d["percentage"]: d["latency"] / 1e6 for d in r.get("latencyDistribution") or []}
    errors = sum(n for code, n in (r.get("statusCodeDistribution") or {}).items()
                 if code != "OK")
    return {"rps": float(r["rps"]), "p50": lat.get(50, float("nan")),
            "p99": lat.get(99, float("nan")), "non2xx": float(errors), "errors": 0.0,
            "requests": float(r["count"])}


def start_raw(reply: bytes, logs: Path, cpus: str) -> tuple[Child, str]:
    """A gRPC server in Go that answers every call with ``reply`` and decodes nothing: what
    ghz reaches when the server costs almost nothing (its ceiling on its core)."""
    port = free_port()
    binary = tool("qstate-rawgrpc", "make bench-setup (loadtest/rawgrpc)")
    raw = Child("rawgrpc", pinned([binary, "--listen", f"127.0.0.1:{port}",
                                   "--reply-hex", reply.hex()], cpus), logs / "rawgrpc.log")
    raw.start()
    wait_for_port("127.0.0.1", port, 10, raw.proc)
    return raw, f"127.0.0.1:{port}"


def h2load(address: str, duration: int, tmp: Path, cpus: str) -> Result:
    """``h2load -c 4 -m 8`` (32 in flight) of ``Get`` of one key: gRPC's own framing over
    HTTP/2, from a client in C that costs a call far less than ghz (which saturates its core
    first: its row says how busy the router was)."""
    msg = GET_ONE.SerializeToString()
    body = tmp / "h2load-get.bin"
    body.write_bytes(b"\0" + struct.pack(">I", len(msg)) + msg)
    out = subprocess.run(pinned(["h2load", "-c", "4", "-m", "8", "-D", str(duration), "-d",
                                 str(body), "-H", "content-type: application/grpc", "-H",
                                 "te: trailers",
                                 f"http://{address}{GET_PATH}"], cpus),
                         capture_output=True, text=True, check=True).stdout
    rate = re.search(r"finished in .*?, ([\d.]+) req/s", out)
    done = re.search(r"(\d+) succeeded, (\d+) failed, (\d+) errored", out)
    if rate is None or done is None:
        raise RuntimeError(f"h2load said: {out[-500:]}")
    return {"rps": float(rate.group(1)), "p50": float("nan"), "p99": float("nan"),
            "non2xx": float(done.group(2)) + float(done.group(3)), "errors": 0.0,
            "requests": float(done.group(1))}


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--keys", type=int, default=100_000, help="keys of the operator")
    ap.add_argument("--duration", type=int, default=10, help="seconds a run")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of the point GETs")
    ap.add_argument("--batches", default="100,1000", help="keys a call of the batch reads")
    ap.add_argument("--connections", default="128,256",
                    help="more point GETs in flight (wrk -c), local and over the hop, once each")
    ap.add_argument("--server-cpus", default="1", help="taskset of every server")
    ap.add_argument("--client-cpus", default="0", help="taskset of every load generator")
    ap.add_argument("--out", type=Path, default=Path("loadtest/results/cluster_reads.md"),
                    help="results file (a section is appended)")
    args = ap.parse_args()
    args.batch_sizes = [int(b) for b in args.batches.split(",") if b]
    args.connection_counts = [int(c) for c in args.connections.split(",") if c]
    return args


def say(text: str) -> None:
    print(f"[bench_cluster_reads] {text}", flush=True)


LOCAL = "local partitions (native front)"
HOP = "over the hop, owner's reader (native)"
HOP_PY = "over the hop, owner's Python MultiGet (before)"
RAW = "raw gRPC server (Go, every call answered with page-4242's bytes)"
GRPC_PY = "grpc.aio front (QSTATE_NATIVE_FRONT=false), local partitions"


def main() -> None:
    args = parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="qstate-cluster-bench-"))
    logs = tmp / "logs"
    children: list[Child] = []
    client = ProcessPoolExecutor(1, mp_context=get_context("spawn"), initializer=pin_self,
                                 initargs=(args.client_cpus,))
    rows: dict[str, list[Result]] = {}
    batch_rows: list[tuple[int, str, Result]] = []
    grpc_rows: list[tuple[str, Result]] = []
    wide_rows: list[tuple[int, str, Result]] = []
    same: dict[str, str] = {}
    try:
        clusters: dict[str, tuple[Storage, list[ShardProcess]]] = {}
        for name, reader in (("native", "true"), ("python", "false")):
            storage = Storage(str(tmp / f"storage-{name}"))
            shards = []
            for i in range(2):
                s = ShardProcess.make(f"{name}{i}", tmp / f"shards-{name}", storage.uri, logs,
                                      env={**os.environ, "QSTATE_SHARD_READER": reader})
                s.args = pinned(s.args, args.server_cpus)
                shards.append(s.start_and_wait())
            children += shards
            load(storage, shards, args.keys)
            clusters[name] = (storage, shards)
        routers: dict[str, tuple[RouterProcess, tuple[int, ...]]] = {}
        plan = ((LOCAL, "native", "true", ()), (HOP, "native", "true", ("--no-local-reads",)),
                (HOP_PY, "python", "true", ("--no-local-reads",)),
                (GRPC_PY, "native", "false", ()))
        for label, cluster, front, extra in plan:
            storage, shards = clusters[cluster]
            env = {**os.environ, "QSTATE_NATIVE_FRONT": front}
            r = RouterProcess.make(storage.uri, logs, f"router-{len(routers)}", env, *extra)
            r.args = pinned(r.args, args.server_cpus)
            routers[label] = (r.start_and_wait(), tuple(s.pid for s in shards))
            children.append(r)
        for r, _ in routers.values():  # warm-up: partitions opened, channels made
            wrk(r.url, args.keys, 2, tmp, cpus=args.client_cpus)
        names = [f"page-{i}" for i in range(args.keys)]
        sample = random.Random(5).sample(names, min(1000, args.keys))
        first = fetch_answers(routers[LOCAL][0].url, sample)
        for label, (r, _) in routers.items():
            got = fetch_answers(r.url, sample)
            same[label] = f"{sum(a == b for a, b in zip(got, first, strict=True))}/{len(sample)}"
        http_targets = [LOCAL, HOP, HOP_PY]
        for rnd in range(args.rounds):
            for label in http_targets if rnd % 2 == 0 else http_targets[::-1]:
                r, shard_pids = routers[label]
                bench = Bench(args, tmp, shard_pids)
                res = bench.point(Target(label, r.url, r.grpc_address, r.pid))
                say(f"round {rnd + 1}: {label}: {res['rps']:,.0f} GET/s, CPU router "
                    f"{1e6 * res['cpu_s'] / res['requests']:.1f} + shards "
                    f"{1e6 * res['shard_cpu_s'] / res['requests']:.1f} µs a GET")
                rows.setdefault(label, []).append(res)
        for c in args.connection_counts:
            for label in (LOCAL, HOP):
                r, shard_pids = routers[label]
                res = measure(functools.partial(wrk, r.url, args.keys, args.duration, tmp,
                                                connections=c, cpus=args.client_cpus),
                              (r.pid,), shard_pids)
                say(f"{c} in flight: {label}: {res['rps']:,.0f} GET/s")
                wide_rows.append((c, label, res))
        with grpc.insecure_channel(routers[LOCAL][0].grpc_address) as ch:
            reply = ch.unary_unary(GET_PATH)(GET_ONE.SerializeToString(), timeout=10)
        raw, raw_address = start_raw(reply, logs, args.server_cpus)
        children.append(raw)
        for label, address, pids, shard_pids in (
                (RAW, raw_address, (raw.pid,), ()),
                *((lb, routers[lb][0].grpc_address, (routers[lb][0].pid,), routers[lb][1])
                  for lb in (LOCAL, GRPC_PY))):
            for tool, run in (("ghz -c 32, random keys",
                               functools.partial(ghz, address, args.keys, args.duration, tmp,
                                                 args.client_cpus)),
                              ("h2load -c 4 -m 8, one key",
                               functools.partial(h2load, address, args.duration, tmp,
                                                 args.client_cpus))):
                res = measure(run, pids, shard_pids)
                say(f"gRPC Get, {tool}, {label}: {res['rps']:,.0f} req/s")
                grpc_rows.append((f"{label}, {tool}", res))
        for b in args.batch_sizes:
            for label in (LOCAL, HOP, HOP_PY):
                r, shard_pids = routers[label]
                bench = Bench(args, tmp, shard_pids)
                t = Target(label, r.url, r.grpc_address, r.pid)
                for how, res in ((f"HTTP :batchGet, {label}", bench.http_batch(t, b)),
                                 (f"gRPC MultiGet, {label}", bench.grpc_batch(t, b, client))):
                    say(f"{b} keys a call: {how}: {b * res['rps']:,.0f} keys/s")
                    batch_rows.append((b, how, res))
    finally:
        client.shutdown()
        for c in reversed(children):
            c.stop()
    write(args, rows, grpc_rows, batch_rows, wide_rows, same)


def write(args: argparse.Namespace, rows: dict[str, list[Result]],
          grpc_rows: list[tuple[str, Result]], batch_rows: list[tuple[int, str, Result]],
          wide_rows: list[tuple[int, str, Result]], same: dict[str, str]) -> None:
    command = results.command("loadtest.bench_cluster_reads")
    s = {label: summary(runs) for label, runs in rows.items()}
    local = s[LOCAL]
    text = [f"\n## cluster reads: the hop and gRPC against a local read, {args.keys:,} keys, "
            f"{args.duration} s a run\n",
            f"`{command}` ({time.strftime('%Y-%m-%d %H:%M')}, 2 cores; servers on CPU "
            f"{args.server_cpus}, load on CPU {args.client_cpus})\n",
            "| point GET (wrk -t1 -c32) | GET/s (rounds) | p99 ms | router µs a GET | shards' "
            "µs a GET | CPU a GET, all processes | vs local GET/s | vs local CPU |",
            "|---|---|---|---|---|---|---|---|"]
    for label, r in s.items():
        total = r["us"] + r["shard_us"]
        base = local["us"] + local["shard_us"]
        rounds = " / ".join(f"{x['rps']:,.0f}" for x in rows[label])
        text.append(f"| {label} | **{r['rps']:,.0f}** ({rounds}) | {r['p99']:.2f} | "
                    f"{r['us']:.1f} | {r['shard_us']:.1f} | {total:.1f} µs | "
                    f"**{r['rps'] / local['rps']:.2f}x** | {total / base:.2f}x |")
    text += ["", "| point GET, more in flight (wrk -t1 -c) | in flight | GET/s | p99 ms | "
             "router µs a GET | shards' µs a GET | vs local GET/s at as many |",
             "|---|---|---|---|---|---|---|"]
    local_at = {c: r["rps"] for c, label, r in wide_rows if label == LOCAL}
    for c, label, r in wide_rows:
        text.append(f"| {label} | {c} | **{r['rps']:,.0f}** | {r['p99']:.2f} | "
                    f"{1e6 * r['cpu_s'] / r['requests']:.1f} | "
                    f"{1e6 * r['shard_cpu_s'] / r['requests']:.1f} | "
                    f"**{r['rps'] / local_at[c]:.2f}x** |")
    text += ["", "| gRPC Get (32 in flight) | req/s | p50 / p99 ms | non-OK | router busy | "
             "router µs a call | vs the native router's HTTP GET: req/s, CPU a call |",
             "|---|---|---|---|---|---|---|"]
    for label, r in grpc_rows:
        us = 1e6 * r["cpu_s"] / r["requests"] if r["requests"] else float("nan")
        text.append(f"| {label} | **{r['rps']:,.0f}** | {_ms(r['p50'])} / {_ms(r['p99'])} | "
                    f"{r['non2xx']:.0f} | {r['cpu_s'] / r['wall_s']:.0%} | {us:.1f} | "
                    f"**{r['rps'] / local['rps']:.2f}x**, {us / local['us']:.2f}x |")
    text += ["", "| batch (8 calls in flight) | keys a call | keys/s | router µs a key | "
             "shards' µs a key | vs local :batchGet |", "|---|---|---|---|---|---|"]
    base_of = {b: res["rps"] for b, how, res in batch_rows if how == f"HTTP :batchGet, {LOCAL}"}
    for b, how, r in batch_rows:
        keys = b * r["requests"]
        text.append(f"| {how} | {b:,} | **{b * r['rps']:,.0f}** | "
                    f"{1e6 * r['cpu_s'] / keys:.2f} | {1e6 * r['shard_cpu_s'] / keys:.2f} | "
                    f"{r['rps'] / base_of[b]:.2f}x |")
    spread = statistics.fmean(abs(x["rps"] - s[lb]["rps"]) / s[lb]["rps"]
                              for lb in rows for x in rows[lb])
    text += ["", "- answer bytes equal to the local router's on a sample of keys: "
             + ", ".join(f"{label}: {n}" for label, n in same.items()),
             f"- mean spread of a round from its mean GET/s: {spread:.0%}", ""]
    results.append(args.out, "\n".join(text))


if __name__ == "__main__":
    main()
