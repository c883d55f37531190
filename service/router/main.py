"""A router process: HTTP (uvicorn) and gRPC (grpc.aio) in one event loop."""

from __future__ import annotations

import asyncio
import logging
import signal

import grpc
import uvicorn

from proto import qstate_pb2_grpc as pb_grpc
from service.router.coalesce import ShardCaller
from service.router.fastpath import with_fast_get
from service.router.grpc_api import QueryableStateService
from service.router.http import create_app
from service.router.query import QueryService
from service.router.routing import RoutingTable
from service.storage import Storage

log = logging.getLogger("qstate.router")


async def serve(host: str, http_port: int, grpc_port: int, storage_uri: str,
                shard_timeout_s: float = 1.0, retry_after_s: float = 1.0) -> None:
    routing = RoutingTable(Storage(storage_uri))
    await routing.start()
    caller = ShardCaller(timeout_s=shard_timeout_s)
    query = QueryService(routing, caller, retry_after_s)

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
    await routing.stop()
    await caller.close()


def run(host: str, http_port: int, grpc_port: int, storage_uri: str,
        shard_timeout_s: float = 1.0, retry_after_s: float = 1.0) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    try:
        import uvloop

        uvloop.run(serve(host, http_port, grpc_port, storage_uri, shard_timeout_s,
                         retry_after_s))
    except ImportError:
        asyncio.run(serve(host, http_port, grpc_port, storage_uri, shard_timeout_s,
                          retry_after_s))
