"""Commit delivery and manifest clean-up: the job's side of exactly-once (docs/architecture.md
§3).

A batch is ``record``-ed (its manifest on checkpoint storage: from then on a shard that missed
it catches up from storage) and ``deliver``-ed: ``Commit(N)`` to every partition's owner under
the coordinator's current epoch, until each acknowledged. Who owns what, and when a newer epoch
fences this driver, is the control plane's (``qstate.control.coordinator``); this module only
asks it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import grpc

from qstate.control.coordinator import Coordinator
from qstate.core.address import PartitionId
from qstate.core.config import DEFAULTS
from qstate.core.errors import (
    CommitFailed,
    Fenced,
    NotOwner,
    StaleEpoch,
    Unavailable,
    from_grpc,
)
from qstate.core.records.catalog import snapshot_batches
from qstate.core.records.manifest import (
    BatchManifest,
    Fragments,
    Offsets,
    delete_manifests_through,
    write_manifest,
)
from qstate.core.records.operator import OperatorSpec
from qstate.core.records.savepoint import pins
from qstate.proto import shard_pb2 as pb

__all__ = ["CommitOutcome", "Committer"]

log = logging.getLogger(__name__)

# A shard that is down, busy, or not yet aware of the newest assignment: try again.
_TRANSPORT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


@dataclass
class CommitOutcome:
    seconds: float = 0.0
    applied: int = 0  # partitions that applied the batch now
    skipped: int = 0  # partitions that already had it (a re-run batch)
    caught_up: int = 0  # older batches replayed by servers that had a gap


@dataclass
class Committer:
    """Records and delivers one job's batches through its coordinator."""

    coordinator: Coordinator
    commit_timeout_s: float = DEFAULTS.commit_timeout_s
    gc_every: int = DEFAULTS.manifest_gc_every  # batches between collections of manifests

    def commit(self, spec: OperatorSpec, batch: int, watermark_ms: int,
               written: dict[int, Fragments]) -> CommitOutcome:
        """Record batch ``batch`` and commit it on every owner (``record``, ``deliver``)."""
        self.record(spec, batch, watermark_ms, written)
        return self.deliver(spec, batch, watermark_ms, written)

    def record(self, spec: OperatorSpec, batch: int, watermark_ms: int,
               written: dict[int, Fragments], offsets: Offsets | None = None) -> None:
        """Make batch ``batch`` durable for every shard: its manifest (its delta files are
        written), with where the batch ends in its source (``offsets``). From here on a
        shard that missed the commit catches up from storage."""
        write_manifest(self.coordinator.storage, spec.job, spec.operator,
                       BatchManifest(batch, watermark_ms, dict(written), dict(offsets or {})))

    def deliver(self, spec: OperatorSpec, batch: int, watermark_ms: int,
                written: dict[int, Fragments]) -> CommitOutcome:
        """Commit a recorded batch on every owner. Returns once each partition acknowledged;
        re-plans as partitions move; raises if fenced or out of time."""
        coord = self.coordinator
        coord.check_not_fenced()
        t0 = time.perf_counter()
        deadline = t0 + self.commit_timeout_s
        outcome = CommitOutcome()
        acked: set[int] = set()
        delay = 0.05
        errors: dict[str, str] = {}
        while len(acked) < spec.partitions:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                missing = sorted(set(range(spec.partitions)) - acked)
                raise CommitFailed(f"batch {batch} of {spec.job}/{spec.operator}: partitions "
                                   f"{missing} not acknowledged within {self.commit_timeout_s}s"
                                   f" (last errors by shard: {errors or 'none'})")
            epoch, owners = coord.owners_of(spec.operator)
            plan = {addr: [p for p in parts if p not in acked] for addr, parts in owners.items()}
            futures = {
                addr: (parts, coord.clients.stub(addr).Commit.future(pb.CommitRequest(
                    job=spec.job, operator=spec.operator, batch=batch,
                    watermark_ms=watermark_ms, epoch=epoch,
                    partitions=[pb.PartitionDelta(
                        partition=p, has_delta=p in written,
                        rows=sum(written.get(p, {}).values()),
                        fragments=sorted(written.get(p, {}))) for p in parts]),
                    # a hung server holds a call no longer than its lease: by then its
                    # partitions have moved, and the next round asks their new owners
                    timeout=min(remaining, coord.lease_s)))
                for addr, parts in plan.items() if parts}
            errors = {}
            for addr, (parts, fut) in futures.items():
                try:
                    reply = fut.result()
                except grpc.RpcError as exc:
                    errors[addr] = self._retryable(addr, batch, parts, exc)
                    continue
                acked.update(parts)
                outcome.applied += len(reply.applied)
                outcome.skipped += len(reply.skipped)
                outcome.caught_up += reply.caught_up_batches
            if len(acked) < spec.partitions:
                log.warning("batch %d of %s/%s: retrying %s", batch, spec.job, spec.operator,
                            errors)
                time.sleep(min(delay, max(0.0, deadline - time.perf_counter())))
                delay = min(delay * 2, 1.0)
        outcome.seconds = time.perf_counter() - t0
        if batch % self.gc_every == 0:
            self.collect_manifests(spec)
        return outcome

    def _retryable(self, addr: str, batch: int, parts: list[int], exc: grpc.RpcError) -> str:
        """What a failed Commit call says, when the next round may succeed (the partitions
        moved, a newer epoch the coordinator now follows, a shard down or busy); raises when
        it cannot (fenced, a refusal, any other gRPC failure)."""
        err = from_grpc(exc)
        if isinstance(err, StaleEpoch):
            self.coordinator.follow()  # a standby's epoch: the next round commits under it
            if self.coordinator.fenced:
                raise Fenced(f"fenced: another coordinator of {self.coordinator.job} took "
                             f"over ({err.message})") from exc
        code = exc.code()  # type: ignore[attr-defined]
        if err is not None and not isinstance(err, NotOwner | StaleEpoch | Unavailable):
            raise CommitFailed(f"shard {addr} refused batch {batch}: "
                               f"{type(err).__name__}: {err.message}") from exc
        if err is None and code not in _TRANSPORT:
            raise CommitFailed(f"shard {addr} failed batch {batch}: "
                               f"{code.name} {exc.details()}") from exc  # type: ignore[attr-defined]
        return f"{type(err).__name__ if err else code.name} for partitions {parts}"

    def collect_manifests(self, spec: OperatorSpec) -> int:
        """Delete batch manifests no restore and no savepoint can need: those at or before
        the oldest kept snapshot of every partition (a partition with no snapshot yet keeps
        them all) and before every batch a savepoint replays."""
        storage = self.coordinator.storage
        oldest = []
        for p in range(spec.partitions):
            snaps = snapshot_batches(storage, PartitionId(spec.job, spec.operator, p))
            if not snaps:
                return 0
            oldest.append(snaps[0])
        kept = pins(storage, spec.job, spec.operator).oldest_batch()
        if kept is not None:
            oldest.append(kept)
        return delete_manifests_through(storage, spec.job, spec.operator, min(oldest))
