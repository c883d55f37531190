"""gRPC front end (grpc.aio) of the public API, proto/qstate.proto. ``Get`` and ``MultiGet``
are the read core's (``qstate._engine``: the request's bytes and the caller's token in, the
answer's bytes or its error out, docs/architecture.md §5); the other methods are Python's."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import json_format

from qstate._engine import Engine, answer, state_value
from qstate.core.config import DEFAULTS
from qstate.core.errors import QStateError, grpc_trailers
from qstate.core.records.operator import OperatorSpec
from qstate.core.transport.values import set_value
from qstate.proto import qstate_pb2 as pb
from qstate.proto import qstate_pb2_grpc as pb_grpc
from qstate.router.auth import GrpcAuth
from qstate.router.cluster import cluster_map
from qstate.router.hits import Hit
from qstate.router.metrics import GRPC_LATENCY as RPC_LATENCY
from qstate.router.metrics import GRPC_REQUESTS as RPCS
from qstate.router.metrics import count_error
from qstate.router.query import QueryService
from qstate.router.top import TopResult
from qstate.router.watch import Push, WatchClosed, WatchHub

__all__ = ["QueryableStateService", "serve_api"]

# every method's OK series from the start, at 0 (a dashboard shows 0, not "No data")
for _method in pb.DESCRIPTOR.services_by_name["QueryableState"].methods_by_name:
    RPCS.labels(_method, "OK")


def _value(spec: OperatorSpec, state: str, key: str, h: Hit) -> pb.StateValue:
    """One key's answer in a watch event: the message every read answers with
    (``qstate._engine.state_value``)."""
    return pb.StateValue.FromString(state_value(spec.job, spec.operator, state, key, h.found,
                                                h.batch, h.watermark_ms, h.windows,
                                                h.next_from))


def _top(r: TopResult) -> pb.TopResponse:
    out = pb.TopResponse(job=r.spec.job, operator=r.spec.operator, state=r.state,
                         batch=r.batch, watermark_ms=r.watermark_ms)
    if r.start is not None and r.end is not None:
        out.start_ms, out.end_ms = r.start, r.end
    for k, v in r.entries:
        set_value(out.entries.add(key=k), v)
    return out


def _event(p: Push) -> pb.WatchEvent:
    out = pb.WatchEvent(batch=p.batch, watermark_ms=p.watermark_ms,
                        committed_ms=p.committed_ms, coalesced=p.coalesced,
                        snapshot=p.snapshot,
                        changes=[_value(p.spec, p.state, k, h) for k, h in p.changes])
    if p.top is not None:
        out.top.CopyFrom(_top(p.top))
    return out


def _min_batch(req: pb.GetRequest | pb.MultiGetRequest | pb.TopRequest) -> int | None:
    return req.min_batch if req.HasField("min_batch") else None


def _savepoint(req: pb.GetRequest | pb.MultiGetRequest | pb.TopRequest) -> str | None:
    return req.savepoint if req.HasField("savepoint") else None


async def _fail(context: grpc.aio.ServicerContext, method: str, exc: QStateError) -> None:
    RPCS.labels(method, exc.grpc_code.name).inc()
    count_error(exc)
    trailers = grpc_trailers(exc)
    if "retry_after_s" in exc.detail:  # as error_response decides Retry-After: 503, 429
        trailers += (("retry-after-ms", str(int(float(exc.detail["retry_after_s"]) * 1000))),)
    await context.abort(exc.grpc_code, exc.message, trailers)


class QueryableStateService(pb_grpc.QueryableStateServicer):
    def __init__(self, query: QueryService, auth: GrpcAuth | None = None,
                 hub: WatchHub | None = None) -> None:
        self.query = query
        self.auth = auth or GrpcAuth(None)
        self.hub = hub or WatchHub.of(query, DEFAULTS)

    async def Top(self, request: pb.TopRequest, context: grpc.aio.ServicerContext
                  ) -> pb.TopResponse:
        t0 = time.perf_counter()
        try:
            self.auth.check(context, request.job, request.operator)
            q = self.query.top_query(
                request.job, request.operator, request.state, request.n or None,
                not request.ascending,
                request.window_start_ms if request.HasField("window_start_ms") else None,
                _min_batch(request), _savepoint(request), request.allow_stale)
            r = await self.hub.top(q)
        except QStateError as exc:
            await _fail(context, "Top", exc)
        RPCS.labels("Top", "OK").inc()
        RPC_LATENCY.labels("Top").observe(time.perf_counter() - t0)
        return _top(r)

    async def Watch(self, request: pb.WatchRequest, context: grpc.aio.ServicerContext
                    ) -> AsyncIterator[pb.WatchEvent]:
        try:
            self.auth.check(context, request.job, request.operator)
            w = await self.hub.open(self.hub.watch_query(
                request.job, request.operator, request.state, request.keys,
                request.top_n or None, not request.ascending,
                request.from_batch if request.HasField("from_batch") else None), "grpc")
        except QStateError as exc:
            await _fail(context, "Watch", exc)
        RPCS.labels("Watch", "OK").inc()  # counted when it opens: a stream has no latency
        try:
            while True:
                yield _event(await w.next())
        except WatchClosed:
            # UNAVAILABLE, as for any server going away: a client retries, elsewhere
            await context.abort(grpc.StatusCode.UNAVAILABLE, "this router is stopping: watch "
                                "again with from_batch = the last event's batch")
        finally:
            w.close()

    async def ListJobs(self, request: pb.ListJobsRequest, context: grpc.aio.ServicerContext
                       ) -> pb.ListJobsResponse:
        try:
            who = self.auth.principal(context)
        except QStateError as exc:
            await _fail(context, "ListJobs", exc)
        jobs = await self.query.jobs()
        return pb.ListJobsResponse(jobs=[
            pb.JobInfo(name=j, operators=[pb.OperatorInfo(name=s.operator) for s in specs
                                          if who is None or who.allows(j, s.operator)])
            for j, specs in jobs.items() if who is None or who.allows(j)])

    async def DescribeJob(self, request: pb.DescribeJobRequest,
                          context: grpc.aio.ServicerContext) -> pb.JobInfo:
        try:
            who = self.auth.principal(context)
            if who is not None:
                who.check(request.job)
            ops = await self.query.describe_job(request.job)
        except QStateError as exc:
            await _fail(context, "DescribeJob", exc)
        out = pb.JobInfo(name=request.job)
        for s in ops:
            if who is not None and not who.allows(request.job, s.spec.operator):
                continue
            sp = s.spec
            out.operators.add(
                name=sp.operator, key=sp.key,
                states=[pb.StateInfo(name=n, type=t) for n, t in sp.types.items()],
                window=pb.WindowSpec(kind=sp.window.kind, size_ms=sp.window.size_ms,
                                     slide_ms=sp.window.slide_ms, gap_ms=sp.window.gap_ms),
                partitions=sp.partitions, retention_ms=sp.retention_ms,
                last_batch=s.last_batch, watermark_ms=s.watermark_ms,
                partitions_available=s.partitions_available)
        return out

    async def DescribeClusterMap(self, request: pb.DescribeJobRequest,
                                 context: grpc.aio.ServicerContext) -> pb.ClusterMap:
        """``GET /v1/cluster/{job}``'s answer (``qstate.router.cluster.cluster_map``), in
        the proto's fields, which are the model's."""
        try:
            who = self.auth.principal(context)
            if who is not None:
                who.check(request.job)
            ops = await self.query.describe_job(request.job)  # the job known, else NOT_FOUND
        except QStateError as exc:
            await _fail(context, "DescribeClusterMap", exc)
        readable = {s.spec.operator for s in ops
                    if who is None or who.allows(request.job, s.spec.operator)}
        m = await cluster_map(self.query.routing, self.query.describer, request.job, readable)
        RPCS.labels("DescribeClusterMap", "OK").inc()
        return json_format.ParseDict(m.model_dump(), pb.ClusterMap())


class _Handlers:
    """Records what the generated ``add_..._to_server`` registers (its method handlers)."""

    def __init__(self) -> None:
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, _: Any) -> None:
        pass

    def add_registered_method_handlers(self, _: str, handlers: dict[str, Any]) -> None:
        self.handlers = dict(handlers)


def serve_api(service: QueryableStateService, server: grpc.aio.Server, engine: Engine) -> None:
    """The public API (``qstate.v1.QueryableState``) on ``server``: ``Get`` and ``MultiGet``
    answered by the read core with the bytes it encodes from the request's, the other methods
    by ``service``."""
    rec = _Handlers()
    pb_grpc.add_QueryableStateServicer_to_server(service, rec)  # type: ignore[arg-type]
    handlers = rec.handlers
    for method in ("Get", "MultiGet"):
        handlers[method] = grpc.unary_unary_rpc_method_handler(
            _read_method(engine, service.auth, method))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)


SERVICE = "qstate.v1.QueryableState"


def _read_method(engine: Engine, auth: GrpcAuth, method: str
                 ) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]:
    """A raw method (bytes in, bytes out) the read core answers, its token checked there too."""
    latency, ok = RPC_LATENCY.labels(method), RPCS.labels(method, "OK")

    async def handle(raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        t0 = time.perf_counter()
        try:
            got = await answer(lambda loop, fut: engine.grpc(method, raw, auth.metadata(context),
                                                             loop, fut))
        except QStateError as exc:  # the engine failed inside (EngineFailed): its 500
            await _fail(context, method, exc)
            raise AssertionError("abort raises") from exc
        if got[0] == "ok":
            ok.inc()
            latency.observe(time.perf_counter() - t0)
            return got[1]  # type: ignore[return-value]
        _, code, message, trailers = got  # type: ignore[misc]
        RPCS.labels(method, code).inc()
        await context.abort(grpc.StatusCode[code], message, tuple(trailers))
        raise AssertionError("abort raises")

    return handle
