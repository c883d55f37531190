"""Reading one key from the partition that owns it: in-process when the owner is on this
host (``local``), else over the owner's internal API (``coalesce``), following the routing
table when a partition moved. When the owner is down, restoring or no longer holds it, a
follower (a copy: qstate.control.placement) answers if one serves it. The answer is a ``Hit``
as of one batch (a follower's may be a batch older), or ``Unavailable``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

import grpc

from qstate.core.address import PartitionId
from qstate.core.errors import QStateError, Unavailable, from_grpc
from qstate.core.records.operator import OperatorSpec
from qstate.core.transport.values import value_of
from qstate.proto import shard_pb2 as pb
from qstate.router.coalesce import ShardCaller
from qstate.router.hits import Hit, Row
from qstate.router.local import LocalReader
from qstate.router.metrics import FOLLOWER_READS, LOCAL_READS, REMOTE_READS
from qstate.router.request import StateQuery
from qstate.router.routing import RoutingTable

__all__ = ["MIN_BATCH_POLL_S", "Hit", "PartitionReads", "Row"]

log = logging.getLogger(__name__)

_TRANSPORT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
# read your writes: a commit is a batch a second or so, so a read below its min_batch is
# read again this often (a few polls per batch) until it has it (docs/architecture.md §5)
MIN_BATCH_POLL_S = 0.05


class _Status(Protocol):  # a shard's answer about one partition: KeyResult, PartitionTop
    @property
    def status(self) -> pb.KeyStatus: ...


Answer = TypeVar("Answer", bound=_Status)


def _hit(r: pb.KeyResult) -> Hit:
    return Hit(r.status == pb.FOUND, r.batch, r.watermark_ms, _windows(r),
               r.next_from_ms if r.HasField("next_from_ms") else None)


def _windows(r: pb.KeyResult) -> list[Row]:
    return [Row(w.start_ms if w.windowed else None, w.end_ms if w.windowed else None,
                value_of(w)) for w in r.windows]


class PartitionReads:
    def __init__(self, routing: RoutingTable, caller: ShardCaller, retry_after_s: float,
                 local: LocalReader | None = None) -> None:
        self.routing = routing
        self.caller = caller
        self.retry_after_s = retry_after_s
        self.local = local

    def _unavailable(self, message: str, pid: PartitionId, reason: str) -> Unavailable:
        return Unavailable(message, self.retry_after_s, reason=reason, partition=pid.partition)

    def behind(self, pid: PartitionId, batch: int, want: int, waited_s: float) -> Unavailable:
        """The 503 of a read whose partition did not reach its ``min_batch`` in time: it
        names the batch the partition has."""
        return Unavailable(f"partition {pid} is at batch {batch}, not yet at min_batch {want} "
                           f"(waited {waited_s:g}s, QSTATE_MIN_BATCH_WAIT_S)", self.retry_after_s,
                           reason="behind", partition=pid.partition, batch=batch)

    def read_local(self, spec: OperatorSpec, pid: PartitionId, q: StateQuery, key: str,
                   owner: str | None) -> Hit | None:
        """From the files of ``owner`` (the address the routing table names) when it runs on
        this host, or None: ask it over gRPC. A range answer holds at most ``q.limit``
        windows."""
        hits = self.read_local_many(spec, pid, q, (key,), owner)
        return None if hits is None else hits[0]

    def read_local_many(self, spec: OperatorSpec, pid: PartitionId, q: StateQuery,
                        keys: Sequence[str], owner: str | None) -> list[Hit] | None:
        """``read_local`` of keys of one partition, as of one batch."""
        if self.local is None or owner is None or q.savepoint is not None:
            return None  # a savepoint is read by a shard server, not in its live files
        hits = self.local.read_many(owner, pid, q.state, keys, q.range_ms, q.limit)
        if hits is not None:
            LOCAL_READS.inc(len(keys))
        return hits

    async def read(self, spec: OperatorSpec, pid: PartitionId, q: StateQuery, key: str) -> Hit:
        owner = self.routing.owner_now(pid)  # looked up once for both paths
        hit = self.read_local(spec, pid, q, key, owner)
        return hit if hit is not None else await self.read_remote(pid, q, key, owner)

    async def read_remote(self, pid: PartitionId, q: StateQuery, key: str,
                          owner: str | None) -> Hit:
        """From ``owner`` over gRPC (None: the routing table names none yet), following a
        move once; from a follower when the owner cannot answer."""
        kq = pb.KeyQuery(key=key, partition=pid.partition)
        return _hit(await self.ask(pid, owner, lambda address: self.caller.lookup(
            address, pid, q.state, kq, q.range_ms, q.limit, q.savepoint)))

    async def ask(self, pid: PartitionId, owner: str | None,
                  call: Callable[[str], Awaitable[Answer]]) -> Answer:
        """``call(address)`` of the partition's owner (None: the routing table names none
        yet), following a move once; of a follower when the owner cannot answer. The answer
        has the partition's ``status``: FOUND or ABSENT, never NOT_OWNED or RESTORING."""
        try:
            return await self._ask_owner(pid, owner, call)
        except Unavailable:
            answer = await self._ask_follower(pid, call)
            if answer is None:
                raise
            return answer

    async def _ask_follower(self, pid: PartitionId,
                            call: Callable[[str], Awaitable[Answer]]) -> Answer | None:
        """From the first follower that serves the partition, or None."""
        for address in self.routing.followers_now(pid):
            FOLLOWER_READS.inc()
            try:
                r = await call(address)
            except grpc.aio.AioRpcError:
                continue
            if r.status in (pb.FOUND, pb.ABSENT):
                return r
        return None

    async def _ask_owner(self, pid: PartitionId, address: str | None,
                         call: Callable[[str], Awaitable[Answer]]) -> Answer:
        for attempt in (0, 1):
            if attempt or address is None:  # after a move, or none named yet: refresh once
                address = await self.routing.owner(pid)
            if address is None:
                raise self._unavailable(
                    f"partition {pid} has no shard server yet: the job's coordinator places "
                    "partitions on the shard servers registered in checkpoint storage; start "
                    "one (`qstate shard`) if none runs, and see `qstate state inspect`", pid,
                    "no-owner")
            REMOTE_READS.inc()
            try:
                r = await call(address)
            except grpc.aio.AioRpcError as exc:
                if exc.code() in _TRANSPORT:
                    if attempt == 0 and await self.routing.moved(pid, address):
                        continue  # moved: ask the new owner
                    raise self._unavailable(
                        f"shard {address} holding partition {pid} is unavailable "
                        f"({exc.code().name})", pid,
                        "shard-timeout" if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                        else "shard-down") from None
                if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                    # the router's own credential is wrong: the client's request is fine,
                    # so this is no 401 of theirs
                    log.error("shard %s refused this router: its QSTATE_CLUSTER_TOKEN differs",
                              address)
                    raise self._unavailable(
                        f"shard {address} holding partition {pid} refused this router (a "
                        "cluster token that differs)", pid, "shard-refused") from None
                raise from_grpc(exc) or QStateError(exc.details() or "shard error") from None
            if r.status == pb.RESTORING:
                raise self._unavailable(f"partition {pid} is being restored on {address}", pid,
                                        "restoring")
            if r.status != pb.NOT_OWNED:
                return r
            await self.routing.refresh(force=True)
        raise self._unavailable(f"partition {pid} is moving between shard servers", pid,
                                "moving")
