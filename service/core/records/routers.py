"""Which routers there are, and where clients reach them (docs/architecture.md §5, cluster
map): each router registers itself in checkpoint storage when it starts and removes itself
when it stops, as shard servers do. The cluster map names, for each partition, the routers
on its owner's node: they read it in-process, so a client that asks them saves the hop.

A registration is a hint, never an authority: a router killed outright leaves its record
behind, and a client that cannot reach it asks the router it was given instead.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields

import orjson

from qstate.core.records import paths
from qstate.core.records.storage import Storage

__all__ = ["RouterInfo", "list_routers", "register_router", "router_id", "unregister_router"]


@dataclass(frozen=True)
class RouterInfo:
    id: str
    node: str  # QSTATE_NODE, else the hostname: the shards on it are read in-process
    url: str  # http(s)://host:port of its HTTP API
    grpc: str  # host:port of its public gRPC port
    pid: int = 0
    started_ms: int = 0

    @classmethod
    def from_json(cls, data: bytes) -> RouterInfo:
        """A registration as stored, ignoring fields a newer qstate added."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in orjson.loads(data).items() if k in known})


def router_id(node: str, http_port: int) -> str:
    """A router's id: its node and HTTP port (the workers of one router share both)."""
    return f"{node.replace(':', '_').replace('/', '_')}-{http_port}" if http_port \
        else f"{node}-pid-{os.getpid()}"


def register_router(storage: Storage, info: RouterInfo) -> None:
    storage.write_bytes(paths.router(info.id), orjson.dumps(asdict(info)))


def unregister_router(storage: Storage, info: RouterInfo) -> None:
    """Removes ``info``'s registration if it is still this process's (another worker of the
    same router, or its successor, may have written it since)."""
    try:
        current = RouterInfo.from_json(storage.read_bytes(paths.router(info.id)))
    except (FileNotFoundError, ValueError, TypeError):
        return
    if current.pid == info.pid:
        storage.delete(paths.router(info.id))


def list_routers(storage: Storage) -> list[RouterInfo]:
    out = []
    for n in storage.list_names(paths.routers_dir()):
        if not n.endswith(paths.JSON):
            continue
        try:
            out.append(RouterInfo.from_json(storage.read_bytes(f"{paths.routers_dir()}/{n}")))
        except FileNotFoundError:  # unregistered while we listed
            continue
        except (ValueError, TypeError):  # storage is outside this process: skip what is not one
            continue
    return sorted(out, key=lambda r: r.id)
