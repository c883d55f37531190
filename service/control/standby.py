"""A standby coordinator (`qstate coordinator`): moves a dead shard's partitions while the
job's driver is down, so that serving does not wait for the job.

The driver's coordinator owns a job's assignment while it runs, and beats a lease in
checkpoint storage (``paths.driver_lease``, rewritten every third of ``lease_s``). The standby
watches that lease with its own clock: once it has not changed for ``lease_s`` (the driver
stopped, crashed, or cannot reach storage) the standby runs a coordinator of its own for the
job (heartbeats to the shard servers, moves on death or rejoin; each server of the
assignment has a full ``lease_s`` from then to answer) that never commits, and
signs the epochs it writes ``standby:<id>``. When the lease changes again the driver is back:
the standby stops at once, and the driver goes on from the standby's newest epoch (a
driver's coordinator adopts a standby's epoch instead of counting itself fenced). Each epoch
is created once (``save_assignment``): should both write at the same moment, one wins and
the standby stands down.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from qstate.control.coordinator import Coordinator
from qstate.control.metrics import STANDBY_ACTIVE
from qstate.core.config import Settings
from qstate.core.process.start import start_process
from qstate.core.records import paths
from qstate.core.records.assignment import STANDBY
from qstate.core.records.storage import Storage

__all__ = ["Standby", "run_standby", "stand_by"]

log = logging.getLogger(__name__)


@dataclass
class Standby:
    """The standby of one job: ``step`` once per heartbeat."""

    storage: Storage
    job: str
    cfg: Settings
    writer: str = field(default_factory=lambda: f"{STANDBY}{socket.gethostname()}-{os.getpid()}")
    active: Coordinator | None = None
    _seen: bytes | None = None
    # the lease is watched on this process's monotonic clock (tests move their own)
    clock: Callable[[], float] = field(default_factory=lambda: time.monotonic)
    _changed_at: float = field(init=False)

    def __post_init__(self) -> None:
        self._changed_at = self.clock()

    def _lease(self) -> bytes | None:
        try:
            return self.storage.read_bytes(paths.driver_lease(self.job))
        except FileNotFoundError:
            return None

    def driver_down(self) -> bool:
        """No change of the driver's lease for ``lease_s`` on this process's clock (so
        clocks of different hosts need not agree); from start-up too, a driver that runs
        has beaten by then."""
        lease = self._lease()
        if lease != self._seen:
            self._seen, self._changed_at = lease, self.clock()
        return self.clock() - self._changed_at >= self.cfg.lease_s

    def step(self) -> None:
        if not self.driver_down():
            if self.active is not None:
                log.warning("%s: the driver is back; standing by", self.job)
                self.active.stop()
                self.active = None
            STANDBY_ACTIVE.labels(self.job).set(0)
            return
        STANDBY_ACTIVE.labels(self.job).set(1)
        if self.active is None or self.active.fenced:
            log.warning("%s: no beat from the driver for %.0fs; coordinating until it is back",
                        self.job, self.cfg.lease_s)
            self.active = Coordinator(
                self.storage, self.job, lease_s=self.cfg.lease_s,
                heartbeat_s=self.cfg.heartbeat_s, heartbeat_timeout_s=self.cfg.heartbeat_timeout_s,
                writer=self.writer, clock=self.clock)
            self.active.presume_live()
        self.active.round()

    def stop(self) -> None:
        if self.active is not None:
            self.active.stop()


def stand_by(storage: Storage, jobs: list[str], cfg: Settings, stop: threading.Event) -> None:
    """Until ``stop``: one heartbeat round per ``heartbeat_s`` for each job."""
    standbys = [Standby(storage, job, cfg) for job in jobs]
    while not stop.wait(cfg.heartbeat_s):
        for s in standbys:
            try:
                s.step()
            except Exception as exc:  # storage or a shard hiccup: next beat again
                log.warning("%s: standby round failed: %s", s.job, exc)
    for s in standbys:
        s.stop()


def run_standby(storage_uri: str, jobs: list[str], cfg: Settings, metrics_port: int) -> None:
    """`qstate coordinator`: stand by for ``jobs`` until Ctrl-C or SIGTERM, /metrics on
    ``cfg.metrics_host:metrics_port``."""
    stop = start_process("coordinator", metrics_port, cfg.metrics_host)
    print(f"standing by for {', '.join(jobs)} (lease {cfg.lease_s:g}s)", flush=True)
    stand_by(Storage(storage_uri), jobs, cfg, stop)
