"""A shard server process: RocksDB partitions + internal gRPC + /metrics."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from dataclasses import dataclass
from pathlib import Path

import grpc

from proto import shard_pb2_grpc as pb_grpc
from service.core import security
from service.core.assignment import (
    ServerInfo,
    default_server_id,
    now_ms,
    register_server,
    unregister_server,
)
from service.core.config import Settings
from service.core.probe import bound_port, probe_app, serve_probe
from service.core.shard_client import CHANNEL_OPTIONS
from service.core.storage import Storage
from service.shard import metrics
from service.shard.partitions import Partitions
from service.shard.server import ShardService

__all__ = ["ShardOptions", "run", "serve"]

log = logging.getLogger(__name__)


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

    @property
    def id(self) -> str:
        return self.server_id or default_server_id(self.host, self.port)


async def _follow_assignments(partitions: Partitions, every_s: float) -> None:
    while True:
        try:
            await asyncio.to_thread(partitions.sync)
        except Exception as exc:  # storage hiccup: keep serving what we have
            log.warning("assignment sync failed: %s", exc)
        await asyncio.sleep(every_s)


async def serve(o: ShardOptions) -> None:
    cfg = o.settings
    security.check_exposure(o.host, cfg, "the shard API")
    storage = Storage(o.storage_uri)
    server_id = o.id
    partitions = Partitions(o.data_dir / server_id, storage, server_id, cfg.snapshot_every,
                            cfg.snapshots_kept, cfg.commit_workers, cfg.restore_timeout_s,
                            cfg.restore_retry_s)
    metrics.HELD.watch(partitions.server_dir, partitions.held_now)
    server = grpc.aio.server(options=CHANNEL_OPTIONS,
                             interceptors=security.cluster_interceptors(cfg))
    service = ShardService(partitions, server_id, "", cfg.max_windows)
    pb_grpc.add_ShardServicer_to_server(service, server)
    bound = security.server_port(server, f"{o.host}:{o.port}", cfg)
    address = service.address = o.advertise or f"{o.host}:{bound}"
    await server.start()
    probe, probe_task = await serve_probe(
        probe_app(lambda: True, lambda: {"server_id": server_id, "address": address}),
        o.host, o.metrics_port)
    info = ServerInfo(server_id, address, f"{o.host}:{bound_port(probe)}", os.getpid(),
                      now_ms(), socket.gethostname(), str((o.data_dir / server_id).resolve()))
    register_server(storage, info)
    follow = asyncio.create_task(_follow_assignments(partitions, cfg.assignment_poll_s))
    log.warning("shard %s serving on %s (metrics on %s)", server_id, address, info.metrics)
    print(f"qstate shard {server_id} ready grpc={address} metrics={info.metrics}", flush=True)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    follow.cancel()
    unregister_server(storage, server_id)
    await server.stop(grace=2)
    probe.should_exit = True
    await probe_task
    partitions.close()


def run(o: ShardOptions) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(serve(o))
