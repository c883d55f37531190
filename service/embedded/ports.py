"""Local processes' plumbing: free ports, waiting for one to open."""

from __future__ import annotations

import socket
import subprocess
import time

from qstate.core.errors import StartFailed

__all__ = ["free_port", "free_ports", "wait_for_port"]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_ports(n: int, host: str = "127.0.0.1") -> int:
    """The first of ``n`` consecutive ports that are all free now (``qstate run`` binds its
    shards at a base port and the ones after it)."""
    while True:
        base = free_port(host)
        held = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                held.append(s)
                s.bind((host, port))
            return base
        except (OSError, OverflowError):  # taken meanwhile, or past 65535
            continue
        finally:
            for s in held:
                s.close()


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
