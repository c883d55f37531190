"""The query core behind both the HTTP and the gRPC front ends."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import grpc
from prometheus_client import Counter

from proto import shard_pb2 as pb
from service.errors import InvalidRequest, NotFound, Unavailable
from service.keys import InvalidAddress, check_key, check_name, partition_of
from service.operator import OperatorSpec
from service.router.coalesce import ShardCaller
from service.router.local import LocalReader
from service.router.routing import RoutingTable

MAX_BATCH_KEYS = 1000
READS = Counter("qstate_router_shard_reads_total",
                "Key lookups by path: in-process from a co-located shard, or over gRPC", ["path"])
LOCAL, REMOTE = READS.labels("local"), READS.labels("grpc")


@dataclass(frozen=True)
class WindowAnswer:
    start: int | None
    end: int | None
    value: int | float | None


@dataclass
class Answer:
    job: str
    operator: str
    state: str
    key: str
    found: bool
    batch: int
    watermark_ms: int
    windows: list[WindowAnswer] = field(default_factory=list)


@dataclass
class OperatorStatus:
    spec: OperatorSpec
    last_batch: int
    watermark_ms: int
    partitions_available: int


def _windows(r: pb.KeyResult) -> list[WindowAnswer]:
    out = []
    for w in r.windows:
        kind = w.WhichOneof("value")
        value = w.int_value if kind == "int_value" else (
            w.double_value if kind == "double_value" else None)
        out.append(WindowAnswer(w.start_ms if w.windowed else None,
                                w.end_ms if w.windowed else None, value))
    return out


def validate(job: str, operator: str, state: str, keys: list[str]) -> None:
    try:
        check_name("job", job)
        check_name("operator", operator)
        check_name("state", state)
        for k in keys:
            check_key(k)
    except InvalidAddress as exc:
        raise InvalidRequest(str(exc)) from None


def check_range(rng: tuple[int, int] | None) -> None:
    if rng is not None and rng[1] <= rng[0]:
        raise InvalidRequest(f"empty time range: 'to' ({rng[1]}) must be after 'from' ({rng[0]})")


@dataclass(frozen=True)
class Hit:
    found: bool
    batch: int
    watermark_ms: int
    windows: list[WindowAnswer]


def _from_pb(r: pb.KeyResult) -> Hit:
    return Hit(r.status == pb.FOUND, r.batch, r.watermark_ms, _windows(r))


class QueryService:
    def __init__(self, routing: RoutingTable, caller: ShardCaller,
                 retry_after_s: float = 1.0, local: LocalReader | None = None) -> None:
        self.routing = routing
        self.caller = caller
        self.retry_after_s = retry_after_s
        self.local = local

    def _local(self, spec: OperatorSpec, state: str, key: str,
               rng: tuple[int, int] | None) -> Hit | None:
        if self.local is None:
            return None
        p = partition_of(key, spec.partitions)
        address = self.routing.owner(spec.job, spec.operator, p)
        res = address and self.local.read(address, spec.job, spec.operator, p, key, rng)
        if not res:
            return None
        LOCAL.inc()
        meta, ws = res
        i = spec.state_names.index(state)
        return Hit(bool(ws), meta.last_batch, meta.watermark_ms,
                   [WindowAnswer(w.start, w.end, w.values[i]) for w in ws])

    async def _one(self, spec: OperatorSpec, state: str, key: str,
                   rng: tuple[int, int] | None) -> Hit:
        hit = self._local(spec, state, key, rng)
        if hit is not None:
            return hit
        return await self._remote(spec, state, key, rng)

    async def _remote(self, spec: OperatorSpec, state: str, key: str,
                      rng: tuple[int, int] | None) -> Hit:
        p = partition_of(key, spec.partitions)
        for attempt in (0, 1):
            address = self.routing.owner(spec.job, spec.operator, p)
            if address is None:
                await self.routing.refresh()
                address = self.routing.owner(spec.job, spec.operator, p)
            if address is None:
                raise Unavailable(f"partition {p} of {spec.job}/{spec.operator} has no "
                                  f"shard server yet", self.retry_after_s, partition=p)
            REMOTE.inc()
            try:
                r = await self.caller.lookup(address, spec.job, spec.operator, state,
                                             pb.KeyQuery(key=key, partition=p), rng)
            except grpc.aio.AioRpcError as exc:
                if exc.code() in (grpc.StatusCode.UNAVAILABLE,
                                  grpc.StatusCode.DEADLINE_EXCEEDED):
                    if attempt == 0:
                        await self.routing.refresh()
                        if self.routing.owner(spec.job, spec.operator, p) != address:
                            continue  # moved: ask the new owner
                    raise Unavailable(
                        f"shard {address} holding partition {p} of {spec.job}/{spec.operator} "
                        f"is unavailable ({exc.code().name})", self.retry_after_s,
                        partition=p) from None
                if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    raise InvalidRequest(exc.details() or "invalid request") from None
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    raise NotFound(exc.details() or "not found") from None
                raise
            if r.status == pb.RESTORING:
                raise Unavailable(f"partition {p} of {spec.job}/{spec.operator} is being "
                                  f"restored on {address}", self.retry_after_s, partition=p)
            if r.status != pb.NOT_OWNED:
                return _from_pb(r)
            await self.routing.refresh(force=True)
        raise Unavailable(f"partition {p} of {spec.job}/{spec.operator} is moving between "
                          f"shard servers", self.retry_after_s, partition=p)

    def _answer(self, spec: OperatorSpec, state: str, key: str, h: Hit) -> Answer:
        return Answer(spec.job, spec.operator, state, key, h.found, h.batch, h.watermark_ms,
                      h.windows)

    async def get(self, job: str, operator: str, state: str, key: str,
                  rng: tuple[int, int] | None = None) -> Answer:
        validate(job, operator, state, [key])
        check_range(rng)
        spec = await self.routing.spec(job, operator, state)
        return self._answer(spec, state, key, await self._one(spec, state, key, rng))

    async def multi_get(self, job: str, operator: str, state: str, keys: list[str],
                        rng: tuple[int, int] | None = None) -> list[Answer]:
        if len(keys) > MAX_BATCH_KEYS:
            raise InvalidRequest(f"{len(keys)} keys: at most {MAX_BATCH_KEYS} per request")
        validate(job, operator, state, keys)
        check_range(rng)
        spec = await self.routing.spec(job, operator, state)
        hits = [self._local(spec, state, k, rng) for k in keys]
        missing = [i for i, h in enumerate(hits) if h is None]
        if missing:
            remote = await asyncio.gather(*(self._remote(spec, state, keys[i], rng)
                                            for i in missing))
            for i, h in zip(missing, remote, strict=True):
                hits[i] = h
        return [self._answer(spec, state, k, h) for k, h in zip(keys, hits, strict=True)
                if h is not None]

    async def operator_status(self, spec: OperatorSpec) -> OperatorStatus:
        """Lowest last batch and watermark over the operator's partitions (shard Describe)."""
        by_addr = self.routing.partitions_of(spec.job, spec.operator)
        replies = await asyncio.gather(
            *(self.caller.stub(a).Describe(pb.DescribeRequest(), timeout=self.caller.timeout_s)
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
        try:
            check_name("job", job)
        except InvalidAddress as exc:
            raise InvalidRequest(str(exc)) from None
        specs = (await self.jobs()).get(job)
        if not specs:
            raise NotFound(f"unknown job {job!r}", job=job)
        return list(await asyncio.gather(*(self.operator_status(s) for s in specs)))

