"""Local processes' plumbing: free ports, waiting for one to open."""

from __future__ import annotations

import socket
import subprocess
import time

from qstate.core.errors import StartFailed

__all__ = ["free_port", "wait_for_port"]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_for_port(host: str, port: int, timeout: float,
                  proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise StartFailed(f"process exited with {proc.returncode} before {host}:{port} "
                              f"opened")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise StartFailed(f"{host}:{port} did not open within {timeout:.0f}s")
