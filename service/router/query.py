"""The query core behind both the HTTP and the gRPC front ends: makes a request's
``StateQuery`` (``point``, ``batch``), reads each key from its partition (``reads``) and
shapes the answer (``qstate.core.answer``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from qstate.core.address import PartitionId, check_name, partition_of
from qstate.core.answer import StateAnswer, Window
from qstate.core.config import DEFAULTS
from qstate.core.errors import InvalidRequest, NotFound, Unavailable, UnknownOperator
from qstate.core.records.operator import OperatorSpec
from qstate.proto import shard_pb2 as pb
from qstate.router.describer import Describer
from qstate.router.position import Position, batch_of_offset
from qstate.router.reads import MIN_BATCH_POLL_S, Hit, PartitionReads
from qstate.router.request import StateQuery, TopQuery
from qstate.router.routing import RoutingTable
from qstate.router.top import TopReads, TopResult

__all__ = ["STATE_ROUNDS", "OperatorStatus", "QueryService", "absent", "absent_key"]

# reads of a several-state batch before it answers 503: each round after the first asks every
# state again with min_batch at the newest batch the round before saw (``multi_states``)
STATE_ROUNDS = 3


@dataclass
class OperatorStatus:
    spec: OperatorSpec
    last_batch: int
    watermark_ms: int
    partitions_available: int


def absent(a: StateAnswer) -> NotFound:
    """The 404 of a key with no data: it names the batch it is absent as of."""
    return absent_key(a.job, a.operator, a.state, a.key, a.batch, a.watermark)


def absent_key(job: str, operator: str, state: str, key: str, batch: int,
               watermark: int) -> NotFound:
    return NotFound(f"key {key[:200]!r} has no data in {job}/{operator}/{state} as of "
                    f"batch {batch}", batch=batch, watermark=watermark)


class QueryService:
    def __init__(self, routing: RoutingTable, reads: PartitionReads,
                 max_batch_keys: int = DEFAULTS.max_batch_keys,
                 max_windows: int = DEFAULTS.max_windows,
                 max_request_windows: int = DEFAULTS.max_request_windows,
                 min_batch_wait_s: float = DEFAULTS.min_batch_wait_s,
                 max_top_n: int = DEFAULTS.max_top_n) -> None:
        self.routing = routing
        self.reads = reads
        self.max_batch_keys = max_batch_keys
        self.max_windows = max_windows
        self.max_request_windows = max_request_windows
        self.min_batch_wait_s = min_batch_wait_s
        self.max_top_n = max_top_n
        self.top_reads = TopReads(reads, min_batch_wait_s)
        # the router's one Describe poller: reads, the watch hub and the cluster page share it
        self.describer = Describer(reads.caller)

    def point(self, job: str, operator: str, state: str, key: str,
              rng: tuple[int, int] | None = None, limit: int | None = None,
              min_batch: int | None = None, savepoint: str | None = None) -> StateQuery:
        """One key's query under this router's bounds. ``limit``: most windows of a range
        answer (None: ``max_windows``); one cut short says where the next page starts.
        ``min_batch``: answer as of that batch or a later one (waiting for it a while).
        ``savepoint``: as of that savepoint of the job."""
        return StateQuery.of(job, operator, state, (key,), rng, limit,
                             max_windows=self.max_windows,
                             max_request_windows=self.max_request_windows, min_batch=min_batch,
                             savepoint=savepoint)

    def batch(self, job: str, operator: str, state: str, keys: Sequence[str],
              rng: tuple[int, int] | None = None, limit: int | None = None,
              min_batch: int | None = None, savepoint: str | None = None) -> StateQuery:
        """Many keys' query: at most ``max_batch_keys`` of them (QSTATE_MAX_BATCH_KEYS)."""
        return StateQuery.of(job, operator, state, keys, rng, limit,
                             max_windows=self.max_windows, max_keys=self.max_batch_keys,
                             max_request_windows=self.max_request_windows, min_batch=min_batch,
                             savepoint=savepoint)

    def states_batch(self, job: str, operator: str, states: Sequence[str], keys: Sequence[str],
                     rng: tuple[int, int] | None = None, limit: int | None = None,
                     min_batch: int | None = None, savepoint: str | None = None
                     ) -> list[StateQuery]:
        """A read of several states of one operator (``multi_states``), one query per state:
        each state named once, at most ``max_batch_keys`` answers (keys × states), and the
        request's windows (QSTATE_MAX_REQUEST_WINDOWS) shared evenly between its states."""
        if not states:
            raise InvalidRequest("'states' is empty: name at least one state of the operator")
        twice = [s for i, s in enumerate(states) if s in states[:i]]
        if twice:
            raise InvalidRequest(f"'states' names {twice[0][:80]!r} twice: name each once")
        if len(keys) * len(states) > self.max_batch_keys:
            raise InvalidRequest(
                f"{len(keys)} keys × {len(states)} states = {len(keys) * len(states)} answers: "
                f"at most {self.max_batch_keys} per request (QSTATE_MAX_BATCH_KEYS)")
        return [StateQuery.of(job, operator, s, keys, rng, limit, max_windows=self.max_windows,
                              max_keys=self.max_batch_keys,
                              max_request_windows=self.max_request_windows // len(states),
                              min_batch=min_batch, savepoint=savepoint) for s in states]

    async def multi_states(self, queries: Sequence[StateQuery]
                           ) -> tuple[OperatorSpec, list[tuple[str, str, Hit]]]:
        """Every key of ``queries`` (``states_batch``: the same keys, one query per state)
        in every state, key by key and each key's states in the order asked, **a key's
        states as of one batch** (a feature vector never mixes two: docs/feast.md). The
        states are read side by side; a key whose states a commit landed between is read
        again, every state with ``min_batch`` at the newest batch seen, at most
        ``STATE_ROUNDS`` times, then 503 (reason ``behind``). An error is the first
        state's in the order asked, as the native front answers it."""
        keys = queries[0].keys
        floor = queries[0].min_batch
        for _ in range(STATE_ROUNDS):
            got = await asyncio.gather(*(self.multi_lookup(replace(q, min_batch=floor))
                                         for q in queries), return_exceptions=True)
            per_state: list[list[Hit]] = []
            spec = None
            for g in got:
                if isinstance(g, BaseException):
                    raise g
                spec = g[0]
                per_state.append([h for _, h in g[1]])
            assert spec is not None
            mixed = [i for i in range(len(keys)) if len({hs[i].batch for hs in per_state}) > 1]
            if not mixed:
                return spec, [(k, q.state, hs[i]) for i, k in enumerate(keys)
                              for q, hs in zip(queries, per_state, strict=True)]
            floor = max(h.batch for hs in per_state for h in hs)
        seen = sorted({hs[mixed[0]].batch for hs in per_state})
        raise Unavailable(
            f"the states of key {keys[mixed[0]][:200]!r} answered at batches {seen} in each of "
            f"{STATE_ROUNDS} reads: the job commits faster than a read goes round; retry",
            self.reads.retry_after_s, reason="behind")

    def top_query(self, job: str, operator: str, state: str, n: int | None = None,
                  descending: bool = True, start_ms: int | None = None,
                  min_batch: int | None = None, savepoint: str | None = None) -> TopQuery:
        """A top-N query under this router's bound on ``n`` (QSTATE_MAX_TOP_N)."""
        return TopQuery.of(job, operator, state, n, descending, start_ms,
                           max_n=self.max_top_n, min_batch=min_batch, savepoint=savepoint)

    async def top(self, q: TopQuery) -> TopResult:
        """The query's top n across every partition of its operator."""
        spec = await self.routing.spec(q.job, q.operator, q.state)
        return await self.top_reads.top(spec, q)

    async def _at_least(self, q: StateQuery, spec: OperatorSpec, pid: PartitionId, key: str,
                        hit: Hit) -> Hit:
        """``hit``, or the same read again until its partition has ``q.min_batch``: at most
        ``min_batch_wait_s``, then Unavailable naming the batch it has (docs/architecture.md
        §5: read your writes)."""
        want = q.min_batch
        if want is None or hit.batch >= want:
            return hit
        deadline = time.monotonic() + self.min_batch_wait_s
        while time.monotonic() < deadline:
            await asyncio.sleep(MIN_BATCH_POLL_S)
            hit = await self.reads.read(spec, pid, q, key)
            if hit.batch >= want:
                return hit
        raise self.reads.behind(pid, hit.batch, want, self.min_batch_wait_s)

    @staticmethod
    def _answer(spec: OperatorSpec, q: StateQuery, key: str, h: Hit) -> StateAnswer:
        return StateAnswer.model_construct(
            job=spec.job, operator=spec.operator, state=q.state, key=key, found=h.found,
            batch=h.batch, watermark=h.watermark_ms,
            windows=[Window.model_construct(start=w.start, end=w.end, value=w.value)
                     for w in h.windows], next_from=h.next_from)

    async def get(self, q: StateQuery) -> StateAnswer:
        """The answer for the query's one key."""
        spec, key, hit = await self.lookup(q)
        return self._answer(spec, q, key, hit)

    async def lookup(self, q: StateQuery) -> tuple[OperatorSpec, str, Hit]:
        """What ``get`` answers, before it is shaped: the operator, the key and its hit."""
        [key] = q.keys
        spec = await self.routing.spec(q.job, q.operator, q.state)
        pid = PartitionId(q.job, q.operator, partition_of(key, spec.partitions))
        hit = await self.reads.read(spec, pid, q, key)
        if q.min_batch is not None:
            hit = await self._at_least(q, spec, pid, key, hit)
        return spec, key, hit

    async def multi_lookup(self, q: StateQuery, local: bool = True
                           ) -> tuple[OperatorSpec, list[tuple[str, Hit]]]:
        """Each key of a batch query with its hit, in the query's order (the front ends
        shape them: gRPC messages, :batchGet's bytes). The keys of a partition on this host
        are read together (one check of its owner and marker, one iterator); the others
        over gRPC, coalesced per owner. ``local=False``: every key from its owner (a read
        of many partitions just after they moved on, where catching each secondary up
        would cost more than the read: docs/architecture.md §5, watch)."""
        keys = q.keys
        spec = await self.routing.spec(q.job, q.operator, q.state)
        parts = [partition_of(k, spec.partitions) for k in keys]
        by_partition: dict[int, list[int]] = {}
        for i, p in enumerate(parts):
            by_partition.setdefault(p, []).append(i)
        hits: list[Hit | None] = [None] * len(keys)
        pids: dict[int, PartitionId] = {}
        missing: list[tuple[int, str | None]] = []  # a key's index, its partition's owner
        for p, idx in by_partition.items():
            pid = pids[p] = PartitionId(q.job, q.operator, p)
            owner = self.reads.routing.owner_now(pid)  # once per partition
            here = self.reads.read_local_many(spec, pid, q, [keys[i] for i in idx], owner) \
                if local else None
            if here is None:
                missing += [(i, owner) for i in idx]
                continue
            for i, h in zip(idx, here, strict=True):
                hits[i] = h
        if missing:
            reads = [asyncio.ensure_future(self.reads.read_remote(pids[parts[i]], q, keys[i],
                                                                  owner))
                     for i, owner in missing]
            try:
                remote = await asyncio.gather(*reads)
            except BaseException:
                # one key failed (a 503, a full shard queue): the answer is that error, and
                # the other keys' lookups are called off rather than left to run unread
                for r in reads:
                    r.cancel()
                raise
            for (i, _), h in zip(missing, remote, strict=True):
                hits[i] = h
        if q.min_batch is not None:
            behind = [(i, h) for i, h in enumerate(hits)
                      if h is not None and h.batch < q.min_batch]
            # every key waits its own way; the answer names the first key still behind in
            # the request's order (as the native front does), not the wait that ended first
            later = await asyncio.gather(*(self._at_least(q, spec, pids[parts[i]], keys[i], h)
                                           for i, h in behind), return_exceptions=True)
            for (i, _), got in zip(behind, later, strict=True):
                if isinstance(got, BaseException):
                    raise got
                hits[i] = got
        return spec, [(k, h) for k, h in zip(keys, hits, strict=True) if h is not None]

    async def serving(self, ops: Iterable[tuple[str, str]], max_age_s: float = 0.0
                      ) -> dict[tuple[str, str], dict[int, pb.PartitionInfo]]:
        """Each operator's partitions that their owners (as routed) serve now, as their
        Describe says (at most ``max_age_s`` old: the router's one poller, ``describer``); an
        owner that does not answer, and a partition it restores, are left out."""
        asks: dict[str, list[tuple[str, str, list[int]]]] = {}
        out: dict[tuple[str, str], dict[int, pb.PartitionInfo]] = {}
        for job, op in ops:
            out[(job, op)] = {}
            for address, parts in self.routing.partitions_of(job, op).items():
                asks.setdefault(address, []).append((job, op, parts))
        replies = await self.describer.describe(asks, max_age_s)
        for address, wanted in asks.items():
            held = replies.get(address)
            if held is None:
                continue
            for job, op, parts in wanted:
                for p in parts:
                    info = held.get(PartitionId(job, op, p))
                    if info is not None and not info.restoring:
                        out[(job, op)][p] = info
        return out

    async def operator_status(self, spec: OperatorSpec) -> OperatorStatus:
        """Lowest last batch and watermark over the operator's partitions (shard Describe)."""
        infos = (await self.serving([(spec.job, spec.operator)]))[(spec.job, spec.operator)]
        return OperatorStatus(spec, min((i.last_batch for i in infos.values()), default=-1),
                              min((i.watermark_ms for i in infos.values()), default=0),
                              len(infos))

    async def position(self, job: str, topic: str, partition: int, offset: int) -> Position:
        """The batch of ``job`` that counted the record at ``offset`` (read your writes:
        read with ``min_batch`` set to it)."""
        specs = (await self.jobs()).get(job, [])
        return await batch_of_offset(self.routing.storage, job, [s.operator for s in specs],
                                     topic, partition, offset, self.reads.retry_after_s)

    async def jobs(self) -> dict[str, list[OperatorSpec]]:
        await self.routing.refresh()
        return self.routing.jobs()

    async def describe_job(self, job: str) -> list[OperatorStatus]:
        check_name("job", job)
        specs = (await self.jobs()).get(job)
        if not specs:
            raise UnknownOperator(f"unknown job {job!r}", job=job)
        return list(await asyncio.gather(*(self.operator_status(s) for s in specs)))
