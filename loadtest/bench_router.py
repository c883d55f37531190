"""Router read throughput next to a raw-ASGI dict server, in the same run.

    python -m loadtest.bench_router --keys 100000 --duration 10

Stands up checkpoint storage with one operator of ``--keys`` keys (one window each, written
as delta files and committed through the coordinator), two shard servers and one router,
plus ``loadtest.raw_asgi`` on its own port. Then, one after the other: ``wrk -t1 -c32`` GETs
of random keys against the raw server and the router, and gRPC MultiGet of 100 random keys
per call against the router with 8 calls in flight; then, for each of ``--batches`` keys a
call, gRPC MultiGet and HTTP :batchGet through both routers beside ``redis-benchmark``'s MGET
of as many keys from a Redis holding the same key set. With ``--pipeline`` the tweets job
and a 5K ev/s generator run beside it the whole time. Appends a section to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import pyarrow as pa

from loadtest import results
from loadtest.bench_ingest import start_redis
from qstate.control.coordinator import Coordinator
from qstate.core import delta as deltas
from qstate.core.address import PartitionId, partition_of
from qstate.core.operator import OperatorSpec, WindowSpec, save_spec
from qstate.core.storage import Storage
from qstate.embedded.kafka import KafkaBroker
from qstate.embedded.ports import free_port, wait_for_port
from qstate.embedded.procs import Child, RouterProcess, ShardProcess, qstate_command
from qstate.jobs.commit import Committer
from qstate.proto import qstate_pb2 as qpb
from qstate.proto import qstate_pb2_grpc as qpb_grpc

P = 16
SPEC = OperatorSpec("shop", "views_1m", "page", {"views": "long"}, partitions=P,
                    window=WindowSpec("tumbling", 60_000))
LUA = """
math.randomseed(42)
request = function()
  return wrk.format("GET", "{prefix}" .. "page-" .. math.random(0, {n}))
end
"""
# :batchGet of {batch} random keys a request
BATCH_LUA = """
math.randomseed(43)
request = function()
  local keys = {}
  for i = 1, {batch} do keys[i] = '"page-' .. math.random(0, {n}) .. '"' end
  return wrk.format("POST", "/v1/state/shop/views_1m/views:batchGet",
                    {["Content-Type"] = "application/json"},
                    '{"keys": [' .. table.concat(keys, ",") .. ']}')
end
"""


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


def wrk(url: str, keys: int, duration: int, tmp: Path, batch: int = 0,
        connections: int = 32) -> dict[str, float]:
    """GETs of random keys, or ``batch`` > 0: :batchGet of that many a request."""
    script = tmp / "get.lua"
    lua = BATCH_LUA.replace("{batch}", str(batch)) if batch else \
        LUA.replace("{prefix}", "/v1/state/shop/views_1m/views/")
    script.write_text(lua.replace("{n}", str(keys - 1)))
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{duration}s", "--latency",
                          "-s", str(script), url], capture_output=True, text=True,
                         check=True).stdout

    def ms(label: str) -> float:
        m = re.search(rf"{label}\s+([\d.]+)(us|ms|s)\b", out)
        assert m, out
        return float(m.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]

    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"rps": rps, "p50": ms("50%"), "p99": ms("99%"),
            "non2xx": float(errors.group(1)) if errors else 0.0}


async def multiget(address: str, keys: int, duration: float, batch: int = 100) -> float:
    """Keys/s of gRPC MultiGet, ``batch`` random keys a call, 8 calls in flight. The calls
    are made up front, so the client's own Python costs little of the shared CPU."""
    rng = random.Random(1)
    calls = [qpb.MultiGetRequest(job="shop", operator="views_1m", state="views",
                                 keys=[f"page-{rng.randrange(keys)}" for _ in range(batch)])
             for _ in range(64)]
    async with grpc.aio.insecure_channel(address) as ch:
        stub = qpb_grpc.QueryableStateStub(ch)
        done = 0
        deadline = time.perf_counter() + duration

        async def worker(n: int) -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                r = await stub.MultiGet(calls[n % len(calls)], timeout=10)
                assert len(r.results) == batch and r.results[0].found
                done += batch
                n += 8

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(8)))
        return done / (time.perf_counter() - t0)


def start_raw(log_dir: Path, keys: int) -> tuple[Child, str]:
    """``loadtest.raw_asgi`` on a free port, holding ``page-0`` .. ``page-<keys - 1>``: the
    child and its base URL."""
    port = free_port()
    raw = Child("raw", [sys.executable, "-m", "uvicorn", "loadtest.raw_asgi:app", "--http",
                        "httptools", "--port", str(port), "--log-level", "warning",
                        "--no-access-log"], log_dir / "raw.log",
                env={**os.environ, "RAW_KEYS": str(keys)}).start()
    wait_for_port("127.0.0.1", port, 30, raw.proc)
    return raw, f"http://127.0.0.1:{port}"


def load_redis(port: int, keys: int) -> None:
    """The raw server's answers in Redis, under the names redis-benchmark's ``-r`` makes:
    ``page-<12 digits>``."""
    import redis

    r = redis.Redis(port=port)
    body = b'{"job":"shop","operator":"views_1m","state":"views","windows":[]}'
    for lo in range(0, keys, 10_000):
        r.mset({f"page-{i:012d}": body for i in range(lo, min(lo + 10_000, keys))})
    r.close()


def redis_mget(port: int, keys: int, batch: int, duration: int) -> float:
    """Keys/s of ``MGET`` of ``batch`` random keys, 8 clients: redis-benchmark for about
    ``duration`` seconds (its -n, from a short first run's rate)."""
    def run(n: int) -> float:
        out = subprocess.run(["redis-benchmark", "-p", str(port), "-c", "8", "-n", str(n),
                              "-r", str(keys), "--csv", "MGET",
                              *(["page-__rand_int__"] * batch)],
                             capture_output=True, text=True, check=True).stdout
        return float(out.strip().splitlines()[-1].split(",")[1].strip('"'))

    rate = run(2_000)
    return batch * run(max(2_000, int(rate * duration)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--pipeline", action="store_true",
                    help="run the tweets job and a 5K ev/s generator meanwhile")
    ap.add_argument("--batches", default="100,1000",
                    help="keys a call of the batch runs (MultiGet, :batchGet, Redis MGET); "
                    "empty: none (default: %(default)s)")
    ap.add_argument("--workers", type=int, default=2,
                    help="also a router of this many processes (qstate router --workers), "
                    "reading in-process; 1: none (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=Path("loadtest/results/router.md"))
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",") if b]
    tmp = Path(tempfile.mkdtemp(prefix="qstate-router-bench-"))
    storage = Storage(str(tmp / "storage"))
    children: list[Child] = []
    broker = None
    try:
        shards = [ShardProcess.make(f"b{i}", tmp / "shards", storage.uri, tmp / "logs")
                  .start_and_wait() for i in range(2)]
        children += shards
        load(storage, shards, args.keys)
        router = RouterProcess.make(storage.uri, tmp / "logs").start_and_wait()
        hop = RouterProcess.make(storage.uri, tmp / "logs", "router-grpc", None,
                                 "--no-local-reads").start_and_wait()
        children += [router, hop]
        many = None
        if args.workers > 1:
            many = RouterProcess.make(storage.uri, tmp / "logs", "router-workers", None,
                                      "--workers", str(args.workers)).start_and_wait()
            children.append(many)
        # the same key set as the router's, at every --keys (else its misses are cheap 404s
        # and the ratio is void)
        raw, raw_url = start_raw(tmp / "logs", args.keys)
        children.append(raw)
        if args.pipeline:
            broker = KafkaBroker(tmp / "broker").start()
            children.append(Child("gen", qstate_command(
                "generate", "tweets", "--bootstrap", broker.bootstrap, "--rate", "5000",
                "--keys", "100000", "--no-progress"), tmp / "logs" / "gen.log").start())
            children.append(Child("job", qstate_command(
                "job", "tweets", "--bootstrap", broker.bootstrap, "--storage", storage.uri,
                "--checkpoints", str(tmp / "ckpt"), "--shards",
                ",".join(s.address for s in shards), "--partitions", "16", "--no-live"),
                tmp / "logs" / "job.log").start())
            time.sleep(45)  # past Spark's start-up, into steady batches
        wrk(router.url, args.keys, 2, tmp)  # warm-up
        wrk(hop.url, args.keys, 2, tmp)
        raw_r = wrk(raw_url, args.keys, args.duration, tmp)
        router_r = wrk(router.url, args.keys, args.duration, tmp)
        hop_r = wrk(hop.url, args.keys, args.duration, tmp)
        many_r = None
        if many is not None:
            wrk(many.url, args.keys, 2, tmp)  # warm-up (and every worker up)
            many_r = wrk(many.url, args.keys, args.duration, tmp)
        mg = asyncio.run(multiget(router.grpc_address, args.keys, args.duration))
        mg_hop = asyncio.run(multiget(hop.grpc_address, args.keys, args.duration))
        batch_rows = []
        if batches:
            redis_proc, redis_port = start_redis(tmp)
            try:
                load_redis(redis_port, args.keys)
                for b in batches:
                    batch_rows.append((b, {
                        "gRPC MultiGet, in-process": asyncio.run(multiget(
                            router.grpc_address, args.keys, args.duration, b)),
                        "gRPC MultiGet, hop": asyncio.run(multiget(
                            hop.grpc_address, args.keys, args.duration, b)),
                        "HTTP :batchGet, in-process": b * wrk(
                            router.url, args.keys, args.duration, tmp, b, 8)["rps"],
                        "HTTP :batchGet, hop": b * wrk(
                            hop.url, args.keys, args.duration, tmp, b, 8)["rps"],
                        "Redis MGET (redis-benchmark -c8)": redis_mget(
                            redis_port, args.keys, b, args.duration)}))
            finally:
                redis_proc.terminate()
                redis_proc.wait(10)
    finally:
        for c in reversed(children):
            c.stop()
        if broker is not None:
            broker.stop()
    command = results.command("loadtest.bench_router")
    text = "\n".join([
        f"\n## router vs raw ASGI, {args.keys:,} keys, wrk -t1 -c32 -d{args.duration}s"
        f"{', pipeline running (tweets job + 5K ev/s)' if args.pipeline else ''}\n",
        f"`{command}` ({time.strftime('%Y-%m-%d %H:%M')}, 2 cores shared by everything)\n",
        "| server | GET req/s | p50 ms | p99 ms | non-2xx |", "|---|---|---|---|---|",
        f"| raw ASGI dict (upper bound) | {raw_r['rps']:,.0f} | {raw_r['p50']:.2f} | "
        f"{raw_r['p99']:.2f} | {raw_r['non2xx']:.0f} |",
        f"| qstate router, co-located shards read in-process | {router_r['rps']:,.0f} | "
        f"{router_r['p50']:.2f} | {router_r['p99']:.2f} | {router_r['non2xx']:.0f} |",
        f"| qstate router, gRPC hop to the shard (coalesced MultiGet) | {hop_r['rps']:,.0f} | "
        f"{hop_r['p50']:.2f} | {hop_r['p99']:.2f} | {hop_r['non2xx']:.0f} |",
        *([f"| qstate router, {args.workers} workers (--workers), in-process | "
           f"{many_r['rps']:,.0f} | {many_r['p50']:.2f} | {many_r['p99']:.2f} | "
           f"{many_r['non2xx']:.0f} |"] if many_r is not None else []),
        f"\nrouter / raw = {router_r['rps'] / raw_r['rps']:.2f} in-process, "
        f"{hop_r['rps'] / raw_r['rps']:.2f} over the hop. gRPC MultiGet through the router "
        f"(100 keys a call, 8 in flight): **{mg:,.0f} keys/s** in-process, "
        f"{mg_hop:,.0f} keys/s over the hop"
        + (f"; {args.workers} workers / 1 = {many_r['rps'] / router_r['rps']:.2f}"
           if many_r is not None else "") + "\n"])
    if batch_rows:
        names = list(batch_rows[0][1])
        text += "\n".join([
            f"\nBatches, keys/s ({args.duration} s each, 8 calls in flight, random keys of the "
            f"{args.keys:,}; Redis holds the same keys with the raw server's answer bytes):\n",
            "| keys a call | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|",
            *(f"| {b:,} | " + " | ".join(f"{r[n]:,.0f}" for n in names) + " |"
              for b, r in batch_rows), ""])
    results.append(args.out, text)


if __name__ == "__main__":
    main()
