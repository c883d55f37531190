"""A small, static deployment for router and client tests: two shard server processes, the
operator ``shop/views_1m`` committed for three batches by a coordinator, and two routers over
it, one reading co-located shards in-process and one reading them over gRPC.

Ground truth is what the fixture writes: ``views(key, batch)`` and ``avg_ms(batch)`` in the
one-minute window of each batch.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa

from qstate.control.coordinator import Coordinator
from qstate.core.address import PartitionId, partition_of
from qstate.core.records import delta as deltas
from qstate.core.records.operator import OperatorSpec, WindowSpec, save_spec
from qstate.core.records.storage import Storage
from qstate.core.transport.shard_client import ShardClients
from qstate.embedded.ports import wait_for_port
from qstate.embedded.procs import RouterProcess, ShardProcess
from qstate.jobs.runtime.commit import Committer
from tests.helpers import metric, shard_metrics_url, wait_until

P = 8
WINDOW = 60_000
BATCHES = 3
SPEC = OperatorSpec("shop", "views_1m", "page", {"views": "long", "avg_ms": "double"},
                    partitions=P, window=WindowSpec("tumbling", WINDOW))
BIG = "big-count"  # holds counts past 2**53: exact only if int64 stays exact end to end
KEYS = [f"page-{i}" for i in range(200)] + ["ünï/cødé key", "a" * 1024, BIG]
# enough keys that one shard owns more than the coalescer's 2,000 per call
MANY = [f"item-{i}" for i in range(6000)]
ROUTES = ("local", "grpc")  # how a router reads a partition
# ROUTES -> the path label its reads carry in qstate_router_shard_reads_total
READ_PATH = {"local": "local", "grpc": "remote"}
READS = "qstate_router_shard_reads_total"


def views(key: str, batch: int) -> int:
    if key == BIG:
        return 2**62 + 2 * batch + 1
    return (sum(map(ord, key)) * (batch + 1)) % 1000 + 1


def avg_ms(batch: int) -> float:
    return 0.25 * batch


def window(batch: int) -> tuple[int, int]:
    return batch * WINDOW, (batch + 1) * WINDOW


@dataclass
class Shop:
    storage: Storage
    shards: list[ShardProcess]
    coordinator: Coordinator
    routers: dict[str, RouterProcess]  # ROUTES -> router

    def owner_of(self, key: str) -> ShardProcess:
        address = self.coordinator.assignment.owner(SPEC.operator, partition_of(key, P))
        return next(s for s in self.shards if s.address == address)

    @contextmanager
    def served_by(self, route: str, at_least: int) -> Iterator[None]:
        """Assert that the block's lookups through router ``route`` took its read path (at
        least ``at_least`` keys), and none the other path: the router's own metric says."""
        url = self.routers[route].url
        before = shard_reads(url)
        yield
        after = shard_reads(url)
        mine = READ_PATH[route]
        assert after[mine] - before[mine] >= at_least, (route, before, after)
        assert {p: n for p, n in after.items() if p != mine} == {
            p: n for p, n in before.items() if p != mine}, (route, before, after)

    @contextmanager
    def paused(self, shard: ShardProcess) -> Iterator[None]:
        """``shard`` stopped (SIGSTOP: its sockets open, nothing answered) for the block."""
        os.kill(shard.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(shard.pid, signal.SIGCONT)

    @contextmanager
    def router_with(self, logs: Path, name: str, **settings: str) -> Iterator[RouterProcess]:
        """One more router over this shop's storage, run with ``settings`` (QSTATE_ names)
        on top of this process's environment; stopped on exit."""
        r = RouterProcess.make(self.storage.uri, logs, name,
                               {**os.environ, **settings}).start_and_wait()
        try:
            yield r
        finally:
            r.stop()

    def metrics_url(self, shard: ShardProcess) -> str:
        """Where this incarnation of the shard serves /metrics (a restarted one registers its
        new pid and port)."""
        return shard_metrics_url(self.storage.uri, shard)

    @contextmanager
    def shard_down(self, shard: ShardProcess) -> Iterator[str]:
        """kill -9 ``shard``; on exit restart it and wait until the world is as before (the
        local router reading it in-process again). Yields a key it owns."""
        key = next(k for k in KEYS if self.owner_of(k) is shard)
        shard.kill()
        assert not shard.alive()
        try:
            yield key
        finally:
            shard.start_and_wait()
            wait_until(lambda: _served_locally(self.routers["local"].url, key), 30,
                       f"{shard.name} back and read in-process")

    def commit(self, batch: int) -> None:
        """One more batch, for a test that watches state change (its own shop, not the
        session's: the session's tests expect ``BATCHES``)."""
        commit_batch(self.storage, self.coordinator, batch)

    def stop(self) -> None:
        for r in self.routers.values():
            r.stop()
        for s in self.shards:
            s.stop()


def commit_batch(storage: Storage, coord: Coordinator, batch: int) -> None:
    """Write batch ``batch`` of every key (the ground truth above) and commit it."""
    written = {}
    for p in range(P):
        mine = [k for k in KEYS + MANY if partition_of(k, P) == p]
        start, end = window(batch)
        t = pa.table({"key": mine, "start": [start] * len(mine), "end": [end] * len(mine),
                      "tag": pa.nulls(len(mine), pa.int64()),
                      "views": [views(k, batch) for k in mine],
                      "avg_ms": [avg_ms(batch)] * len(mine)}).cast(deltas.delta_schema(SPEC))
        deltas.write_delta(storage, PartitionId(SPEC.job, SPEC.operator, p), batch, t)
        written[p] = {0: t.num_rows}
    Committer(coord).commit(SPEC, batch, batch * WINDOW, written)


SHARD_MEMORY_MB = 64


def start_shop(tmp: Path, min_batch_wait_s: float = 0.05,
               shard_settings: dict[str, str] | None = None) -> Shop:
    """``min_batch_wait_s``: the routers' (a fuzzer asks for batches that will never come:
    each such read is a 503 after this wait); ``shard_settings``: QSTATE_ settings of the
    shard servers."""
    storage = Storage(str(tmp / "storage"))
    save_spec(storage, SPEC)
    # a memory budget other than the default: the metrics test reads it back
    shard_env = {**os.environ, "QSTATE_SHARD_MEMORY_MB": str(SHARD_MEMORY_MB),
                 **(shard_settings or {})}
    # each process is started before any is waited for: their start-up (mostly imports) runs
    # on both cores at once
    shards = [ShardProcess.make(f"shop{i}", tmp / "data", storage.uri, tmp / "logs",
                                env=shard_env) for i in range(2)]
    for s in shards:
        s.start()
    for s in shards:
        wait_for_port(s.host, s.port, 30, s.proc)
    coord = Coordinator(storage, SPEC.job, [s.address for s in shards])
    coord.register(SPEC)
    # every shard has taken up its (empty) partitions before batch 0: a Commit that found one
    # still restoring would be retried and the restore could replay it from its manifest,
    # which is correct but not the one-commit-per-batch the metrics tests count
    plan = coord.assignment.partitions_of(SPEC.operator)
    wait_until(lambda: all(_ready(s.address) == set(plan.get(s.address, [])) for s in shards),
               30, "both shards serving their partitions")
    # the routers start up while the batches commit (they follow the routing table as it is)
    env = {**os.environ, "QSTATE_MIN_BATCH_WAIT_S": str(min_batch_wait_s)}
    routers = {
        "local": RouterProcess.make(storage.uri, tmp / "logs", "shop-local", env),
        "grpc": RouterProcess.make(storage.uri, tmp / "logs", "shop-grpc", env,
                                   "--no-local-reads"),
    }
    for r in routers.values():
        r.start()
    for batch in range(BATCHES):
        commit_batch(storage, coord, batch)
    # Nothing more to commit: stop the heartbeats, so a test that kills a shard on purpose
    # sees its partitions stay where they are (no lease to race).
    coord.stop()
    for r in routers.values():
        wait_for_port(r.host, r.http_port, 30, r.proc)
        wait_for_port(r.host, r.grpc_port, 30, r.proc)
    shop = Shop(storage, shards, coord, routers)
    # the local router reads in-process once it has seen each shard report its partitions
    # ready; until then it asks over gRPC (correct, but not the path under test)
    probe = [next(k for k in KEYS if shop.owner_of(k) is s) for s in shards]  # one per shard
    wait_until(lambda: all(_served_locally(routers["local"].url, k) for k in probe), 30,
               "the local router reading both shards in-process")
    return shop


@contextmanager
def own_shop(tmp: Path, min_batch_wait_s: float = 0.05,
             shard_settings: dict[str, str] | None = None) -> Iterator[Shop]:
    """A shop of a module's own, for tests that commit batches the session's shop must not
    see; stopped on exit."""
    s = start_shop(tmp, min_batch_wait_s, shard_settings)
    try:
        yield s
    finally:
        s.stop()


def shard_reads(url: str) -> dict[str, float]:
    """A router's key lookups so far, by read path."""
    return {path: metric(url, READS, path=path) for path in READ_PATH.values()}


def held_until_commit(shop: Shop, batch: int,
                      asks: Sequence[tuple[str, int, Callable[[], Any]]]) -> list[Any]:
    """Each ask (a route; the reads one try of it makes: its keys, or a top-N's partitions;
    a request with ``min_batch=batch``) is sent at once, one a router, and shown to wait by
    an event, not by racing a thread's start: its router reads those again while it has no
    answer (a partition read below its min_batch is read again every 50 ms:
    docs/architecture.md §5, counted in qstate_router_shard_reads_total). Only then is
    ``batch`` committed. The answers, in order: the callers check each is as of ``batch`` or
    later, as only a read that waited for the commit can be."""
    routes = [route for route, _, _ in asks]
    assert len(set(routes)) == len(routes), "one ask a router: the reads counted are its own"

    def reads(route: str) -> float:
        return sum(shard_reads(shop.routers[route].url).values())

    before = {route: reads(route) for route in routes}
    with ThreadPoolExecutor(len(asks)) as pool:
        futures = [pool.submit(ask) for _, _, ask in asks]

        def all_read_again() -> bool:
            for f in futures:
                if f.done():
                    raise AssertionError(f"answered before batch {batch} was committed: "
                                         f"{f.result()!r}"[:500])
            return all(reads(route) >= before[route] + 2 * n for route, n, _ in asks)

        wait_until(all_read_again, 30, f"each router reading its keys again for batch {batch}")
        shop.commit(batch)
        return [f.result(60) for f in futures]


def _ready(address: str) -> set[int]:
    """The partitions of the shop's operator a shard serves (held, not restoring)."""
    clients = ShardClients()
    try:
        d = clients.describe(address, timeout=5)
    finally:
        clients.close()
    return {p.partition for p in d.partitions if p.operator == SPEC.operator and not p.restoring}


def _served_locally(url: str, key: str) -> bool:
    before = metric(url, READS, path="local")
    httpx.get(f"{url}/v1/state/{SPEC.job}/{SPEC.operator}/views/{key}", timeout=5)
    return metric(url, READS, path="local") > before
