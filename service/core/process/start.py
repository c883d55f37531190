"""What a long-running qstate process without a web server of its own (`qstate job`,
`qstate coordinator`) sets up at start: logging, /metrics, and a stop event for signals."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable

from prometheus_client import start_http_server

__all__ = ["serve_metrics", "start_process"]


def _echo(line: str) -> None:
    print(line, flush=True)  # stdout is often a log file: the URL must reach it now


def serve_metrics(port: int, host: str) -> int:
    """Serve this process's /metrics on ``host:port`` (0: any free port); the bound port."""
    httpd, _ = start_http_server(port, addr=host)
    return int(httpd.server_port)


def start_process(what: str, metrics_port: int, metrics_host: str,
                  echo: Callable[[str], object] = _echo) -> threading.Event:
    """Log warnings with a timestamp, serve /metrics on ``metrics_host:metrics_port`` (0: any
    free port) and ``echo`` where as "``what`` metrics: URL"; returns an event that SIGINT
    (Ctrl-C) or SIGTERM sets, for the process to stop on."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    bound = serve_metrics(metrics_port, metrics_host)
    echo(f"{what} metrics: http://{metrics_host}:{bound}/metrics")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop
