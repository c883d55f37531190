"""The driver-side coordinator: owns the assignment and commits batches on every shard.

It is the source of truth for which server owns which partition (DESIGN §4) and writes the
assignment to checkpoint storage for routers and restarted servers.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import grpc

from proto import shard_pb2 as pb
from service.assignment import (
    Assignment,
    assign_operator,
    list_servers,
    load_assignment,
    save_assignment,
)
from service.operator import OperatorSpec
from service.shard.client import ShardClients
from service.storage import Storage

log = logging.getLogger("qstate.coordinator")

_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


class CommitFailed(RuntimeError):
    pass


@dataclass
class CommitOutcome:
    seconds: float = 0.0
    applied: int = 0  # partitions that applied the batch now
    skipped: int = 0  # partitions that already had it (a re-run batch)
    caught_up: int = 0  # older deltas replayed by servers that had a gap


@dataclass
class Coordinator:
    storage: Storage
    shards: list[str] | None = None  # explicit addresses; None: servers registered in storage
    commit_timeout_s: float = 30.0
    clients: ShardClients = field(default_factory=ShardClients)
    assignment: Assignment = field(default_factory=Assignment)

    def live_servers(self) -> dict[str, str]:
        """id -> address of the servers that answer Describe now."""
        candidates = self.shards or [s.address for s in list_servers(self.storage)]
        live: dict[str, str] = {}
        for addr in candidates:
            try:
                d = self.clients.describe(addr, timeout=2.0)
            except grpc.RpcError as exc:
                log.warning("shard %s does not answer (%s); not assigning to it", addr,
                            exc.code())
                continue
            live[d.server_id] = d.address
        return live

    def register(self, spec: OperatorSpec) -> Assignment:
        servers = self.live_servers()
        current = load_assignment(self.storage)
        updated = assign_operator(current, spec.job, spec.operator, spec.partitions, servers)
        if updated is not current:
            save_assignment(self.storage, updated)
            log.warning("assignment epoch %d: %s/%s over %d servers", updated.epoch, spec.job,
                        spec.operator, len(servers))
        self.assignment = updated
        return updated

    def commit(self, spec: OperatorSpec, batch: int, watermark_ms: int,
               written: dict[int, int]) -> CommitOutcome:
        """Commit ``batch`` on every owner. Raises unless every owner acknowledged."""
        t0 = time.perf_counter()
        deadline = t0 + self.commit_timeout_s
        pending = {
            addr: pb.CommitRequest(
                job=spec.job, operator=spec.operator, batch=batch, watermark_ms=watermark_ms,
                epoch=self.assignment.epoch,
                partitions=[pb.PartitionDelta(partition=p, has_delta=p in written,
                                              rows=written.get(p, 0)) for p in parts])
            for addr, parts in self.assignment.partitions_of(spec.job, spec.operator).items()
        }
        delay = 0.1
        outcome = CommitOutcome()
        while pending:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                raise CommitFailed(f"batch {batch} of {spec.job}/{spec.operator} not acknowledged "
                                   f"by {sorted(pending)} within {self.commit_timeout_s}s")
            futures = {a: self.clients.stub(a).Commit.future(r, timeout=remaining)
                       for a, r in pending.items()}
            errors = {}
            for addr, fut in futures.items():
                try:
                    reply = fut.result()
                    del pending[addr]
                    outcome.applied += len(reply.applied)
                    outcome.skipped += len(reply.skipped)
                    outcome.caught_up += reply.caught_up_batches
                except grpc.RpcError as exc:
                    if exc.code() not in _RETRYABLE:
                        raise CommitFailed(f"shard {addr} refused batch {batch}: "
                                           f"{exc.code().name} {exc.details()}") from exc
                    errors[addr] = exc.code().name
            if pending:
                log.warning("batch %d: retrying shards %s", batch, errors)
                time.sleep(min(delay, max(0.0, deadline - time.perf_counter())))
                delay = min(delay * 2, 2.0)
        outcome.seconds = time.perf_counter() - t0
        return outcome
