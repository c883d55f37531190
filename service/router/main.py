"""A router process: HTTP (uvicorn) and gRPC (grpc.aio) in one event loop."""

from __future__ import annotations

import asyncio
import logging
import signal
import tempfile
from pathlib import Path

import grpc
import uvicorn

from proto import qstate_pb2_grpc as pb_grpc
from proto import shard_pb2 as pb
from service.router.coalesce import ShardCaller
from service.router.fastpath import with_fast_get
from service.router.grpc_api import QueryableStateService
from service.router.http import create_app
from service.router.local import LocalReader
from service.router.query import QueryService
from service.router.routing import RoutingTable
from service.storage import Storage

log = logging.getLogger("qstate.router")


async def _watch_local_shards(routing: RoutingTable, caller: ShardCaller, local: LocalReader,
                              every_s: float) -> None:
    """Which co-located partitions may be read in-process: alive, owned and not restoring."""
    while True:
        local.set_servers(routing.servers)
        for address in list(local.servers):
            try:
                d = await caller.stub(address).Describe(pb.DescribeRequest(),
                                                        timeout=every_s * 2)
                local.set_ready(address, {(p.job, p.operator, p.partition)
                                          for p in d.partitions if not p.restoring})
            except grpc.aio.AioRpcError:
                local.set_ready(address, set())
        await asyncio.sleep(every_s)


async def serve(host: str, http_port: int, grpc_port: int, storage_uri: str,
                shard_timeout_s: float = 1.0, retry_after_s: float = 1.0,
                local_reads: bool = True, scratch: Path | None = None) -> None:
    routing = RoutingTable(Storage(storage_uri))
    await routing.start()
    caller = ShardCaller(timeout_s=shard_timeout_s)
    local = LocalReader(scratch or Path(tempfile.mkdtemp(prefix="qstate-router-")))
    query = QueryService(routing, caller, retry_after_s, local if local_reads else None)
    watch = asyncio.create_task(_watch_local_shards(routing, caller, local, 0.25)) \
        if local_reads else None

    grpc_server = grpc.aio.server()
    pb_grpc.add_QueryableStateServicer_to_server(QueryableStateService(query), grpc_server)
    grpc_server.add_insecure_port(f"{host}:{grpc_port}")
    await grpc_server.start()

    app = with_fast_get(create_app(query, ready=lambda: bool(routing.specs)), query)
    config = uvicorn.Config(app, host=host, port=http_port, log_level="warning",
                            access_log=False, http="httptools", lifespan="off",
                            timeout_graceful_shutdown=2)
    http = uvicorn.Server(config)
    # uvicorn stops on SIGINT/SIGTERM itself and re-raises the signal when done, which then
    # reaches the handlers below: gRPC and the routing table stop after HTTP has drained.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    task = asyncio.create_task(http.serve())
    print(f"qstate router ready http=http://{host}:{http_port} grpc={host}:{grpc_port}",
          flush=True)
    await stop.wait()
    http.should_exit = True
    await task
    await grpc_server.stop(grace=1)
    if watch is not None:
        watch.cancel()
    await routing.stop()
    await caller.close()
    local.close()


def run(host: str, http_port: int, grpc_port: int, storage_uri: str,
        shard_timeout_s: float = 1.0, retry_after_s: float = 1.0,
        local_reads: bool = True) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    main = serve(host, http_port, grpc_port, storage_uri, shard_timeout_s, retry_after_s,
                 local_reads)
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)
