"""``qstate router --workers N``: N router processes serving the same ports, so a router
uses as many cores as it is given (docs/architecture.md §5, workers).

This process binds the HTTP port once and hands the listening socket to each worker (they
accept from it in turn), and reserves the gRPC port with a socket that sets SO_REUSEPORT
without listening: a port someone else holds is an error here, before any worker starts, and
the workers' gRPC servers then bind it with SO_REUSEPORT, the kernel spreading connections
over them. Each worker is a whole router (its own event loop, local readers, shard channels,
watch hub); their metrics go to one folder (prometheus_client's multiprocess mode) and any
worker's /metrics answers the sum. SIGINT or SIGTERM here is passed to every worker; a
worker that dies ends the others, and this process exits 1 for its supervisor to restart it.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from qstate.core.errors import StartFailed
from qstate.embedded.lifeline import die_with_parent

__all__ = ["METRICS_DIR_ENV", "serve_workers"]

log = logging.getLogger(__name__)

METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's name for it


def _bind_http(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
    try:
        s.bind((host, port))
    except OSError as exc:
        s.close()
        raise StartFailed(f"HTTP port {host}:{port}: {exc.strerror}") from None
    s.listen(2048)
    s.set_inheritable(True)
    return s


def _reserve_grpc(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        s.bind((host, port))
    except OSError as exc:
        s.close()
        raise StartFailed(f"gRPC port {host}:{port}: {exc.strerror}") from None
    return s


def serve_workers(n: int, host: str, http_port: int, grpc_port: int,
                  args: Sequence[str]) -> int:
    """Run ``n`` workers (``qstate router ARGS --worker-http-fd FD``) until a signal or the
    death of one; the exit code."""
    http = _bind_http(host, http_port)
    grpc_port_held = _reserve_grpc(host, grpc_port)
    metrics = tempfile.mkdtemp(prefix="qstate-router-metrics-")
    env = {**os.environ, METRICS_DIR_ENV: metrics}
    procs: list[subprocess.Popen[bytes]] = []
    stopping = False

    def stop(signum: int, _: object) -> None:
        nonlocal stopping
        stopping = True
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    try:
        for _ in range(n):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "qstate", "router", *args,
                 "--worker-http-fd", str(http.fileno())],
                env=env, pass_fds=(http.fileno(),), preexec_fn=die_with_parent()))
        print(f"qstate router: {n} workers, pids {' '.join(str(p.pid) for p in procs)}",
              flush=True)
        code = 0
        while procs:
            for p in list(procs):
                rc = p.poll()
                if rc is None:
                    continue
                procs.remove(p)
                _mark_dead(p.pid, metrics)
                if not stopping:  # (stopping: however it ended, it was told to)
                    log.error("router worker %d exited with %d: stopping the others",
                              p.pid, rc)
                    stop(signal.SIGTERM, None)
                    code = 1
            time.sleep(0.1)
        return code
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        http.close()
        grpc_port_held.close()
        shutil.rmtree(metrics, ignore_errors=True)


def _mark_dead(pid: int, metrics: str) -> None:
    """A worker gone: its live gauges (watchers open) no longer count."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid, metrics)
