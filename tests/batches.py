"""Committing a batch the way a job does, without Spark: its delta files written to checkpoint
storage, its manifest recorded, and the commit delivered to every owning shard
(``qstate.jobs.runtime.commit.Committer``), or to one of them (as partitions commit one after
another, the others later). The values written are the tests' ground truth."""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa

from qstate.control.coordinator import Coordinator
from qstate.core.address import PartitionId, partition_of
from qstate.core.records import delta as deltas
from qstate.core.records.operator import OperatorSpec
from qstate.jobs.runtime.commit import Committer
from qstate.proto import shard_pb2 as pb

Written = dict[int, dict[int, int]]  # partition -> fragment -> rows, as a manifest records


def record_values(coordinator: Coordinator, spec: OperatorSpec, batch: int, start: int,
                  values: Mapping[str, int]) -> Written:
    """Batch ``batch`` of ``spec`` (one state, tumbling windows) in storage, not delivered:
    each key of ``values`` set to its value in the window starting at ``start``, which is
    also the watermark."""
    [state] = spec.states
    written = {}
    for p in range(spec.partitions):
        mine = [k for k in values if partition_of(k, spec.partitions) == p]
        if not mine:
            continue
        t = pa.table({"key": mine, "start": [start] * len(mine),
                      "end": [start + spec.window.size_ms] * len(mine),
                      "tag": pa.nulls(len(mine), pa.int64()),
                      state: [values[k] for k in mine]}).cast(deltas.delta_schema(spec))
        deltas.write_delta(coordinator.storage, PartitionId(spec.job, spec.operator, p), batch, t)
        written[p] = {0: t.num_rows}
    Committer(coordinator).record(spec, batch, start, written)
    return written


def deliver_to(coordinator: Coordinator, spec: OperatorSpec, batch: int, start: int,
               written: Written, address: str) -> list[int]:
    """Commit a recorded batch on the owner at ``address`` alone (the others have not
    applied it yet): the partitions it owns."""
    epoch, owners = coordinator.owners_of(spec.operator)
    parts = owners[address]
    coordinator.clients.stub(address).Commit(pb.CommitRequest(
        job=spec.job, operator=spec.operator, batch=batch, watermark_ms=start, epoch=epoch,
        partitions=[pb.PartitionDelta(partition=p, has_delta=p in written,
                                      rows=sum(written.get(p, {}).values()),
                                      fragments=sorted(written.get(p, {}))) for p in parts]),
        timeout=30)
    return parts


def commit_values(coordinator: Coordinator, spec: OperatorSpec, batch: int, start: int,
                  values: Mapping[str, int]) -> None:
    """``record_values``, then delivered to every owner."""
    written = record_values(coordinator, spec, batch, start, values)
    Committer(coordinator).deliver(spec, batch, start, written)
