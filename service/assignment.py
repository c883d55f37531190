"""Which shard server owns which partition (DESIGN §4).

Shard servers register themselves in checkpoint storage; the coordinator (in the job's
driver) assigns each operator's partitions to them and writes the assignment there too,
so routers and restarted servers find it without the driver. Every change bumps the epoch.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field

import orjson

from service.storage import Storage


@dataclass(frozen=True)
class ServerInfo:
    id: str
    address: str  # host:port of the internal gRPC API
    metrics: str = ""  # host:port of /metrics
    pid: int = 0
    started_ms: int = 0


@dataclass
class Assignment:
    epoch: int = 0
    servers: dict[str, str] = field(default_factory=dict)  # id -> address
    owners: dict[str, list[str]] = field(default_factory=dict)  # "job/operator" -> id per partition

    def owner(self, job: str, operator: str, partition: int) -> str | None:
        ids = self.owners.get(f"{job}/{operator}")
        if ids is None or partition >= len(ids):
            return None
        return self.servers.get(ids[partition])

    def partitions_of(self, job: str, operator: str) -> dict[str, list[int]]:
        """Server address -> partitions it owns, for one operator."""
        out: dict[str, list[int]] = {}
        for p, sid in enumerate(self.owners.get(f"{job}/{operator}", [])):
            out.setdefault(self.servers[sid], []).append(p)
        return out


def _servers_dir(storage: Storage) -> str:
    return storage.path("cluster", "servers")


def register_server(storage: Storage, info: ServerInfo) -> None:
    storage.write_bytes(f"{_servers_dir(storage)}/{info.id}.json", orjson.dumps(asdict(info)))


def unregister_server(storage: Storage, server_id: str) -> None:
    storage.delete(f"{_servers_dir(storage)}/{server_id}.json")


def list_servers(storage: Storage) -> list[ServerInfo]:
    d = _servers_dir(storage)
    return [ServerInfo(**orjson.loads(storage.read_bytes(f"{d}/{n}")))
            for n in storage.list_names(d) if n.endswith(".json")]


def _assignment_path(storage: Storage) -> str:
    return storage.path("cluster", "assignment.json")


def load_assignment(storage: Storage) -> Assignment:
    path = _assignment_path(storage)
    if not storage.exists(path):
        return Assignment()
    return Assignment(**orjson.loads(storage.read_bytes(path)))


def save_assignment(storage: Storage, a: Assignment) -> None:
    storage.write_bytes(_assignment_path(storage), orjson.dumps(asdict(a)))


def assign_operator(a: Assignment, job: str, operator: str, partitions: int,
                    servers: dict[str, str]) -> Assignment:
    """Keep owners that are still live; give the rest round-robin to live servers.

    Returns a new assignment (epoch + 1) only when something changed.
    """
    if not servers:
        raise RuntimeError("no live shard server to assign partitions to")
    name = f"{job}/{operator}"
    old = a.owners.get(name, [])
    ids = sorted(servers)
    new = [old[p] if p < len(old) and old[p] in servers else ids[p % len(ids)]
           for p in range(partitions)]
    if new == old and all(a.servers.get(i) == servers[i] for i in set(new)):
        return a
    return Assignment(
        epoch=a.epoch + 1,
        servers={**a.servers, **servers},
        owners={**a.owners, name: new},
    )


def now_ms() -> int:
    return int(time.time() * 1000)


def default_server_id(host: str, port: int) -> str:
    return f"{host.replace(':', '_')}-{port}" if port else f"pid-{os.getpid()}"
