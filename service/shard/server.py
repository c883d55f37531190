"""The internal gRPC API of a shard server (proto/shard.proto)."""

from __future__ import annotations

import asyncio
import time

import grpc

from proto import shard_pb2 as pb
from proto import shard_pb2_grpc as pb_grpc
from service.keys import InvalidAddress, check_key, check_name, partition_of
from service.shard import metrics
from service.shard.partitions import (
    DeltaMismatch,
    NotOwner,
    PartitionCommit,
    Partitions,
    UnknownOperator,
)
from service.shard.store import StaleEpoch, WindowValue

MAX_KEYS = 10_000
MAX_WINDOWS = 10_000


def _window(w: WindowValue, idx: int, is_long: bool) -> pb.Window:
    v = w.values[idx]
    out = pb.Window(windowed=w.start is not None, start_ms=w.start or 0, end_ms=w.end or 0)
    if v is not None:
        if is_long:
            out.int_value = int(v)
        else:
            out.double_value = float(v)
    return out


class ShardService(pb_grpc.ShardServicer):
    def __init__(self, partitions: Partitions, server_id: str, address: str) -> None:
        self.partitions = partitions
        self.server_id = server_id
        self.address = address

    async def Commit(self, request: pb.CommitRequest, context: grpc.aio.ServicerContext
                     ) -> pb.CommitReply:
        try:
            check_name("job", request.job)
            check_name("operator", request.operator)
            spec = self.partitions.spec(request.job, request.operator)
            if request.batch < 0:
                raise InvalidAddress("batch must be >= 0")
            for pd in request.partitions:
                if pd.partition >= spec.partitions:
                    raise InvalidAddress(f"partition {pd.partition} >= {spec.partitions}")
        except InvalidAddress as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except UnknownOperator as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        parts = [PartitionCommit(pd.partition, pd.has_delta, pd.rows)
                 for pd in request.partitions]
        t0 = time.perf_counter()
        try:
            res = await asyncio.to_thread(
                self.partitions.commit, request.job, request.operator, request.batch,
                request.watermark_ms, request.epoch, parts)
        except (StaleEpoch, NotOwner) as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except DeltaMismatch as exc:
            await context.abort(grpc.StatusCode.DATA_LOSS, str(exc))
        labels = (request.job, request.operator)
        metrics.COMMIT_SECONDS.labels(*labels).observe(time.perf_counter() - t0)
        metrics.COMMITS.labels(*labels, "applied").inc(len(res.applied))
        metrics.COMMITS.labels(*labels, "skipped").inc(len(res.skipped))
        metrics.CAUGHT_UP.labels(*labels).inc(res.caught_up)
        metrics.LAST_BATCH.labels(*labels).set(request.batch)
        metrics.PARTITIONS.set(sum(1 for _ in self.partitions.held()))
        return pb.CommitReply(applied=res.applied, skipped=res.skipped,
                              caught_up_batches=res.caught_up)

    async def MultiGet(self, request: pb.LookupRequest, context: grpc.aio.ServicerContext
                       ) -> pb.LookupReply:
        t0 = time.perf_counter()
        try:
            check_name("job", request.job)
            check_name("operator", request.operator)
            check_name("state", request.state)
            spec = self.partitions.spec(request.job, request.operator)
            if request.state not in spec.states:
                raise UnknownOperator(
                    f"operator {request.job}/{request.operator} has no state {request.state!r}")
            if len(request.keys) > MAX_KEYS:
                raise InvalidAddress(f"at most {MAX_KEYS} keys per call")
            for kq in request.keys:
                check_key(kq.key)
                if kq.partition != partition_of(kq.key, spec.partitions):
                    raise InvalidAddress(f"key {kq.key[:80]!r} is not in partition {kq.partition}")
            if request.range and request.to_ms <= request.from_ms:
                raise InvalidAddress("to_ms must be greater than from_ms")
        except InvalidAddress as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except UnknownOperator as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        idx = spec.state_names.index(request.state)
        is_long = spec.states[request.state] == "long"
        rng = (request.from_ms, request.to_ms) if request.range else None
        limit = min(request.limit or MAX_WINDOWS, MAX_WINDOWS)
        reply = pb.LookupReply()
        for kq in request.keys:
            held = self.partitions.lookup(request.job, request.operator, kq.partition)
            r = reply.results.add(key=kq.key)
            if held is None:
                r.status = pb.NOT_OWNED
                continue
            if not held.ready.is_set():
                r.status = pb.RESTORING
                continue
            try:
                meta, windows = held.store.read(kq.key, rng, limit)
            except Exception:  # closed under us: the partition just moved away
                r.status = pb.NOT_OWNED
                continue
            r.batch, r.watermark_ms = meta.last_batch, meta.watermark_ms
            r.status = pb.FOUND if windows else pb.ABSENT
            r.windows.extend(_window(w, idx, is_long) for w in windows)
        for r in reply.results:
            metrics.LOOKUPS.labels(pb.KeyStatus.Name(r.status)).inc()
        metrics.LOOKUP_SECONDS.observe(time.perf_counter() - t0)
        return reply

    async def Describe(self, request: pb.DescribeRequest, context: grpc.aio.ServicerContext
                       ) -> pb.DescribeReply:
        reply = pb.DescribeReply(server_id=self.server_id, address=self.address)
        for (job, op, p), held in self.partitions.held():
            meta = held.store.meta
            reply.partitions.add(job=job, operator=op, partition=p, last_batch=meta.last_batch,
                                 watermark_ms=meta.watermark_ms,
                                 restoring=not held.ready.is_set(),
                                 epoch=self.partitions.epochs.get(job, 0))
        return reply
