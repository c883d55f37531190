"""Clients of the internal shard API: a channel per server, shared by sink and router."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import grpc

from qstate.core.address import PartitionId
from qstate.core.config import Settings, settings
from qstate.core.records.assignment import Assignment
from qstate.core.records.operator import OperatorSpec
from qstate.core.transport import security
from qstate.proto import shard_pb2 as pb
from qstate.proto import shard_pb2_grpc as pb_grpc

__all__ = ["CHANNEL_OPTIONS", "Held", "Holder", "Placed", "ShardClients", "held_partitions",
           "partition_state", "placements"]

Held = dict[PartitionId, pb.PartitionInfo]  # what one server's Describe says it holds

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
    # fail fast on a dead server instead of waiting for reconnect backoff
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


def held_partitions(reply: pb.DescribeReply) -> dict[PartitionId, pb.PartitionInfo]:
    """What a server's Describe says it holds (owned or followed), by partition."""
    return {PartitionId(p.job, p.operator, p.partition): p for p in reply.partitions}


@dataclass(frozen=True)
class Holder:
    """A server the assignment gives a partition to (its owner, or a follower), and what its
    Describe said of the partition (None: no answer, or not held)."""

    id: str
    address: str
    info: pb.PartitionInfo | None

    def state(self) -> str:
        return partition_state(self.address, self.info)


@dataclass(frozen=True)
class Placed:
    """One partition where the assignment puts it, with what its holders said of it."""

    pid: PartitionId
    owner: Holder | None  # None: unassigned
    followers: list[Holder]


def placements(specs: Iterable[OperatorSpec], assignments: Mapping[str, Assignment],
               described: Mapping[str, Held | None]) -> Iterator[Placed]:
    """Every partition of ``specs`` joined with its assignment and its holders' Describe
    answers (``described``: by address; absent or None, a server that did not answer): the
    one join `qstate state inspect` and the router's /v1/cluster both show."""
    def holder(pid: PartitionId, sid: str, address: str) -> Holder:
        held = described.get(address)
        return Holder(sid, address, held.get(pid) if held is not None else None)

    for spec in specs:
        a = assignments.get(spec.job)
        for p in range(spec.partitions):
            pid = PartitionId(spec.job, spec.operator, p)
            if a is None:
                yield Placed(pid, None, [])
                continue
            sid = a.owner_id(spec.operator, p)
            owner = holder(pid, sid, a.servers[sid]) if sid in a.servers else None
            yield Placed(pid, owner, [holder(pid, f, a.servers[f])
                                      for f in a.followers_of(spec.operator, p)
                                      if f in a.servers])


def partition_state(owner: str | None, info: pb.PartitionInfo | None) -> str:
    """How a partition stands, from the server the assignment gives it to (its owner, or a
    follower) and what that server's Describe said of it: ready | restoring | down (no
    answer, or not held) | unassigned."""
    if owner is None:
        return "unassigned"
    if info is None:
        return "down"
    return "restoring" if info.restoring else "ready"


class ShardClients:
    """Blocking stubs keyed by address; channels are created once and reused. TLS and the
    cluster token come from ``cfg`` (default: this process's settings)."""

    def __init__(self, cfg: Settings | None = None) -> None:
        self.cfg = cfg or settings()
        self._stubs: dict[str, pb_grpc.ShardStub] = {}
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()

    def stub(self, address: str) -> pb_grpc.ShardStub:
        stub = self._stubs.get(address)
        if stub is None:
            with self._lock:
                stub = self._stubs.get(address)
                if stub is None:
                    ch = security.channel(address, self.cfg, CHANNEL_OPTIONS)
                    self._channels[address] = ch
                    stub = self._stubs[address] = pb_grpc.ShardStub(ch)
        return stub

    def describe(self, address: str, timeout: float = 2.0,
                 coordinator: str = "") -> pb.DescribeReply:
        """``coordinator``: the caller's writer id, when a coordinator's heartbeat asks."""
        return self.stub(address).Describe(pb.DescribeRequest(coordinator=coordinator),
                                           timeout=timeout)

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()
        self._stubs.clear()
