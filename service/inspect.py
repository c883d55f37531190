"""`qstate state inspect`: per operator and partition, who owns it and how far it is.

Owner (from the assignment), last batch and watermark (the owner's Describe), the latest
snapshot's batch and the delta files kept, and the followers holding copies and how they
stand (their own Describe): what an operator needs at 3 a.m.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc

from qstate.core.records.assignment import load_assignment
from qstate.core.records.catalog import delta_batches, manifest_batches, snapshot_batches
from qstate.core.records.operator import list_specs
from qstate.core.records.storage import Storage
from qstate.core.transport.shard_client import (
    Held,
    Holder,
    ShardClients,
    held_partitions,
    placements,
)

__all__ = ["PartitionRow", "inspect"]


@dataclass
class PartitionRow:
    job: str
    operator: str
    partition: int
    owner: str  # server id, or "-" when unassigned
    state: str  # ready | restoring | down | unassigned | refused (no cluster token)
    last_batch: int | None
    watermark_ms: int | None
    snapshot_batch: int | None
    delta_files: int
    # "server id:state" of each copy (replicas > 1, or the incoming owner of a move)
    followers: list[str] = field(default_factory=list)


def _describe(clients: ShardClients, addresses: set[str]) -> tuple[dict[str, Held | None],
                                                                  set[str]]:
    """Each server's Describe (None: no answer), and those that refused this tool (alive, but
    it lacks the cluster token: not "down")."""
    described: dict[str, Held | None] = {}
    refused: set[str] = set()
    for addr in sorted(addresses):
        try:
            described[addr] = held_partitions(clients.describe(addr, timeout=1.0))
        except grpc.RpcError as exc:
            described[addr] = None
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                refused.add(addr)
    return described, refused


def inspect(storage: Storage, job: str | None = None) -> tuple[list[PartitionRow], dict]:
    specs = [s for s in list_specs(storage) if not job or s.job == job]
    assignments = {j: load_assignment(storage, j) for j in {s.job for s in specs}}
    clients = ShardClients()
    try:
        described, refused = _describe(clients, {a for x in assignments.values()
                                                 for a in x.servers.values()})
    finally:
        clients.close()

    def state(h: Holder) -> str:
        return "refused" if h.address in refused else h.state()

    summary: dict[str, dict] = {}
    for spec in specs:
        batches = manifest_batches(storage, spec.job, spec.operator)
        summary[f"{spec.job}/{spec.operator}"] = {
            "epoch": assignments[spec.job].epoch, "partitions": spec.partitions,
            "manifests": len(batches), "newest_batch": batches[-1] if batches else None}
    rows: list[PartitionRow] = []
    for placed in placements(specs, assignments, described):
        pid, owner = placed.pid, placed.owner
        info = owner.info if owner is not None else None
        snaps = snapshot_batches(storage, pid)
        rows.append(PartitionRow(
            pid.job, pid.operator, pid.partition, owner.id if owner else "-",
            state(owner) if owner else "unassigned",
            info.last_batch if info else None, info.watermark_ms if info else None,
            snaps[-1] if snaps else None, len(delta_batches(storage, pid)),
            [f"{f.id}:{state(f)}" for f in placed.followers]))
    return rows, summary
