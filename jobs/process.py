"""What a jobs-side process (`qstate job`, `qstate coordinator`) sets up at start."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable

from jobs import metrics

__all__ = ["start_process"]


def _echo(line: str) -> None:
    print(line, flush=True)  # stdout is often a log file: the URL must reach it now


def start_process(what: str, metrics_port: int, metrics_host: str,
                  echo: Callable[[str], object] = _echo) -> threading.Event:
    """Log warnings with a timestamp, serve /metrics on ``metrics_host:metrics_port`` (0: any
    free port) and ``echo`` where as "``what`` metrics: URL"; returns an event that SIGINT
    (Ctrl-C) or SIGTERM sets, for the process to stop on."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    bound = metrics.serve(metrics_port, metrics_host)
    echo(f"{what} metrics: http://{metrics_host}:{bound}/metrics")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop
