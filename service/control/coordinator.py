"""The driver-side coordinator of one job: owns its assignment (who owns which partition).

It is the source of truth for which server owns which partition (docs/architecture.md §4):
it probes the registered shard servers (a lease: a server that has not answered for
``lease_s`` is dead), moves a dead server's partitions to live ones (to a follower that
serves them, when an operator keeps replicas), gives a (re)joining server its share and
moves a draining one's away, make-before-break (``qstate.control.placement``), and writes
every assignment to checkpoint storage with a new epoch. Starting a coordinator
bumps the epoch too, so a stale driver that still runs is refused by every shard.

Each epoch is created once (``save_assignment``) and signed by its writer. A coordinator
that finds a newer epoch stands down (``fenced``), except a driver's that finds a standby's
(``qstate.control.standby`` moves partitions while the driver is down): it goes on from that
one. The driver's coordinator beats a lease in storage (``beat``) that keeps the standby waiting.

Delivering a batch's commit to the owners it names is the job's (``qstate.jobs.runtime.commit``): it
asks ``owners_of`` for the current epoch and owners, and ``follow`` when a shard knows a newer
epoch.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import orjson

from qstate.control.metrics import ASSIGNMENT_EPOCH, REASSIGNMENTS
from qstate.control.placement import Cluster, Progress, place
from qstate.core.config import DEFAULTS, settings
from qstate.core.errors import Fenced
from qstate.core.records import paths
from qstate.core.records.assignment import (
    DRIVER,
    Assignment,
    list_servers,
    load_assignment,
    now_ms,
    save_assignment,
)
from qstate.core.records.operator import OperatorSpec, load_spec
from qstate.core.records.storage import Storage
from qstate.core.transport.shard_client import ShardClients, held_partitions

__all__ = ["Coordinator", "coordinator_for", "driver_beat_age_s", "release"]

log = logging.getLogger(__name__)

@dataclass
class Coordinator:
    storage: Storage
    job: str
    shards: list[str] | None = None  # explicit addresses; None: servers registered in storage
    lease_s: float = DEFAULTS.lease_s
    heartbeat_s: float = DEFAULTS.heartbeat_s
    heartbeat_timeout_s: float = DEFAULTS.heartbeat_timeout_s
    clients: ShardClients = field(default_factory=ShardClients)
    assignment: Assignment = field(init=False)
    operators: dict[str, int] = field(default_factory=dict)  # name -> partitions
    replicas: dict[str, int] = field(default_factory=dict)  # name -> copies (the spec's)
    _last_ok: dict[str, float] = field(default_factory=dict)
    _addresses: dict[str, str] = field(default_factory=dict)
    # from each server's last Describe: how far it has each partition of the job, and
    # whether it is draining (stopping once its partitions moved)
    _progress: dict[str, dict[tuple[str, int], Progress]] = field(default_factory=dict)
    _draining: set[str] = field(default_factory=set)
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _started: bool = False
    fenced: bool = False  # another coordinator of the job wrote a newer epoch
    # what it signs the epochs it writes with: a driver's coordinator also beats a lease in
    # storage (``beat``) that keeps a standby (`qstate coordinator`, ``qstate.control.standby``)
    # waiting
    writer: str = field(default_factory=lambda: f"{DRIVER}{uuid.uuid4().hex[:12]}")
    _beats: int = 0
    _beat_at: float = float("-inf")
    _thread: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    # leases are measured on this process's monotonic clock (tests move their own)
    clock: Callable[[], float] = field(default_factory=lambda: time.monotonic)

    def __post_init__(self) -> None:
        self.assignment = load_assignment(self.storage, self.job)
        REASSIGNMENTS.labels(self.job)  # 0 from the start, not absent until the first move

    # ---- membership -------------------------------------------------------------
    def probe(self) -> None:
        """One heartbeat round: Describe every known server."""
        candidates = self.shards or [s.address for s in list_servers(self.storage)]
        candidates = sorted(set(candidates) | set(self.assignment.servers.values()))
        now = self.clock()
        for addr in candidates:
            try:
                d = self.clients.describe(
                    addr, timeout=min(self.heartbeat_timeout_s, self.lease_s / 2),
                    coordinator=self.writer)
            except grpc.RpcError:
                continue
            self._last_ok[d.server_id] = now
            self._addresses[d.server_id] = d.address
            self._progress[d.server_id] = {
                (pid.operator, pid.partition): Progress(i.last_batch, not i.restoring)
                for pid, i in held_partitions(d).items() if pid.job == self.job}
            if d.draining:
                self._draining.add(d.server_id)
            else:
                self._draining.discard(d.server_id)

    def presume_live(self) -> None:
        """Count the servers of the current assignment live as of now: a coordinator taking
        over a running job (a standby) gives each a full ``lease_s`` before it moves its
        partitions, as the coordinator before it did; a busy server that misses the first
        Describe is not a dead one."""
        now = self.clock()
        for sid, address in self.assignment.servers.items():
            self._last_ok.setdefault(sid, now)
            self._addresses.setdefault(sid, address)

    def live(self) -> dict[str, str]:
        now = self.clock()
        return {sid: self._addresses[sid] for sid, t in self._last_ok.items()
                if now - t < self.lease_s}

    def cluster(self) -> Cluster:
        """What placement needs: the live servers, which drain, how far each has got."""
        live = self.live()
        for op in self.assignment.owners.keys() - self.replicas.keys():
            spec = load_spec(self.storage, self.job, op)  # a standby knows no specs yet
            self.replicas[op] = spec.replicas if spec is not None else 1
        return Cluster(live, self._draining & live.keys(),
                       {sid: g for sid, g in self._progress.items() if sid in live},
                       dict(self.replicas))

    def _rebalance(self, bump: bool = False, moves: bool = False) -> None:
        """Bring the assignment in line with the live servers. ``moves``: called by the
        monitor, so a change means partitions moved (a server died or (re)joined), which is
        what ``qstate_job_reassignments_total`` counts; registering operators is not one."""
        with self._lock:
            c = self.cluster()
            if not c.live:
                log.warning("%s: no live shard server", self.job)
                return
            updated = place(self.assignment, self.operators, c, bump, self.writer)
            while updated is not self.assignment and not save_assignment(self.storage, updated):
                # another coordinator wrote that epoch first (storage creates each epoch once)
                newer = load_assignment(self.storage, self.job)
                if not bump and not self.adopts(newer):  # a newer one runs: stand down
                    self._fence(newer)
                    return
                # starting (take over from whoever wrote it), or a standby's epoch: go on
                # from theirs
                self.assignment = newer
                updated = place(newer, self.operators, c, bump, self.writer)
            if updated is not self.assignment:
                log.warning("%s: assignment epoch %d over %s%s", self.job, updated.epoch,
                            sorted(c.live), f" (draining: {sorted(c.draining)})"
                            if c.draining else "")
                self.assignment = updated
                ASSIGNMENT_EPOCH.labels(self.job).set(updated.epoch)
                if moves:
                    REASSIGNMENTS.labels(self.job).inc()

    def register(self, spec: OperatorSpec) -> Assignment:
        """Add an operator; the first call also fences any older writer (epoch + 1)."""
        with self._lock:
            self.operators[spec.operator] = spec.partitions
            self.replicas[spec.operator] = spec.replicas
            if not self.live():
                self.probe()
            self._rebalance(bump=not self._started)
            if not self._started:
                self.beat()
                self._started = True
                self._thread = threading.Thread(
                    target=self._monitor, name=f"coordinator-{self.job}", daemon=True)
                self._thread.start()
            return self.assignment

    @property
    def is_driver(self) -> bool:
        """A driver's coordinator (it beats the lease), not a standby's."""
        return self.writer.startswith(DRIVER)

    def adopts(self, newer: Assignment) -> bool:
        """Whether this coordinator goes on from ``newer``, an epoch someone else wrote,
        rather than stand down: a driver's does from a standby's (it moved partitions while
        the driver's beats did not reach it); anything else means a newer driver runs."""
        return self.is_driver and newer.by_standby()

    def beat(self) -> None:
        """A driver's coordinator: rewrite the job's lease every third of ``lease_s``. A
        standby acts only once the lease has not changed for ``lease_s`` by its own clock."""
        if not self.is_driver or \
                self.clock() - self._beat_at < self.lease_s / 3:
            return
        self._beats += 1
        self.storage.write_bytes(paths.driver_lease(self.job), orjson.dumps(
            {"writer": self.writer, "beat": self._beats, "at_ms": now_ms()}))
        self._beat_at = self.clock()

    def _fence(self, newer: Assignment) -> None:
        self.fenced = True
        self._stop.set()
        log.error("%s: epoch %d was written by %s; this coordinator is fenced and stops",
                  self.job, newer.epoch, newer.writer or "another coordinator")

    def follow(self) -> None:
        """An epoch someone else wrote since ours: go on from it (``adopts``) or stand down."""
        newer = load_assignment(self.storage, self.job)
        with self._lock:
            if newer.epoch <= self.assignment.epoch:
                return
            if not self.adopts(newer):
                self._fence(newer)
                return
            log.warning("%s: going on from epoch %d of %s", self.job, newer.epoch, newer.writer)
            self.assignment = newer
            ASSIGNMENT_EPOCH.labels(self.job).set(newer.epoch)

    def round(self) -> None:
        """One heartbeat round: follow a newer epoch, probe the servers, move partitions if
        one died or rejoined."""
        self.follow()
        if self.fenced:
            return
        self.probe()
        self._rebalance(moves=True)

    def _monitor(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                self.round()
                self.beat()
            except Exception as exc:  # storage hiccup: try again next beat
                log.warning("%s: coordinator round failed: %s", self.job, exc)
        if self._beats and not self.fenced:
            self._end_lease()

    def _end_lease(self) -> None:
        """A driver stopped cleanly: its lease goes, so a rollback need not wait for it to
        age (``driver_beat_age_s``). Only its own: a newer driver's stays."""
        path = paths.driver_lease(self.job)
        try:
            if orjson.loads(self.storage.read_bytes(path)).get("writer") == self.writer:
                self.storage.delete(path)
        except (OSError, ValueError, AttributeError) as exc:
            log.warning("%s: its lease stays (%s); it ages out in %.0fs", self.job, exc,
                        self.lease_s)

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop monitoring; wait (``timeout_s`` at most) for its last round and its lease's
        end."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    # ---- what commit delivery asks (qstate.jobs.runtime.commit) ---------------------------
    def owners_of(self, operator: str) -> tuple[int, dict[str, list[int]]]:
        """The current epoch and, under it, each owner's partitions of ``operator``."""
        with self._lock:
            return self.assignment.epoch, self.assignment.partitions_of(operator)

    def check_not_fenced(self) -> None:
        """Raises ``Fenced`` once another coordinator of the job has written a newer epoch."""
        if self.fenced:
            raise Fenced(f"fenced: another coordinator of {self.job} took over (it wrote "
                         f"epoch {load_assignment(self.storage, self.job).epoch})")


_coordinators: dict[tuple[str, str], Coordinator] = {}
_registry_lock = threading.Lock()


def coordinator_for(storage: Storage, job: str, shards: list[str] | None) -> Coordinator:
    """One coordinator per job and storage in a driver, shared by the job's operators."""
    with _registry_lock:
        key = (storage.uri, job)
        c = _coordinators.get(key)
        if c is None or c._stop.is_set():
            cfg = settings()  # the process's settings (flags were applied to the context)
            c = _coordinators[key] = Coordinator(
                storage, job, shards, lease_s=cfg.lease_s, heartbeat_s=cfg.heartbeat_s,
                heartbeat_timeout_s=cfg.heartbeat_timeout_s)
        return c


def driver_beat_age_s(storage: Storage, job: str) -> float | None:
    """Seconds since the job's driver last beat its lease (by the wall clocks of both
    hosts); None if no driver holds one (never started, or stopped cleanly)."""
    try:
        beat = orjson.loads(storage.read_bytes(paths.driver_lease(job)))
        at_ms = beat["at_ms"] if isinstance(beat, dict) else None
    except (OSError, ValueError):
        return None
    return max(0.0, now_ms() - at_ms) / 1000 if type(at_ms) is int else 0.0


def release(storage_uri: str, job: str) -> None:
    """Stop the job's coordinator (its heartbeats); the next serve() starts a new one."""
    with _registry_lock:
        c = _coordinators.pop((Storage(storage_uri).uri, job), None)
    if c is not None:
        c.stop()
