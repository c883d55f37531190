"""The router's public gRPC port, held by the read engine (docs/architecture.md §5, native
gRPC reads): ``Get`` and ``MultiGet`` are answered in Rust on the engine's threads; every
other call (``Watch``, ``Top``, the admin methods, health, reflection) is passed to the
Python server (grpc.aio, ``qstate.router.grpc_api``), which listens on a private Unix socket
in a 0700 folder only this process's user can enter.

The listening socket is made here, as the Python server made it (``SO_REUSEPORT`` when the
router runs ``--workers``, so every worker takes the port's calls), and handed to the engine.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
from pathlib import Path

import grpc

from qstate._engine import Engine
from qstate.core.config import Settings
from qstate.core.errors import StartFailed
from qstate.router.engine import ENGINE_THREADS

__all__ = ["NativeGrpc"]


class NativeGrpc:
    def __init__(self, engine: Engine, server: grpc.aio.Server) -> None:
        self.engine = engine
        self.folder = Path(tempfile.mkdtemp(prefix="qstate-grpc-"))  # 0700: only this user
        self.socket = self.folder / "grpc.sock"
        server.add_insecure_port(f"unix:{self.socket}")

    def start(self, host: str, port: int, cfg: Settings, reuse_port: bool) -> int:
        """The public port (after the Python server started): the port bound."""
        if bool(cfg.tls_cert) != bool(cfg.tls_key):
            raise StartFailed("TLS needs both QSTATE_TLS_CERT and QSTATE_TLS_KEY")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            sock = socket.create_server((host, port), family=family, backlog=4096,
                                        reuse_port=reuse_port)
        except OSError as exc:
            raise StartFailed(f"cannot listen on {host}:{port}: {exc.strerror} (another "
                              "server there?, or the address is not this host's)") from None
        with sock:
            self.engine.serve_grpc(str(self.socket), sock.fileno(), ENGINE_THREADS,
                                   cfg.tls_cert or None, cfg.tls_key or None)
            bound: int = sock.getsockname()[1]
        return bound

    def stop(self) -> None:
        self.engine.stop_grpc()
        shutil.rmtree(self.folder, ignore_errors=True)
