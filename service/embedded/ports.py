"""Local processes' plumbing: free ports, waiting for one to open, finding Java."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from service.core.errors import BrokerError

__all__ = ["free_port", "java", "wait_for_port"]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_for_port(host: str, port: int, timeout: float,
                  proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise BrokerError(f"process exited with {proc.returncode} before {host}:{port} "
                              f"opened")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise BrokerError(f"{host}:{port} did not open within {timeout:.0f}s")


def java() -> str:
    """The java binary: $JAVA_HOME/bin/java, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise BrokerError("qstate needs Java 17 (Spark, the Kafka broker) and none was found: "
                          "`apt-get install openjdk-17-jre-headless`, or set JAVA_HOME")
    return found
