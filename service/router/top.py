"""Top-N across an operator's partitions (docs/architecture.md §5).

Each partition's top n comes from its owner: one ``Top`` call per shard server for all the
partitions it holds (not from a co-located shard's files: catching a RocksDB secondary up
with a busy primary costs more than the read, measured in §5), and a partition whose owner
cannot answer is asked again on its own, following a move, then of a follower when the
query allows staleness (``Owners.ask``). The answers merge by value, then key. Every
partition answers or the whole answer is the 503 of the one that could not: a leaderboard
never silently misses a partition. ``window=current`` is resolved by each partition from
its watermark; partitions a batch apart can disagree at a window's end, and those behind are
asked the newest window.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import grpc

from qstate._engine import MIN_BATCH_POLL_S, Engine
from qstate.core.address import PartitionId
from qstate.core.errors import InvalidRequest, NotFound, QStateError, Unavailable, from_grpc
from qstate.core.records.operator import OperatorSpec
from qstate.core.transport.values import value_of
from qstate.core.windows import floor_to
from qstate.partition.ranking import Ranked, check_top, rank_of
from qstate.proto import shard_pb2 as pb
from qstate.router.metrics import FOLLOWER_READS, REMOTE_READS
from qstate.router.request import TopQuery
from qstate.router.routing import RoutingTable
from qstate.router.shards import ShardStubs

__all__ = ["PartitionTop", "TopReads", "TopResult"]

log = logging.getLogger(__name__)

_TRANSPORT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


@dataclass(frozen=True, slots=True)
class PartitionTop:
    """What one partition answered: its top n of the window starting at ``start``."""

    batch: int
    watermark_ms: int
    start: int
    entries: list[Ranked]


@dataclass(frozen=True, slots=True)
class TopResult:
    spec: OperatorSpec
    state: str
    start: int | None  # None: unwindowed state
    end: int | None
    batch: int  # the lowest of the partitions read: each is at least there
    watermark_ms: int
    entries: list[Ranked]
    # the highest: above ``batch`` when the partitions were read mid-commit, some a batch
    # behind (a board then may lack what they have not applied yet)
    newest_batch: int = -1

    @property
    def partial(self) -> bool:
        return self.newest_batch > self.batch


def _partition_top(r: pb.PartitionTop) -> PartitionTop:
    return PartitionTop(r.batch, r.watermark_ms, r.start_ms,
                        [Ranked(e.key, value_of(e)) for e in r.entries])  # type: ignore[arg-type]


class Owners:
    """A call of a partition's owner (following a move once), of a follower when the owner
    cannot answer and the caller allows staleness: what the read core does for keys
    (``engine/core/src/read/fetch.rs``), for a top-N's ``Top`` calls, with the core's words
    for each 503 (``Engine.unavailable``)."""

    def __init__(self, routing: RoutingTable, engine: Engine) -> None:
        self.routing = routing
        self.engine = engine

    def _unavailable(self, reason: str, pid: PartitionId, address: str = "",
                     stale_hint: bool = False) -> QStateError:
        return self.engine.unavailable(reason, pid.job, pid.operator, pid.partition, address,
                                       stale_hint)

    async def ask(self, pid: PartitionId, owner: str | None,
                  call: Callable[[str], Awaitable[pb.PartitionTop]],
                  allow_stale: bool = False) -> pb.PartitionTop:
        """``call(address)`` of the partition's owner (None: the routing table names none
        yet), then of a follower when ``allow_stale``; the answer has the partition's
        ``status``: FOUND, never NOT_OWNED or RESTORING."""
        # the 503 says how to read a copy the caller did not allow (the read core's words)
        hint = not allow_stale and bool(self.routing.followers_now(pid))
        try:
            return await self._ask_owner(pid, owner, call, hint)
        except Unavailable:
            if not allow_stale:
                raise
            for address in self.routing.followers_now(pid):
                FOLLOWER_READS.inc()
                try:
                    r = await call(address)
                except grpc.aio.AioRpcError:
                    continue
                if r.status in (pb.FOUND, pb.ABSENT):
                    return r
            raise

    async def _ask_owner(self, pid: PartitionId, address: str | None,
                         call: Callable[[str], Awaitable[pb.PartitionTop]],
                         hint: bool) -> pb.PartitionTop:
        for attempt in (0, 1):
            if attempt or address is None:  # after a move, or none named yet: refresh once
                address = await self.routing.owner(pid)
            if address is None:
                raise self._unavailable("no-owner", pid, "", hint)
            REMOTE_READS.inc()
            try:
                r = await call(address)
            except grpc.aio.AioRpcError as exc:
                if exc.code() in _TRANSPORT:
                    if attempt == 0 and await self.routing.moved(pid, address):
                        continue  # moved: ask the new owner
                    raise self._unavailable(
                        "shard-timeout" if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                        else "shard-down", pid, address, hint) from None
                if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                    # the router's own credential is wrong: the client's request is fine
                    log.error("shard %s refused this router: its QSTATE_CLUSTER_TOKEN differs",
                              address)
                    raise self._unavailable("shard-refused", pid, address, hint) from None
                raise from_grpc(exc) or QStateError(exc.details() or "shard error") from None
            if r.status == pb.RESTORING:
                raise self._unavailable("restoring", pid, address, hint)
            if r.status != pb.NOT_OWNED:
                return r
            await self.routing.refresh(force=True)
        raise self._unavailable("moving", pid, "", hint)


class TopReads:
    def __init__(self, routing: RoutingTable, stubs: ShardStubs, engine: Engine,
                 min_batch_wait_s: float) -> None:
        self.routing = routing
        self.stubs = stubs
        self.engine = engine
        self.owners = Owners(routing, engine)
        self.min_batch_wait_s = min_batch_wait_s

    async def top(self, spec: OperatorSpec, q: TopQuery) -> TopResult:
        state = check_top(spec, q.state)
        asked = q.start_ms
        if asked is not None and spec.windowed:  # the newest window starting at or before
            asked = floor_to(asked, spec.window.slide)
        got = await self._read(spec, q, state, range(spec.partitions), asked)
        if q.min_batch is not None:  # first: the batch waited for decides what is current
            got = await self._at_least(spec, q, state, got, asked)
        if spec.windowed and asked is None:
            newest = max(t.start for t in got.values())
            behind = [p for p, t in got.items() if t.start != newest]
            if behind:
                got.update(await self._read(spec, q, state, behind, newest))
        a = spec.states[q.state]
        sign = -1 if q.descending else 1
        entries = sorted((e for t in got.values() for e in t.entries),
                         key=lambda e: (sign * rank_of(a, e.value), e.key))[:q.n]
        any_top = next(iter(got.values()))
        start = any_top.start if spec.windowed else None
        return TopResult(spec, q.state, start,
                         None if start is None else start + spec.window.size_ms,
                         min(t.batch for t in got.values()),
                         min(t.watermark_ms for t in got.values()), entries,
                         max(t.batch for t in got.values()))

    async def _at_least(self, spec: OperatorSpec, q: TopQuery, state: int,
                        got: dict[int, PartitionTop], start: int | None
                        ) -> dict[int, PartitionTop]:
        """``got``, with each partition below ``q.min_batch`` read again (the window starting
        at ``start``, or the current one: that of the newer batch) until it has it: at most
        ``min_batch_wait_s``, then Unavailable naming the batch it has (§5)."""
        want = q.min_batch
        assert want is not None
        deadline = time.monotonic() + self.min_batch_wait_s
        while True:
            behind = [p for p, t in got.items() if t.batch < want]
            if not behind:
                return got
            if time.monotonic() >= deadline:
                p = min(behind, key=lambda p: got[p].batch)
                raise self.engine.behind(spec.job, spec.operator, p, got[p].batch, want)
            await asyncio.sleep(MIN_BATCH_POLL_S)  # as the read core polls its keys
            got = {**got, **await self._read(spec, q, state, behind, start)}

    async def _read(self, spec: OperatorSpec, q: TopQuery, state: int, parts: Iterable[int],
                    start: int | None) -> dict[int, PartitionTop]:
        by_owner: dict[str | None, list[int]] = {}
        for p in parts:
            owner = self.routing.owner_now(PartitionId(spec.job, spec.operator, p))
            by_owner.setdefault(owner, []).append(p)
        out: dict[int, PartitionTop] = {}
        for got in await asyncio.gather(*(self._owner(spec, q, owner, ps, start)
                                          for owner, ps in by_owner.items())):
            out.update(got)
        return out

    def _request(self, spec: OperatorSpec, q: TopQuery, parts: list[int],
                 start: int | None) -> pb.TopRequest:
        return pb.TopRequest(job=spec.job, operator=spec.operator, state=q.state,
                             partitions=parts, current=start is None, start_ms=start or 0,
                             n=q.n, ascending=not q.descending,
                             partition_count=spec.partitions, savepoint=q.savepoint or "")

    async def _owner(self, spec: OperatorSpec, q: TopQuery, owner: str | None,
                     parts: list[int], start: int | None) -> dict[int, PartitionTop]:
        """One Top call to ``owner`` for its partitions; those it does not answer (moved,
        restoring, the call failed) each asked again on their own (``Owners.ask``)."""
        caller = self.stubs
        out: dict[int, PartitionTop] = {}
        again = parts
        if owner is not None:
            REMOTE_READS.inc(len(parts))
            try:
                reply = await caller.stub(owner).Top(self._request(spec, q, parts, start),
                                                     timeout=caller.timeout_s)
                again = []
                for r in reply.partitions:
                    if r.status == pb.FOUND:
                        out[r.partition] = _partition_top(r)
                    else:
                        again.append(r.partition)
            except grpc.aio.AioRpcError as exc:
                answer = from_grpc(exc)
                if isinstance(answer, InvalidRequest | NotFound):
                    raise answer from None  # the request's fault (too large, unknown state)
                # the shard's: each partition on its own says what failed
        stub = caller.stub

        async def one(p: int) -> tuple[int, PartitionTop]:
            req = self._request(spec, q, [p], start)

            async def call(address: str) -> pb.PartitionTop:
                reply = await stub(address).Top(req, timeout=caller.timeout_s)
                return reply.partitions[0]

            pid = PartitionId(spec.job, spec.operator, p)
            return p, _partition_top(await self.owners.ask(pid, owner, call, q.allow_stale))

        for p, t in await asyncio.gather(*(one(p) for p in again)):
            out[p] = t
        return out
