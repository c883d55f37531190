"""Which shard server owns which partition (docs/architecture.md §4).

Shard servers register themselves in checkpoint storage; each job's coordinator (in its
driver) assigns the partitions of the job's operators to live servers (owners and
followers: ``qstate.control.placement``) and writes the assignment to checkpoint storage,
where routers and shard servers read it without the driver. Every change bumps the job's
epoch: a writer or reader with an older epoch is refused.

Each epoch is its own object (``paths.assignment(job, epoch)``), created only if absent
(``Storage.create``), and the newest one is in force: of two coordinators that both try
to write epoch E+1 one wins and the other learns it is fenced; no write-then-rename (a copy
and a delete on object stores) ever replaces an assignment in place. The last few epochs
are kept, so a reader that listed a moment ago still finds what it listed.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field, fields

import orjson

from qstate.core.address import PartitionId
from qstate.core.records import paths
from qstate.core.records.storage import Storage

__all__ = ["DRIVER", "EPOCHS_KEPT", "STANDBY", "Assignment", "ServerInfo",
           "default_server_id", "list_servers", "load_assignment", "now_ms",
           "register_server", "save_assignment", "unregister_server"]


DRIVER = "driver:"
STANDBY = "standby:"


@dataclass(frozen=True)
class ServerInfo:
    id: str
    address: str  # host:port of the internal gRPC API
    metrics: str = ""  # host:port of /metrics
    pid: int = 0
    started_ms: int = 0
    # its node (QSTATE_NODE, else the hostname), with data_dir: lets a router on the same
    # node read in-process; the cluster map sends its partitions to a router of that node
    hostname: str = ""
    data_dir: str = ""
    # host:port of its reader (the engine's, docs/architecture.md §5): where routers ask live
    # reads of its partitions; empty: its own port
    reader: str = ""

    @classmethod
    def from_json(cls, data: bytes) -> ServerInfo:
        """A registration as stored, ignoring fields a newer qstate added (a rolling upgrade
        has routers older than the servers)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in orjson.loads(data).items() if k in known})


@dataclass
class Assignment:
    job: str = ""
    epoch: int = 0
    servers: dict[str, str] = field(default_factory=dict)  # id -> address
    owners: dict[str, list[str]] = field(default_factory=dict)  # operator -> id per partition
    # who wrote it: "driver:<id>" (the job's coordinator) or "standby:<id>" (`qstate
    # coordinator`, which moves partitions while the job is down); "" before qstate 0.2
    writer: str = ""
    # operator -> per partition the ids of its followers (qstate.control.placement): copies
    # that apply the same batches from storage and answer reads, but take no commits
    followers: dict[str, list[list[str]]] = field(default_factory=dict)
    # operator -> per partition the id of the server a planned move hands it to ("" where
    # none is under way). That server is also one of its followers until it has caught up;
    # kept so the next placement heads for the same server rather than working it out anew.
    incoming: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: bytes) -> Assignment:
        """An assignment as stored, ignoring fields a newer qstate added (a rolling upgrade
        has readers older than the writer)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in orjson.loads(data).items() if k in known})

    def by_standby(self) -> bool:
        return self.writer.startswith(STANDBY)

    def owner_id(self, operator: str, partition: int) -> str | None:
        ids = self.owners.get(operator)
        return ids[partition] if ids is not None and partition < len(ids) else None

    def followers_of(self, operator: str, partition: int) -> list[str]:
        per = self.followers.get(operator)
        return per[partition] if per is not None and partition < len(per) else []

    def incoming_of(self, operator: str, partition: int) -> str:
        per = self.incoming.get(operator)
        return per[partition] if per is not None and partition < len(per) else ""

    def follower_addresses(self, operator: str, partition: int) -> list[str]:
        return [self.servers[sid] for sid in self.followers_of(operator, partition)
                if sid in self.servers]

    def owner(self, operator: str, partition: int) -> str | None:
        sid = self.owner_id(operator, partition)
        return self.servers.get(sid) if sid is not None else None

    def partitions_of(self, operator: str) -> dict[str, list[int]]:
        """Server address -> partitions it owns, for one operator."""
        out: dict[str, list[int]] = {}
        for p, sid in enumerate(self.owners.get(operator, [])):
            out.setdefault(self.servers[sid], []).append(p)
        return out

    def owned_by(self, server_id: str) -> set[PartitionId]:
        return {PartitionId(self.job, op, p) for op, ids in self.owners.items()
                for p, sid in enumerate(ids) if sid == server_id}

    def followed_by(self, server_id: str) -> set[PartitionId]:
        return {PartitionId(self.job, op, p) for op, per in self.followers.items()
                for p, ids in enumerate(per) if server_id in ids}


def register_server(storage: Storage, info: ServerInfo) -> None:
    storage.write_bytes(paths.server(info.id), orjson.dumps(asdict(info)))


def unregister_server(storage: Storage, server_id: str) -> None:
    storage.delete(paths.server(server_id))


def list_servers(storage: Storage) -> list[ServerInfo]:
    out = []
    for n in storage.list_names(paths.servers_dir()):
        if n.endswith(paths.JSON):
            try:
                out.append(ServerInfo.from_json(
                    storage.read_bytes(f"{paths.servers_dir()}/{n}")))
            except FileNotFoundError:  # unregistered while we listed
                continue
    return out


EPOCHS_KEPT = 8  # older epochs' objects are deleted once a newer one is written


def _epochs(storage: Storage, job: str) -> list[int]:
    names = storage.list_names(paths.assignments_dir(job))
    return sorted(e for n in names if n.endswith(paths.JSON)
                  and (e := paths.batch_of(n)) is not None)


def load_assignment(storage: Storage, job: str) -> Assignment:
    """The assignment in force: the newest epoch's (``Assignment(job)``, epoch 0, if none)."""
    for _ in range(3):  # an epoch deleted between listing and reading: list again
        epochs = _epochs(storage, job)
        if not epochs:
            break
        try:
            return Assignment.from_json(storage.read_bytes(paths.assignment(job, epochs[-1])))
        except FileNotFoundError:
            continue
    legacy = paths.legacy_assignment(job)
    if storage.exists(legacy):  # written by qstate 0.1: in force until the next epoch
        return Assignment.from_json(storage.read_bytes(legacy))
    return Assignment(job)


def save_assignment(storage: Storage, a: Assignment) -> bool:
    """Write ``a`` as its epoch's object if no one has written that epoch yet. False: another
    writer did first (this one is behind and must not act on ``a``)."""
    if not storage.create(paths.assignment(a.job, a.epoch), orjson.dumps(asdict(a))):
        return False
    for e in _epochs(storage, a.job):
        if e <= a.epoch - EPOCHS_KEPT:
            storage.delete(paths.assignment(a.job, e))
    return True


def now_ms() -> int:
    return int(time.time() * 1000)


def default_server_id(host: str, port: int) -> str:
    return f"{host.replace(':', '_')}-{port}" if port else f"pid-{os.getpid()}"
