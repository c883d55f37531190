"""What the Python routes ask of the state besides its reads (which the read core answers:
``qstate._engine``, docs/architecture.md §5): top-N boards (``qstate.router.top``), the jobs
served, how a job's operators stand, which batch counted a Kafka record."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

from qstate._engine import Engine
from qstate.core.address import PartitionId, check_name, quoted
from qstate.core.config import DEFAULTS
from qstate.core.errors import UnknownOperator
from qstate.core.records.operator import OperatorSpec
from qstate.proto import shard_pb2 as pb
from qstate.router.describer import Describer
from qstate.router.position import Position, batch_of_offset
from qstate.router.request import TopQuery
from qstate.router.routing import RoutingTable
from qstate.router.shards import ShardStubs
from qstate.router.top import TopReads, TopResult

__all__ = ["OperatorStatus", "QueryService"]


@dataclass
class OperatorStatus:
    spec: OperatorSpec
    last_batch: int
    watermark_ms: int
    partitions_available: int


class QueryService:
    def __init__(self, routing: RoutingTable, stubs: ShardStubs, engine: Engine,
                 max_batch_keys: int = DEFAULTS.max_batch_keys,
                 max_windows: int = DEFAULTS.max_windows,
                 min_batch_wait_s: float = DEFAULTS.min_batch_wait_s,
                 max_top_n: int = DEFAULTS.max_top_n,
                 retry_after_s: float = DEFAULTS.retry_after_s) -> None:
        self.routing = routing
        self.stubs = stubs
        self.engine = engine
        # the bounds the routes' documents state (the read core enforces its own, pushed from
        # the same settings: qstate.router.engine)
        self.max_batch_keys = max_batch_keys
        self.max_windows = max_windows
        self.min_batch_wait_s = min_batch_wait_s
        self.max_top_n = max_top_n
        self.retry_after_s = retry_after_s
        self.top_reads = TopReads(routing, stubs, engine, min_batch_wait_s)
        # the router's one Describe poller: the local reads, the watch hub and the cluster page
        self.describer = Describer(stubs)

    def top_query(self, job: str, operator: str, state: str, n: int | None = None,
                  descending: bool = True, start_ms: int | None = None,
                  min_batch: int | None = None, savepoint: str | None = None,
                  allow_stale: bool = False) -> TopQuery:
        """A top-N query under this router's bound on ``n`` (QSTATE_MAX_TOP_N)."""
        return TopQuery.of(job, operator, state, n, descending, start_ms,
                           max_n=self.max_top_n, min_batch=min_batch, savepoint=savepoint,
                           allow_stale=allow_stale)

    async def spec(self, job: str, operator: str, state: str | None = None) -> OperatorSpec:
        """The operator's spec, or the 404 naming what is unknown, in the read core's words."""
        spec = await self.routing.spec(job, operator)
        if spec is not None and (state is None or state in spec.states):
            return spec
        raise self.engine.unknown(job, operator, state) or UnknownOperator(
            f"unknown job {quoted(job, 80)}", job=job)

    async def top(self, q: TopQuery) -> TopResult:
        """The query's top n across every partition of its operator."""
        spec = await self.spec(q.job, q.operator, q.state)
        return await self.top_reads.top(spec, q)

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
                                     topic, partition, offset, self.retry_after_s)

    async def jobs(self) -> dict[str, list[OperatorSpec]]:
        await self.routing.refresh()
        return self.routing.jobs()

    async def describe_job(self, job: str) -> list[OperatorStatus]:
        check_name("job", job)
        specs = (await self.jobs()).get(job)
        if not specs:
            raise UnknownOperator(f"unknown job {quoted(job, 80)}", job=job)
        return list(await asyncio.gather(*(self.operator_status(s) for s in specs)))
