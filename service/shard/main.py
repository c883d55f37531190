"""A shard server process: RocksDB partitions + internal gRPC + /metrics.

SIGTERM drains it (``drain_timeout_s``): it says so in its Describe answers, the
coordinator moves its partitions to other servers make-before-break, and it stops once it
holds nothing; SIGINT (Ctrl-C) or a second signal stops it at once."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from qstate.core.config import Settings, node_name
from qstate.core.process.probe import bound_port, probe_app, serve_probe
from qstate.core.records.assignment import (
    ServerInfo,
    default_server_id,
    now_ms,
    register_server,
    unregister_server,
)
from qstate.core.records.storage import Storage
from qstate.core.transport import security
from qstate.core.transport.grpc_health import Health
from qstate.core.transport.shard_client import CHANNEL_OPTIONS
from qstate.proto import shard_pb2 as pb
from qstate.proto import shard_pb2_grpc as pb_grpc
from qstate.shard import metrics
from qstate.shard.memory import MemoryBudget, limit_malloc_arenas
from qstate.shard.partitions import Partitions
from qstate.shard.reader import ShardReader
from qstate.shard.savepoints import SavepointReads
from qstate.shard.server import ShardService

__all__ = ["ShardOptions", "run", "serve"]

log = logging.getLogger(__name__)

# How long a thread holding the GIL keeps it while another waits (Python's default: 5 ms).
# A large read on the read thread and a commit on the loop take turns at this pace: at 5 ms
# a commit during a storm of the largest reads took 25x its quiet time, at 0.1 ms 2.3x, with
# the reads as fast and ingest unchanged (tests/service/shard/test_read_storm.py;
# docs/architecture.md §5).
SWITCH_INTERVAL_S = 0.0001


@dataclass(frozen=True)
class ShardOptions:
    """What a shard server process needs, from ``Settings`` (and the CLI's flags)."""

    host: str
    port: int
    data_dir: Path
    storage_uri: str
    server_id: str
    metrics_port: int
    advertise: str
    settings: Settings
    reader_port: int = 0  # the reader's (QSTATE_SHARD_READER_PORT; 0: any free port)

    @property
    def id(self) -> str:
        return self.server_id or default_server_id(self.host, self.port)


async def _follow_assignments(partitions: Partitions, every_s: float) -> None:
    """Adopt each new assignment; bring the partitions this server follows up to date."""
    while True:
        try:
            await asyncio.to_thread(partitions.sync)
            await asyncio.to_thread(partitions.follow)
        except Exception as exc:  # storage hiccup: keep serving what we have
            log.warning("assignment sync failed: %s", exc)
        await asyncio.sleep(every_s)


async def _drain(service: ShardService, partitions: Partitions, cfg: Settings,
                 started: asyncio.Event, stop: asyncio.Event) -> None:
    """Once ``started``: serve until the coordinator has moved every partition away (and
    routers have had time to read that), no coordinator is there to move them, or
    ``drain_timeout_s``; then ``stop``."""
    await started.wait()
    service.draining = True
    log.warning("draining: serving until this server's partitions have moved (at most %gs)",
                cfg.drain_timeout_s)
    t0 = time.monotonic()
    empty_since: float | None = None
    while not stop.is_set():
        now = time.monotonic()
        if partitions.held_now():
            empty_since = None
        elif empty_since is None:
            empty_since = now
        if empty_since is not None and now - empty_since >= 2 * cfg.routing_refresh_s:
            why = "every partition moved to other servers"
        elif now - service.coordinator_at > 10 * cfg.heartbeat_s:
            why = "no coordinator is moving partitions (the job is down)"
        elif now - t0 > cfg.drain_timeout_s:
            why = f"drain_timeout_s ({cfg.drain_timeout_s:g}s) is over"
        else:
            await asyncio.sleep(0.2)
            continue
        log.warning("drained in %.1fs: %s", now - t0, why)
        break
    stop.set()


async def serve(o: ShardOptions) -> None:
    cfg = security.shard_settings(o.settings, o.host)
    storage = Storage(o.storage_uri)
    server_id = o.id
    partitions = Partitions(o.data_dir / server_id, storage, server_id, cfg.snapshot_every,
                            cfg.snapshots_kept, cfg.commit_workers, cfg.restore_timeout_s,
                            cfg.restore_retry_s, cfg.rank_index,
                            MemoryBudget.of(cfg.shard_memory_mb))
    metrics.HELD.watch(partitions.server_dir, partitions.held_now)
    metrics.watch_memory(partitions.memory)
    server = grpc.aio.server(options=[*CHANNEL_OPTIONS, security.NO_REUSEPORT],
                             interceptors=security.cluster_interceptors(cfg))
    savepoints = SavepointReads(storage, partitions.server_dir, partitions.spec,
                                partitions.memory)
    service = ShardService(partitions, server_id, "", cfg.max_windows, cfg.max_top_scan_keys,
                           savepoints)
    pb_grpc.add_ShardServicer_to_server(service, server)

    def ready() -> bool:  # no partition restoring: gRPC health and /readyz alike
        return all(h.ready.is_set() for _, h in partitions.held())

    health = Health(server, [pb.DESCRIPTOR.services_by_name["Shard"].full_name])
    bound = security.server_port(server, f"{o.host}:{o.port}", cfg)
    address = service.address = o.advertise or f"{o.host}:{bound}"
    await server.start()
    following = asyncio.create_task(health.follow(ready))
    probe, probe_task = await serve_probe(
        probe_app(ready, lambda: {"server_id": server_id, "address": address}),
        o.host, o.metrics_port)
    reader, reader_address = None, ""
    if cfg.shard_reader:  # other hosts' routers read here natively (docs/architecture.md §5)
        reader = ShardReader(partitions, cfg)
        partitions.on_change = reader.changed
        reader_port = reader.serve(address, o.host, o.reader_port, cfg,
                                   cfg.cluster_token or None)
        reader_address = f"{address.rsplit(':', 1)[0]}:{reader_port}"
        metrics.READER.watch(reader.counts)
    info = ServerInfo(server_id, address, f"{o.host}:{bound_port(probe)}", os.getpid(),
                      now_ms(), node_name(cfg), str((o.data_dir / server_id).resolve()),
                      reader_address)
    register_server(storage, info)
    follow = asyncio.create_task(_follow_assignments(partitions, cfg.assignment_poll_s))
    log.warning("shard %s serving on %s (metrics on %s)", server_id, address, info.metrics)
    print(f"qstate shard {server_id} ready grpc={address} metrics={info.metrics}"
          + (f" reader={reader_address}" if reader_address else ""), flush=True)

    stop, draining = asyncio.Event(), asyncio.Event()

    def terminate() -> None:
        (stop if draining.is_set() or not cfg.drain_timeout_s else draining).set()

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, terminate)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    drain = asyncio.create_task(_drain(service, partitions, cfg, draining, stop))
    await stop.wait()
    log.warning("shard %s stopping", server_id)
    drain.cancel()
    follow.cancel()
    following.cancel()
    await health.stop()
    unregister_server(storage, server_id)
    await server.stop(grace=2)
    probe.should_exit = True
    await probe_task
    if reader is not None:
        reader.close()
    savepoints.close()
    partitions.close()


def run(o: ShardOptions) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    limit_malloc_arenas()  # before any thread of ours starts (qstate.shard.memory)
    asyncio.run(serve(o))
