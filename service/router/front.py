"""The router's public HTTP port, held by the read engine's native front
(docs/architecture.md §5, native front): the point GET and ``:batchGet`` of partitions on
this host are answered in Rust, without the GIL; every other request is handed to the
FastAPI app, served by uvicorn on a private Unix socket in a 0700 folder, and streamed back.

What Python keeps doing here: it starts the app's server before the front opens the port; it
adds the engine's counts to the router's Prometheus series at each scrape of /metrics and
every ``SYNC_S`` (for the other ``--workers``' scrapes); and it stops in order: the front
stops taking connections and lets the requests under way finish (the watches have ended
first), then the app's server goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvicorn

from qstate._engine import Engine
from qstate.core.config import Settings
from qstate.router.metrics import add_engine_counts

__all__ = ["NativeFront"]

SYNC_S = 0.5  # how often the engine's counts reach /metrics
GRACE_S = 2.0  # requests under way when the router stops (uvicorn's graceful shutdown, too)


class _AppServer(uvicorn.Server):
    """uvicorn without its signal handlers: the router's own stop them, in order."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class NativeFront:
    def __init__(self, engine: Engine, app: Any, cfg: Settings, threads: int) -> None:
        self.engine = engine
        self.app = app
        self.cfg = cfg
        self.threads = threads
        self.folder = Path(tempfile.mkdtemp(prefix="qstate-app-"))  # 0700: only this user
        self.socket = self.folder / "app.sock"
        self._server: _AppServer | None = None
        self._serving: asyncio.Task[None] | None = None
        self._sync: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int, fd: int | None = None) -> int:
        """The app's server on its socket, then the public port (``fd``: a listening socket
        the parent of ``--workers`` bound): the port bound."""
        config = uvicorn.Config(self._counted(self.app), uds=str(self.socket), log_level="warning",
                                access_log=False, http="httptools", lifespan="off",
                                timeout_graceful_shutdown=int(GRACE_S))
        self._server = _AppServer(config)
        self._serving = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._serving.done():
                await self._serving  # its failure, said
            await asyncio.sleep(0.01)
        cfg = self.cfg
        bound = await asyncio.to_thread(
            self.engine.serve, str(self.socket), self.threads, fd, host, port,
            cfg.tls_cert or None, cfg.tls_key or None)
        self._sync = asyncio.create_task(self._sync_loop())
        return bound

    def _counted(self, app: Any) -> Any:
        """``app``, whose /metrics first takes what the engine counted (an answer's series
        are then up to date when it is scraped right after)."""
        async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] == "http" and scope["path"] == "/metrics":
                add_engine_counts(self.engine.take_metrics())
            await app(scope, receive, send)

        return asgi

    async def _sync_loop(self) -> None:
        while True:
            await asyncio.sleep(SYNC_S)
            add_engine_counts(self.engine.take_metrics())

    async def stop(self) -> None:
        """No new connection; the requests under way finish (at most ``GRACE_S``), the app's
        server stops, the last counts are added."""
        await asyncio.to_thread(self.engine.stop, GRACE_S)
        if self._server is not None and self._serving is not None:
            self._server.should_exit = True
            await self._serving
        if self._sync is not None:
            self._sync.cancel()
        add_engine_counts(self.engine.take_metrics())
        shutil.rmtree(self.folder, ignore_errors=True)
