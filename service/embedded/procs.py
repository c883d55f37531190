"""Child processes qstate starts (shards, routers, jobs): started, awaited, stopped by PID."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from qstate.embedded.lifeline import die_with_parent
from qstate.embedded.ports import free_port, wait_for_port

__all__ = ["NOT_INHERITED", "Child", "RouterProcess", "ShardProcess", "qstate_command"]

# prometheus_client's multiprocess folder: a process that set it for its own metrics (Feast
# does when imported) must not hand it to a shard or router it starts, which would then add
# every process's series written there to its /metrics (a router's --workers are given their
# own by service/embedded/router_workers.py, which starts them itself)
NOT_INHERITED = ("PROMETHEUS_MULTIPROC_DIR", "PROMETHEUS_MULTIPROCESS_DIR")


@dataclass
class Child:
    name: str
    args: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    proc: subprocess.Popen | None = field(default=None, repr=False)
    # added to the child's niceness: batch work (jobs, generators) yields the CPU to the
    # processes that answer reads on a shared machine (docs/architecture.md §6)
    nice: int = 0

    def start(self) -> Child:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in (os.environ if self.env is None else self.env).items()
               if k not in NOT_INHERITED}
        with open(self.log_path, "ab") as log:
            # own session: a terminal's Ctrl-C reaches only the parent, which stops
            # children in order; a parent killed outright takes them with it (lifeline)
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env,
                                         start_new_session=True,
                                         preexec_fn=_preexec(self.nice))
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    stop_signal: ClassVar[int] = signal.SIGTERM  # what ``stop`` sends unless told

    def stop(self, timeout: float = 15.0, sig: int | None = None) -> None:
        if not self.alive():
            return
        assert self.proc is not None
        self.proc.send_signal(self.stop_signal if sig is None else sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def kill(self) -> None:
        """kill -9: no cleanup at all, as in a crash."""
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait()


def _preexec(nice: int) -> Callable[[], None] | None:
    lifeline = die_with_parent()
    if not nice:
        return lifeline

    def child() -> None:
        if lifeline is not None:
            lifeline()
        os.nice(nice)  # every thread the child starts (a JVM's too) inherits it

    return child


def qstate_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "qstate", *args]


@dataclass
class ShardProcess(Child):
    host: str = "127.0.0.1"
    port: int = 0
    # at once: SIGTERM would drain it first (its partitions moved to other servers while a
    # coordinator runs: service/shard/main.py), which ``drain`` asks for
    stop_signal: ClassVar[int] = signal.SIGINT

    def drain(self, timeout: float = 120.0) -> None:
        self.stop(timeout, signal.SIGTERM)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    def make(cls, server_id: str, data_dir: Path, storage: str, log_dir: Path,
             port: int = 0, env: dict[str, str] | None = None,
             metrics_port: int = 0) -> ShardProcess:
        """``metrics_port`` 0: any free one (the server registers it in storage), so that
        servers started side by side never race for the configured default."""
        port = port or free_port()
        args = qstate_command("shard", "--id", server_id, "--port", str(port),
                              "--metrics-port", str(metrics_port),
                              "--data-dir", str(data_dir), "--storage", storage)
        return cls(server_id, args, log_dir / f"{server_id}.log", env, port=port)

    def start_and_wait(self, timeout: float = 30.0) -> ShardProcess:
        self.start()
        wait_for_port(self.host, self.port, timeout, self.proc)
        return self


@dataclass
class RouterProcess(Child):
    host: str = "127.0.0.1"
    http_port: int = 0
    grpc_port: int = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def grpc_address(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @classmethod
    def make(cls, storage: str, log_dir: Path, name: str = "router",
             env: dict[str, str] | None = None, *extra: str) -> RouterProcess:
        http_port, grpc_port = free_port(), free_port()
        args = qstate_command("router", "--http-port", str(http_port), "--grpc-port",
                              str(grpc_port), "--storage", storage, *extra)
        return cls(name, args, log_dir / f"{name}.log", env, http_port=http_port,
                   grpc_port=grpc_port)

    def start_and_wait(self, timeout: float = 30.0) -> RouterProcess:
        self.start()
        wait_for_port(self.host, self.http_port, timeout, self.proc)
        wait_for_port(self.host, self.grpc_port, timeout, self.proc)
        return self
