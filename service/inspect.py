"""`qstate state inspect`: per operator and partition, who owns it and how far it is.

Owner (from the assignment), last batch and watermark (the owner's Describe), the latest
snapshot's batch and the delta files kept: what an operator needs at 3 a.m.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from service.core.address import PartitionId
from service.core.assignment import load_assignment
from service.core.catalog import delta_batches, manifest_batches, snapshot_batches
from service.core.operator import list_specs
from service.core.shard_client import ShardClients, partition_state
from service.core.storage import Storage

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


def inspect(storage: Storage, job: str | None = None) -> tuple[list[PartitionRow], dict]:
    clients = ShardClients()
    rows: list[PartitionRow] = []
    summary: dict[str, dict] = {}
    described: dict[str, dict] = {}
    refused: set[str] = set()
    try:
        for spec in list_specs(storage):
            if job and spec.job != job:
                continue
            a = load_assignment(storage, spec.job)
            batches = manifest_batches(storage, spec.job, spec.operator)
            summary[f"{spec.job}/{spec.operator}"] = {
                "epoch": a.epoch, "partitions": spec.partitions,
                "manifests": len(batches), "newest_batch": batches[-1] if batches else None}
            for p in range(spec.partitions):
                sid = a.owner_id(spec.operator, p)
                addr = a.servers.get(sid) if sid else None
                info = None
                if addr is not None:
                    if addr not in described:
                        try:
                            d = clients.describe(addr, timeout=1.0)
                            described[addr] = {(x.job, x.operator, x.partition): x
                                               for x in d.partitions}
                        except grpc.RpcError as exc:
                            described[addr] = {}
                            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                                refused.add(addr)
                    info = described[addr].get((spec.job, spec.operator, p))
                # alive, but this tool lacks the cluster token: not "down"
                state = "refused" if addr in refused else partition_state(addr, info)
                pid = PartitionId(spec.job, spec.operator, p)
                snaps = snapshot_batches(storage, pid)
                rows.append(PartitionRow(
                    spec.job, spec.operator, p, sid or "-", state,
                    info.last_batch if info else None, info.watermark_ms if info else None,
                    snaps[-1] if snaps else None,
                    len(delta_batches(storage, pid))))
    finally:
        clients.close()
    return rows, summary
