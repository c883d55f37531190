"""A shard server process: RocksDB partitions + internal gRPC + /metrics."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from pathlib import Path

import grpc

from proto import shard_pb2_grpc as pb_grpc
from service.assignment import (
    ServerInfo,
    default_server_id,
    now_ms,
    register_server,
    unregister_server,
)
from service.http_probe import bound_port, probe_app, serve_probe
from service.shard.partitions import Partitions
from service.shard.server import ShardService
from service.storage import Storage

log = logging.getLogger("qstate.shard")


async def _follow_assignments(partitions: Partitions, every_s: float) -> None:
    while True:
        try:
            await asyncio.to_thread(partitions.sync)
        except Exception as exc:  # storage hiccup: keep serving what we have
            log.warning("assignment sync failed: %s", exc)
        await asyncio.sleep(every_s)


async def serve(host: str, port: int, data_dir: Path, storage_uri: str, server_id: str = "",
                metrics_port: int = 0, advertise: str = "", snapshot_every: int = 10,
                poll_s: float = 0.5) -> None:
    storage = Storage(storage_uri)
    server_id = server_id or default_server_id(host, port)
    partitions = Partitions(data_dir / server_id, storage, server_id, snapshot_every)
    server = grpc.aio.server(options=[
        ("grpc.max_receive_message_length", 64 << 20),
        ("grpc.max_send_message_length", 64 << 20),
    ])
    service = ShardService(partitions, server_id, "")
    pb_grpc.add_ShardServicer_to_server(service, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    address = service.address = advertise or f"{host}:{bound}"
    await server.start()
    probe, probe_task = await serve_probe(
        probe_app(lambda: True, lambda: {"server_id": server_id, "address": address}),
        host, metrics_port)
    info = ServerInfo(server_id, address, f"{host}:{bound_port(probe)}", os.getpid(), now_ms(),
                      socket.gethostname(), str((data_dir / server_id).resolve()))
    register_server(storage, info)
    follow = asyncio.create_task(_follow_assignments(partitions, poll_s))
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


def run(host: str, port: int, data_dir: Path, storage_uri: str, server_id: str = "",
        metrics_port: int = 0, advertise: str = "", snapshot_every: int = 10) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(serve(host, port, data_dir, storage_uri, server_id, metrics_port, advertise,
                      snapshot_every))
