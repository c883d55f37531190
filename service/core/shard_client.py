"""Clients of the internal shard API: a channel per server, shared by sink and router."""

from __future__ import annotations

import threading

import grpc

from qstate.core import security
from qstate.core.address import PartitionId
from qstate.core.config import Settings, settings
from qstate.proto import shard_pb2 as pb
from qstate.proto import shard_pb2_grpc as pb_grpc

__all__ = ["CHANNEL_OPTIONS", "ShardClients", "held_partitions", "partition_state"]

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
