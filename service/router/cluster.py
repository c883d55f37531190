"""The cluster as the router sees it now: every shard server, the partitions the assignment
gives it to own and to follow (copies, ``replicas``), and how each stands (that server's
Describe), for ``GET /v1/cluster`` and /ui.

The same facts as ``qstate state inspect``, over the router's cached routing table and its
async shard channels, one Describe per server.
"""

from __future__ import annotations

import asyncio
import time

import grpc

from qstate.core.address import PartitionId
from qstate.core.answer import ClusterInfo, PartitionStatus, ShardStatus
from qstate.core.shard_client import held_partitions, partition_state
from qstate.proto import shard_pb2 as pb
from qstate.router.coalesce import ShardCaller
from qstate.router.routing import RoutingTable

__all__ = ["cluster"]

Held = dict[PartitionId, pb.PartitionInfo]


async def _describe(caller: ShardCaller, address: str) -> Held | None:
    try:
        d = await caller.stub(address).Describe(pb.DescribeRequest(), timeout=caller.timeout_s)
    except grpc.aio.AioRpcError:
        return None
    return held_partitions(d)


def _status(job: str, operator: str, p: int, holder: str | None, replies: dict[str, Held | None],
            now: int) -> PartitionStatus:
    """Partition ``p`` as ``holder`` (its owner, or a follower) reported it."""
    held = replies.get(holder) if holder is not None else None
    info = held.get(PartitionId(job, operator, p)) if held is not None else None
    return PartitionStatus(
        job=job, operator=operator, partition=p, state=partition_state(holder, info),
        last_batch=info.last_batch if info is not None else None,
        watermark=info.watermark_ms if info is not None else None,
        freshness_s=round((now - info.watermark_ms) / 1000, 3)
        if info is not None and info.last_batch >= 0 else None)


async def cluster(routing: RoutingTable, caller: ShardCaller) -> ClusterInfo:
    ids = {s.address: s.id for s in routing.servers}
    for assignment in routing.assignments.values():
        ids.update({addr: sid for sid, addr in assignment.servers.items()})
    addresses = sorted(ids, key=lambda addr: (ids[addr], addr))
    replies = dict(zip(addresses, await asyncio.gather(
        *(_describe(caller, addr) for addr in addresses)), strict=True))
    now = int(time.time() * 1000)
    owned: dict[str, list[PartitionStatus]] = {addr: [] for addr in addresses}
    following: dict[str, list[PartitionStatus]] = {addr: [] for addr in addresses}
    unassigned: list[PartitionStatus] = []
    for (job, operator), spec in sorted(routing.specs.items()):
        a = routing.assignments.get(job)
        for p in range(spec.partitions):
            owner = a.owner(operator, p) if a is not None else None
            status = _status(job, operator, p, owner, replies, now)
            (owned[owner] if owner is not None else unassigned).append(status)
            for addr in a.follower_addresses(operator, p) if a is not None else []:
                following[addr].append(_status(job, operator, p, addr, replies, now))
    return ClusterInfo(now=now, unassigned=unassigned, shards=[
        ShardStatus(id=ids[addr], address=addr, up=replies[addr] is not None,
                    partitions=owned[addr], following=following[addr])
        for addr in addresses])
