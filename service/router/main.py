"""A router process: its read engine (whose native front holds the HTTP port, the FastAPI
app behind it on uvicorn) and gRPC (grpc.aio), in one event loop (docs/architecture.md §5)."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

import grpc
import uvicorn

from qstate.core.config import Settings, node_name
from qstate.core.process import faults
from qstate.core.records.assignment import now_ms
from qstate.core.records.routers import RouterInfo, register_router, router_id, unregister_router
from qstate.core.records.storage import Storage
from qstate.core.transport import security
from qstate.core.transport.grpc_health import Health
from qstate.core.transport.tokens import WatchedTokens
from qstate.proto import qstate_pb2 as qpb
from qstate.router.auth import GrpcAuth, with_auth
from qstate.router.describer import Describer
from qstate.router.engine import ENGINE_THREADS, EngineLink
from qstate.router.front import NativeFront
from qstate.router.grpc_api import QueryableStateService, serve_api
from qstate.router.grpc_port import NativeGrpc
from qstate.router.http import create_asgi
from qstate.router.limits import with_limits
from qstate.router.local import LocalReader
from qstate.router.query import QueryService
from qstate.router.routing import RoutingTable
from qstate.router.shards import ShardStubs
from qstate.router.watch import WatchHub

__all__ = ["RouterOptions", "run", "serve"]

log = logging.getLogger(__name__)

# gRPC core cancels every call of a connection (GOAWAY) once more than 1,000 requests wait
# for the server to pick them up: a client bursting 2,000 concurrent Gets on one channel
# lost some of them. Waiting requests cost a few hundred bytes each; the coalescer wants
# bursts.
SERVER_OPTIONS = [("grpc.server.max_pending_requests", 20_000),
                  ("grpc.server.max_pending_requests_hard_limit", 20_000)]


@dataclass(frozen=True)
class RouterOptions:
    host: str
    http_port: int
    grpc_port: int
    storage_uri: str
    local_reads: bool
    settings: Settings
    # one of ``qstate router --workers``: the HTTP socket its parent listens on, and the gRPC
    # port bound with SO_REUSEPORT beside the other workers (qstate.embedded.router_workers)
    http_fd: int | None = None


async def _watch_local_shards(routing: RoutingTable, describer: Describer, local: LocalReader,
                              every_s: float) -> None:
    """Which co-located partitions may be read in-process: alive, owned and not restoring
    (the router's Describe poller, at most ``every_s`` old)."""
    while True:
        local.set_servers(routing.servers)
        replies = await describer.describe(local.servers, every_s)
        for address, held in replies.items():
            local.set_ready(address, set() if held is None else
                            {pid for pid, p in held.items() if not p.restoring})
        await asyncio.sleep(every_s)


def registration(o: RouterOptions) -> RouterInfo:
    """What this router registers (``qstate.core.records.routers``): where clients reach its
    HTTP and gRPC ports, and the node whose partitions it reads in-process."""
    cfg = o.settings
    node = node_name(cfg)
    host = cfg.router_advertise or (node if o.host in ("0.0.0.0", "::", "") else o.host)
    host = f"[{host}]" if ":" in host else host
    scheme = "https" if cfg.tls_cert else "http"
    return RouterInfo(router_id(node, o.http_port), node, f"{scheme}://{host}:{o.http_port}",
                      f"{host}:{o.grpc_port}", os.getpid(), now_ms())


async def serve(o: RouterOptions, scratch: Path | None = None) -> None:
    cfg = o.settings
    host = o.host
    security.check_exposure(host, cfg, "the router", tokens=True)
    faults.parse(cfg.fault)  # a typo fails here, not when the fault point is reached
    book = WatchedTokens(cfg.tokens_file) if cfg.tokens_file else None
    routing = RoutingTable(Storage(o.storage_uri), cfg.routing_refresh_s,
                           cfg.routing_min_interval_s)
    routing.disclose_jobs = book is None
    # the read engine: the read core every front calls, the partitions it reads on this host,
    # and the native front
    link = EngineLink(scratch or Path(tempfile.mkdtemp(prefix="qstate-router-")), cfg)
    engine = link.engine
    await routing.start()
    link.follow(routing)
    if book is not None:
        engine.set_tokens(book.book().entries())  # before the ports open
    stubs = ShardStubs(timeout_s=cfg.shard_timeout_s, cfg=cfg)
    local = LocalReader(engine, node_name(cfg))
    query = QueryService(routing, stubs, engine, cfg.max_batch_keys, cfg.max_windows,
                         cfg.min_batch_wait_s, cfg.max_top_n, cfg.retry_after_s)
    hub = WatchHub.of(query, cfg)
    watch = asyncio.create_task(_watch_local_shards(routing, query.describer, local,
                                                    cfg.local_ready_poll_s)) \
        if o.local_reads else None

    # beyond max_concurrent_requests in flight, gRPC itself answers RESOURCE_EXHAUSTED at once
    reuse = ("grpc.so_reuseport", 1) if o.http_fd is not None else security.NO_REUSEPORT
    grpc_server = grpc.aio.server(
        options=[*SERVER_OPTIONS, ("grpc.max_receive_message_length", cfg.max_body_bytes),
                 reuse],
        maximum_concurrent_rpcs=cfg.max_concurrent_requests)
    serve_api(QueryableStateService(query, GrpcAuth(engine), hub), grpc_server, engine)

    def ready() -> bool:  # an assignment to route by: /readyz and gRPC health alike
        return bool(routing.specs) and (not cfg.native_front or engine.ready())

    health = Health(grpc_server, [qpb.DESCRIPTOR.services_by_name["QueryableState"].full_name])
    # the engine holds the public gRPC port too (Get and MultiGet in Rust), the Python server
    # the rest behind it on a private socket (qstate.router.grpc_port)
    native_grpc = NativeGrpc(engine, grpc_server) if cfg.native_front else None
    if native_grpc is None:
        security.server_port(grpc_server, f"{host}:{o.grpc_port}", cfg)
    await grpc_server.start()
    if native_grpc is not None:
        native_grpc.start(host, o.grpc_port, cfg, reuse_port=o.http_fd is not None)
    following = asyncio.create_task(health.follow(ready))

    app = link.counted(create_asgi(query, engine, ready=ready, hub=hub))
    counting = asyncio.create_task(link.sync_counts())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    front: NativeFront | None = None
    tokens: asyncio.Task[None] | None = None
    if cfg.native_front:
        # the engine holds the port, the tokens and the request budget for both paths; the
        # app behind it takes the principal the front let a request in with
        front = NativeFront(engine, with_auth(app, engine, forwarded=True), cfg,
                            ENGINE_THREADS)
        if book is not None:
            tokens = asyncio.create_task(link.push_tokens(book))
        await front.start(host, o.http_port, o.http_fd)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    else:
        # auth outermost: a request without a valid token is refused before it may hold one
        # of the limited slots (a client could otherwise fill them with bodies it never sends)
        app = with_auth(with_limits(app, engine, cfg.max_body_bytes,
                                    cfg.max_concurrent_requests), engine)
        config = uvicorn.Config(app, host=host, port=o.http_port, log_level="warning",
                                access_log=False, http="httptools", lifespan="off",
                                timeout_graceful_shutdown=2,
                                ssl_certfile=cfg.tls_cert or None, ssl_keyfile=cfg.tls_key or None)
        http = uvicorn.Server(config)
        # uvicorn stops on SIGINT/SIGTERM itself and re-raises the signal when done, which
        # then reaches the handlers below: gRPC and the routing table stop after HTTP drained
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        sockets = None if o.http_fd is None else [socket.socket(fileno=o.http_fd)]
        serving = asyncio.create_task(http.serve(sockets=sockets))
    # what start-up built lives as long as the process: out of the collector's sight, so a
    # full collection does not walk it while requests wait (docs/architecture.md §8)
    gc.freeze()
    me = registration(o)
    try:
        await asyncio.to_thread(register_router, routing.storage, me)
    except Exception as exc:  # a hint for clients' maps: the router serves without it
        log.warning("could not register router %s in storage (clients' cluster maps will "
                    "not name it): %s", me.id, exc)
    scheme = "https" if cfg.tls_cert else "http"
    jobs = ",".join(sorted({j for j, _ in routing.specs})) or \
        "none yet (a job registers its operators in storage when it starts)"
    print(f"qstate router ready http={scheme}://{host}:{o.http_port} grpc={host}:{o.grpc_port}"
          f" storage={routing.storage.root} jobs={jobs}", flush=True)
    await stop.wait()
    try:
        await asyncio.to_thread(unregister_router, routing.storage, me)
    except Exception as exc:  # storage hiccup: the record is a hint (clients fall back)
        log.warning("could not unregister router %s: %s", me.id, exc)
    following.cancel()
    await health.stop()
    await hub.stop()  # open watches end: their clients resume on another router
    if front is not None:
        await front.stop()  # no new request; those under way finish
    else:
        http.should_exit = True
        await serving
    if tokens is not None:
        tokens.cancel()
    if native_grpc is not None:
        native_grpc.stop()
    await grpc_server.stop(grace=1)
    counting.cancel()
    link.take_counts()  # the last ones
    if watch is not None:
        watch.cancel()
    await routing.stop()
    await stubs.close()
    local.close()


def run(o: RouterOptions) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(o))
    else:
        uvloop.run(serve(o))
