"""/metrics, /healthz and /readyz for processes whose main API is not HTTP (shards, jobs)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

__all__ = ["bound_port", "probe_app", "serve_probe"]


def probe_app(ready: Callable[[], bool], info: Callable[[], dict]) -> Starlette:
    async def healthz(_: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", **info()})

    async def readyz(_: Request) -> JSONResponse:
        ok = ready()
        return JSONResponse({"ready": ok, **info()}, status_code=200 if ok else 503)

    async def metrics(_: Request) -> Response:
        # collectors may scan disk (a shard's RocksDB sizes): not on the loop serving requests
        body = await asyncio.to_thread(generate_latest)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    # a Route, not a Mount: /metrics answers itself instead of redirecting to /metrics/
    return Starlette(routes=[
        Route("/healthz", healthz), Route("/readyz", readyz), Route("/metrics", metrics),
    ])


async def serve_probe(app: Starlette, host: str, port: int) -> tuple[uvicorn.Server, asyncio.Task]:
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                            lifespan="off")
    server = uvicorn.Server(config)
    # uvicorn captures SIGINT/SIGTERM while it serves and re-raises them on exit, so the
    # process's own asyncio signal handlers still run after the probe has shut down.
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    return server, task


def bound_port(server: uvicorn.Server) -> int:
    return int(server.servers[0].sockets[0].getsockname()[1])
