"""The cluster as the router sees it now: every shard server, the partitions the assignment
gives it to own and to follow (copies, ``replicas``), and how each stands (that server's
Describe), for ``GET /v1/cluster`` and /ui; and a job's map (``GET /v1/cluster/{job}``):
per partition its owner and followers, each with the routers on its node, which clients
cache to ask a key where it is read without a hop (docs/architecture.md §5, cluster map).

The same join as ``qstate state inspect`` (``placements``), over the router's cached routing
table and its Describe poller (``qstate.router.shards``).
"""

from __future__ import annotations

import time

from qstate.core.address import PartitionId
from qstate.core.answer import (
    ClusterInfo,
    ClusterMap,
    OperatorMap,
    PartitionHolder,
    PartitionOwners,
    PartitionStatus,
    ReadAddress,
    ShardStatus,
)
from qstate.core.transport.shard_client import Holder, placements
from qstate.router.describer import Describer
from qstate.router.routing import RoutingTable

__all__ = ["cluster", "cluster_map"]

# the page shows each server as it answers now (callers asking at once share one Describe)
FRESH_S = 0.0


def _status(pid: PartitionId, h: Holder | None, now: int) -> PartitionStatus:
    """Partition ``pid`` as ``h`` (its owner, or a follower) reported it."""
    info = h.info if h is not None else None
    return PartitionStatus(
        job=pid.job, operator=pid.operator, partition=pid.partition,
        state=h.state() if h is not None else "unassigned",
        last_batch=info.last_batch if info is not None else None,
        watermark=info.watermark_ms if info is not None else None,
        freshness_s=round((now - info.watermark_ms) / 1000, 3)
        if info is not None and info.last_batch >= 0 else None)


async def cluster(routing: RoutingTable, servers: Describer) -> ClusterInfo:
    ids = {s.address: s.id for s in routing.servers}
    for assignment in routing.assignments.values():
        ids.update({addr: sid for sid, addr in assignment.servers.items()})
    addresses = sorted(ids, key=lambda addr: (ids[addr], addr))
    replies = await servers.describe(addresses, FRESH_S)
    now = int(time.time() * 1000)
    owned: dict[str, list[PartitionStatus]] = {addr: [] for addr in addresses}
    following: dict[str, list[PartitionStatus]] = {addr: [] for addr in addresses}
    unassigned: list[PartitionStatus] = []
    specs = [spec for _, spec in sorted(routing.specs.items())]
    for placed in placements(specs, routing.assignments, replies):
        owner = placed.owner
        (owned[owner.address] if owner is not None else unassigned).append(
            _status(placed.pid, owner, now))
        for f in placed.followers:
            following[f.address].append(_status(placed.pid, f, now))
    return ClusterInfo(now=now, unassigned=unassigned, shards=[
        ShardStatus(id=ids[addr], address=addr, up=replies[addr] is not None,
                    partitions=owned[addr], following=following[addr])
        for addr in addresses])


async def cluster_map(routing: RoutingTable, servers: Describer, job: str,
                      may_read: set[str] | None = None) -> ClusterMap:
    """``job``'s map: its operators (those in ``may_read``, when given), each partition's owner
    and followers, whether each reported it ready just now, and the routers on each one's
    node (the job known: ``QueryService.describe_job`` says when it is not)."""
    specs = [spec for (j, _), spec in sorted(routing.specs.items()) if j == job
             and (may_read is None or spec.operator in may_read)]
    a = routing.assignments.get(job)
    addresses = sorted(set(a.servers.values())) if a is not None else []
    replies = await servers.describe(addresses, FRESH_S) if addresses else {}
    at = {sid: [ReadAddress(router=r.id, url=r.url, grpc=r.grpc) for r in rs]
          for sid, rs in routing.read_at().items()}

    def holder(h: Holder) -> PartitionHolder:
        return PartitionHolder(server=h.id, ready=h.state() == "ready",
                               read_at=at.get(h.id, []))

    ops: dict[str, list[PartitionOwners]] = {s.operator: [] for s in specs}
    for placed in placements(specs, routing.assignments, replies):
        ops[placed.pid.operator].append(PartitionOwners(
            partition=placed.pid.partition,
            owner=holder(placed.owner) if placed.owner is not None else None,
            followers=[holder(f) for f in placed.followers]))
    return ClusterMap(job=job, epoch=a.epoch if a is not None else 0, operators=[
        OperatorMap(operator=s.operator, partitions=s.partitions, owners=ops[s.operator])
        for s in specs])
