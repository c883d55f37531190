"""Clients that follow the cluster map, on hosts of their own (issue 55; docs/architecture.md
§5, cluster map): where each read is answered, and what it costs, one run.

    sudo python -m loadtest.bench_cluster_map --keys 100000 --duration 10

Three hosts as network namespaces (``loadtest.netns``, root), each a shard server and the
router of its node (``QSTATE_NODE``: it reads its host's partitions in-process), with TLS and
the cluster token between them as in production; one operator of ``--keys`` keys
(``loadtest.bench_router``'s), its partitions spread over the three shards. Measured:

- **where reads are answered**: ``--reads`` random keys read one by one by a Python
  ``Client(direct=True)`` and by a plain ``Client`` at host 1's router; from the routers'
  ``qstate_router_shard_reads_total``, the share read by the router of the key's own host
  (``local``) and the share forwarded over a hop (``remote``);
- **1, 2 and 3 readers**: point GETs of random keys (``wrk``, ``--connections`` in all)
  sent to the routers of the first 1, 2 or 3 hosts, each router given the keys a smart
  client would send it (its own host's; with fewer readers than hosts, the rest of the keys
  spread over them, forwarded): GET/s, the share forwarded, and the CPU of one GET summed
  over every server process (the three routers and shards). On one 2-core machine this shows
  the cost of a read, not how a cluster scales: every host shares the same two cores.

Appends a section to ``--out``.
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from loadtest import results
from loadtest.bench_router import (
    SPEC,
    STATE_PATH,
    P,
    Result,
    file_pick,
    get_script,
    load,
    run_wrk,
)
from loadtest.cpu import cpu_seconds
from loadtest.netns import Host, Network
from qstate.client import Client
from qstate.core.address import partition_of
from qstate.core.config import settings
from qstate.core.records.assignment import load_assignment
from qstate.core.records.storage import Storage
from qstate.embedded.procs import Child, RouterProcess, ShardProcess, qstate_command

HOSTS = 3
SHARD_PORT, METRICS_PORT, HTTP_PORT, GRPC_PORT = 7100, 9465, 8000, 50051
SERVER_NAME = "qstate-shard"
READS = "qstate_router_shard_reads_total"


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--keys", type=int, default=100_000, help="keys of the operator")
    ap.add_argument("--reads", type=int, default=3000, help="keys each client reads")
    ap.add_argument("--duration", type=int, default=10, help="seconds a wrk run")
    ap.add_argument("--connections", type=int, default=24, help="wrk connections in all")
    ap.add_argument("--out", type=Path, default=Path("loadtest/results/cluster_reads.md"),
                    help="results file (a section is appended)")
    return ap.parse_args()


def say(text: str) -> None:
    print(f"[bench_cluster_map] {text}", flush=True)


def reads_of(urls: list[str]) -> list[dict[str, float]]:
    """Each router's key lookups so far, by path (local, remote)."""
    out = []
    for url in urls:
        got = {"local": 0.0, "remote": 0.0}
        text = httpx.get(f"{url}/metrics", timeout=10).text
        for f in text_string_to_metric_families(text):
            for sample in f.samples:
                if sample.name == READS and sample.labels.get("path") in got:
                    got[sample.labels["path"]] = sample.value
        out.append(got)
    return out


def moved(before: list[dict[str, float]], after: list[dict[str, float]]) -> dict[str, float]:
    return {p: sum(a[p] - b[p] for a, b in zip(after, before, strict=True))
            for p in ("local", "remote")}


def main() -> None:
    args = parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_cluster_map builds hosts as network namespaces: run it as root")
    tmp = Path(tempfile.mkdtemp(prefix="qstate-cluster-map-"))
    token = secrets.token_urlsafe(32)
    certs = tmp / "certs"
    subprocess.run(qstate_command("certs", "--out", str(certs), "--host", SERVER_NAME),
                   check=True, capture_output=True, timeout=60)
    # this process loads the data as a job's driver would: the shards' TLS and token
    os.environ.update({"QSTATE_CLUSTER_TOKEN": token, "QSTATE_TLS_CA": str(certs / "ca.pem"),
                       "QSTATE_TLS_SERVER_NAME": SERVER_NAME})
    settings.cache_clear()  # read again, with them
    storage = Storage(str(tmp / "storage"))
    net = Network(prefix="qsm", subnet="10.231.9").open()
    children: list[Child] = []
    try:
        hosts: list[Host] = [net.add(f"node-{i}") for i in range(1, HOSTS + 1)]

        def env(h: Host, **extra: str) -> dict[str, str]:
            return {**os.environ, "QSTATE_HOME": str(tmp / h.name), "QSTATE_NODE": h.name,
                    "QSTATE_STORAGE": storage.uri, "QSTATE_METRICS_HOST": h.address,
                    **extra}

        shards = []
        for i, h in enumerate(hosts, 1):
            s = ShardProcess(f"shard-{i}", h.command(*qstate_command(
                "shard", "--id", f"shard-{i}", "--host", h.address, "--port", str(SHARD_PORT),
                "--metrics-port", str(METRICS_PORT))), tmp / "logs" / f"shard-{i}.log",
                env(h, QSTATE_TLS_CERT=str(certs / "server.pem"),
                    QSTATE_TLS_KEY=str(certs / "server-key.pem")),
                host=h.address, port=SHARD_PORT)
            shards.append(s.start_and_wait(60))
            children.append(s)
        load(storage, shards, args.keys)
        routers = []
        for i, h in enumerate(hosts, 1):
            r = RouterProcess(f"router-{i}", h.command(*qstate_command(
                "router", "--host", h.address, "--http-port", str(HTTP_PORT), "--grpc-port",
                str(GRPC_PORT))), tmp / "logs" / f"router-{i}.log",
                env(h, QSTATE_ALLOW_INSECURE="true"), host=h.address, http_port=HTTP_PORT,
                grpc_port=GRPC_PORT)
            routers.append(r.start_and_wait(60))
            children.append(r)
        urls = [r.url for r in routers]
        node_of = {s.address: i for i, s in enumerate(shards)}
        a = load_assignment(storage, SPEC.job)
        names = [f"page-{i}" for i in range(args.keys)]
        by_node: list[list[str]] = [[] for _ in hosts]
        for k in names:
            owner = a.owner(SPEC.operator, partition_of(k, P))
            assert owner is not None, f"partition of {k} has no owner"
            by_node[node_of[owner]].append(k)
        # warm-up: every router's secondaries open, channels made
        for url in urls:
            with Client(url) as c:
                for k in random.Random(3).sample(names, 200):
                    c.get(SPEC.job, SPEC.operator, "views", k)
        sample = random.Random(55).sample(names, args.reads)
        shares: dict[str, dict[str, float]] = {}
        for direct in (True, False):
            before = reads_of(urls)
            with Client(urls[0], direct=direct) as c:
                for k in sample:
                    got = c.get(SPEC.job, SPEC.operator, "views", k)
                    assert got.latest is not None and got.latest.value == int(k[5:]), k
            name = "direct" if direct else "plain"
            shares[name] = moved(before, reads_of(urls))
            say(f"{name} client: {shares[name]}")
        pids = tuple(p.pid for p in children)
        curve: list[tuple[int, Result, dict[str, float]]] = []
        for n in range(1, HOSTS + 1):
            # reader i gets its own host's keys; keys of hosts without a reader go round
            keys_of: list[list[str]] = [list(by_node[i]) for i in range(n)]
            for j, k in enumerate(k for i in range(n, HOSTS) for k in by_node[i]):
                keys_of[j % n].append(k)
            files = []
            for i in range(n):
                f = tmp / f"keys-{n}-{i}.txt"
                f.write_text("\n".join(keys_of[i]) + "\n")
                files.append(f)
            before, c0, t0 = reads_of(urls), cpu_seconds(*pids), time.perf_counter()
            with ThreadPoolExecutor(n) as pool:  # one wrk per reader, at once
                runs = [pool.submit(run_wrk, urls[i], get_script(STATE_PATH, file_pick(files[i])),
                                    args.duration, tmp, max(1, args.connections // n))
                        for i in range(n)]
                ran = [r.result() for r in runs]
            took = time.perf_counter() - t0
            cpu = cpu_seconds(*pids) - c0
            m = moved(before, reads_of(urls))
            total = {"rps": sum(r["rps"] for r in ran),
                     "requests": sum(r["requests"] for r in ran),
                     "non2xx": sum(r["non2xx"] for r in ran),
                     "errors": sum(r["errors"] for r in ran),
                     "cpu_s": cpu, "wall_s": took}
            curve.append((n, total, m))
            say(f"{n} reader(s): {total['rps']:,.0f} GET/s, {m}, "
                f"{cpu / max(total['requests'], 1) * 1e6:.1f} µs CPU a GET")
        write(args, shares, curve, [len(b) for b in by_node])
    finally:
        net.close()
        for ch in children:
            ch.stop()


def write(args: argparse.Namespace, shares: dict[str, dict[str, float]],
          curve: list[tuple[int, Result, dict[str, float]]], per_node: list[int]) -> None:
    def pct(m: dict[str, float], path: str) -> str:
        total = m["local"] + m["remote"]
        return f"{100 * m[path] / total:.1f}%" if total else "-"

    lines = [
        f"\n## Clients that follow the cluster map, {HOSTS} netns hosts "
        f"({time.strftime('%Y-%m-%d %H:%M')})\n",
        f"```\nsudo {results.command('loadtest.bench_cluster_map')}\n```\n",
        f"{HOSTS} hosts (network namespaces on this 2-core machine), each a shard server and "
        f"its node's router; {args.keys:,} keys, P={P}, keys per host {per_node}. TLS and the "
        "cluster token between routers and shards.\n",
        f"| {args.reads:,} reads one by one at host 1's router | answered by the key's own "
        "host's router | forwarded over a hop |",
        "|---|---|---|",
    ]
    for name, m in shares.items():
        lines.append(f"| `Client({'direct=True' if name == 'direct' else ''})` | "
                     f"{pct(m, 'local')} ({m['local']:.0f}) | {pct(m, 'remote')} "
                     f"({m['remote']:.0f}) |")
    lines += ["", f"Point GETs (wrk, closed loop: {args.connections} connections in all, "
              f"{args.duration} s), each reader given the keys a smart client sends it:", "",
              "| readers | GET/s | forwarded | CPU a GET, every server process | non-2xx |",
              "|---|---|---|---|---|"]
    for n, r, m in curve:
        lines.append(f"| {n} | {r['rps']:,.0f} | {pct(m, 'remote')} | "
                     f"{r['cpu_s'] / max(r['requests'], 1) * 1e6:.1f} µs | "
                     f"{r['non2xx'] + r['errors']:.0f} |")
    lines.append("\nOn one 2-core machine every host shares the same cores: the rows show what "
                 "a read costs as readers are added, not how a cluster of real hosts scales.\n")
    results.append(args.out, "\n".join(lines))


if __name__ == "__main__":
    main()
