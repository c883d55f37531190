"""The query core behind both the HTTP and the gRPC front ends: validates a request, reads
each key from its partition (``reads``) and shapes the answer (``service.core.answer``)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from proto import shard_pb2 as pb
from service.core.address import PartitionId, check_key, check_name, partition_of
from service.core.answer import StateAnswer
from service.core.config import DEFAULTS
from service.core.errors import InvalidRequest, NotFound, UnknownOperator
from service.core.operator import OperatorSpec
from service.router.reads import Hit, PartitionReads
from service.router.routing import RoutingTable

__all__ = ["OperatorStatus", "QueryService", "check_limit", "check_range"]


@dataclass
class OperatorStatus:
    spec: OperatorSpec
    last_batch: int
    watermark_ms: int
    partitions_available: int


def _validate(job: str, operator: str, state: str, keys: list[str]) -> None:
    check_name("job", job)
    check_name("operator", operator)
    check_name("state", state)
    for k in keys:
        check_key(k)


def check_range(rng: tuple[int, int] | None) -> None:
    if rng is not None and rng[1] <= rng[0]:
        raise InvalidRequest(f"empty time range: 'to' ({rng[1]}) must be after 'from' ({rng[0]})")


def check_limit(limit: int | None, most: int) -> int:
    """The windows a range answer may hold: ``limit`` (None: ``most``), 1..``most``."""
    if limit is None:
        return most
    if not 1 <= limit <= most:
        raise InvalidRequest(f"'limit' is {limit}: ask for 1 to {most} windows per key "
                             "(QSTATE_MAX_WINDOWS), and page on with 'next_from'")
    return limit


def absent(a: StateAnswer) -> NotFound:
    """The 404 of a key with no data: it names the batch it is absent as of."""
    return NotFound(f"key {a.key[:200]!r} has no data in {a.job}/{a.operator}/{a.state} as of "
                    f"batch {a.batch}", batch=a.batch, watermark=a.watermark)


class QueryService:
    def __init__(self, routing: RoutingTable, reads: PartitionReads,
                 max_batch_keys: int = DEFAULTS.max_batch_keys,
                 max_windows: int = DEFAULTS.max_windows) -> None:
        self.routing = routing
        self.reads = reads
        self.max_batch_keys = max_batch_keys
        self.max_windows = max_windows

    @staticmethod
    def _answer(spec: OperatorSpec, state: str, key: str, h: Hit) -> StateAnswer:
        return StateAnswer.model_construct(
            job=spec.job, operator=spec.operator, state=state, key=key, found=h.found,
            batch=h.batch, watermark=h.watermark_ms, windows=h.windows, next_from=h.next_from)

    async def get(self, job: str, operator: str, state: str, key: str,
                  rng: tuple[int, int] | None = None, limit: int | None = None) -> StateAnswer:
        """``limit``: most windows of a range answer (None: ``max_windows``); one cut short
        says where the next page starts (``next_from``)."""
        _validate(job, operator, state, [key])
        check_range(rng)
        most = check_limit(limit, self.max_windows)
        spec = await self.routing.spec(job, operator, state)
        pid = PartitionId(job, operator, partition_of(key, spec.partitions))
        return self._answer(spec, state, key,
                            await self.reads.read(spec, pid, state, key, rng, most))

    async def multi_get(self, job: str, operator: str, state: str, keys: list[str],
                        rng: tuple[int, int] | None = None, limit: int | None = None
                        ) -> list[StateAnswer]:
        if len(keys) > self.max_batch_keys:
            raise InvalidRequest(f"{len(keys)} keys: at most {self.max_batch_keys} per request")
        _validate(job, operator, state, keys)
        check_range(rng)
        most = check_limit(limit, self.max_windows)
        spec = await self.routing.spec(job, operator, state)
        pids = [PartitionId(job, operator, partition_of(k, spec.partitions)) for k in keys]
        hits = [self.reads.read_local(spec, pid, state, k, rng, most)
                for pid, k in zip(pids, keys, strict=True)]
        missing = [i for i, h in enumerate(hits) if h is None]
        if missing:
            reads = [asyncio.ensure_future(self.reads.read_remote(pids[i], state, keys[i], rng,
                                                                  most)) for i in missing]
            try:
                remote = await asyncio.gather(*reads)
            except BaseException:
                # one key failed (a 503, a full shard queue): the answer is that error, and
                # the other keys' lookups are called off rather than left to run unread
                for r in reads:
                    r.cancel()
                raise
            for i, h in zip(missing, remote, strict=True):
                hits[i] = h
        return [self._answer(spec, state, k, h) for k, h in zip(keys, hits, strict=True)
                if h is not None]

    async def operator_status(self, spec: OperatorSpec) -> OperatorStatus:
        """Lowest last batch and watermark over the operator's partitions (shard Describe)."""
        by_addr = self.routing.partitions_of(spec.job, spec.operator)
        caller = self.reads.caller
        replies = await asyncio.gather(
            *(caller.stub(a).Describe(pb.DescribeRequest(), timeout=caller.timeout_s)
              for a in by_addr), return_exceptions=True)
        batches, marks, available = [], [], 0
        for parts, rep in zip(by_addr.values(), replies, strict=True):
            if isinstance(rep, BaseException):
                continue
            held = {p.partition: p for p in rep.partitions
                    if p.job == spec.job and p.operator == spec.operator and not p.restoring}
            for p in parts:
                if p in held:
                    available += 1
                    batches.append(held[p].last_batch)
                    marks.append(held[p].watermark_ms)
        return OperatorStatus(spec, min(batches, default=-1), min(marks, default=0), available)

    async def jobs(self) -> dict[str, list[OperatorSpec]]:
        await self.routing.refresh()
        return self.routing.jobs()

    async def describe_job(self, job: str) -> list[OperatorStatus]:
        check_name("job", job)
        specs = (await self.jobs()).get(job)
        if not specs:
            raise UnknownOperator(f"unknown job {job!r}", job=job)
        return list(await asyncio.gather(*(self.operator_status(s) for s in specs)))
