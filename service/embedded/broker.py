"""The embedded dev broker: noida-db's Kafka-protocol server, started as a child process.

We start the binary shipped inside the ``noida-db`` wheel directly (not through its Python
wrapper) so that the PID we hold is the broker's own and a SIGTERM reaches it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path

from service.core.errors import BrokerError

__all__ = ["DevBroker", "broker_binary", "free_port", "wait_for_port"]


def broker_binary() -> Path:
    path = Path(str(files("noida_db").joinpath("noida-db")))
    if not path.is_file():
        raise BrokerError(f"noida-db binary not found at {path}: pip install noida-db==0.2.3")
    if not os.access(path, os.X_OK):
        path.chmod(0o755)
    return path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_for_port(host: str, port: int, timeout: float,
                  proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise BrokerError(f"process exited with {proc.returncode} before {host}:{port} opened")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise BrokerError(f"{host}:{port} did not open within {timeout:.0f}s")


@dataclass
class DevBroker:
    data_dir: Path
    port: int = 0
    host: str = "127.0.0.1"
    log_path: Path | None = None
    proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> DevBroker:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port = free_port(self.host)
        log_path = self.log_path or self.data_dir / "broker.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [str(broker_binary()), "start", "--only", "kafka", "--host", self.host,
             "--kafka-port", str(self.port), "--data-dir", str(self.data_dir)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        log.close()
        wait_for_port(self.host, self.port, timeout, self.proc)
        return self

    def stop(self, timeout: float = 20.0) -> None:
        """Ctrl-C semantics: the broker saves its data and exits; killed if it will not."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> DevBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
