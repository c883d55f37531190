"""The router's public HTTP port, held by the read engine's native front
(docs/architecture.md §5, native front): the point GET and ``:batchGet`` of partitions on
this host are answered in Rust, without the GIL; every other request is handed to the
FastAPI app, served by uvicorn on a private Unix socket in a 0700 folder, and streamed back.

What Python keeps doing here: it starts the app's server before the front opens the port, and
it stops in order: the front stops taking connections and lets the requests under way finish
(the watches have ended first), then the app's server goes. The engine's counts reach the
router's series through ``qstate.router.engine`` (whichever front holds the port).
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

__all__ = ["NativeFront"]

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

    async def start(self, host: str, port: int, fd: int | None = None) -> int:
        """The app's server on its socket, then the public port (``fd``: a listening socket
        the parent of ``--workers`` bound): the port bound."""
        # the scheme a client spoke to the front: X-Forwarded-Proto, which the front sets (and
        # drops from outside); only the front can reach this socket (its folder is 0700)
        config = uvicorn.Config(self.app, uds=str(self.socket), log_level="warning",
                                access_log=False, http="httptools", lifespan="off",
                                timeout_graceful_shutdown=int(GRACE_S), proxy_headers=True,
                                forwarded_allow_ips="*")
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
        return bound

    async def stop(self) -> None:
        """No new connection; the requests under way finish (at most ``GRACE_S``), the app's
        server stops."""
        await asyncio.to_thread(self.engine.stop, GRACE_S)
        if self._server is not None and self._serving is not None:
            self._server.should_exit = True
            await self._serving
        shutil.rmtree(self.folder, ignore_errors=True)
