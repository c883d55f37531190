"""gRPC front end (grpc.aio) of the public API, proto/qstate.proto."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from qstate._engine import Engine
from qstate.core.config import DEFAULTS
from qstate.core.errors import InvalidRequest, QStateError, grpc_trailers
from qstate.core.records.operator import OperatorSpec
from qstate.core.transport.values import set_value
from qstate.proto import qstate_pb2 as pb
from qstate.proto import qstate_pb2_grpc as pb_grpc
from qstate.router.auth import GrpcAuth
from qstate.router.metrics import GRPC_LATENCY as RPC_LATENCY
from qstate.router.metrics import GRPC_REQUESTS as RPCS
from qstate.router.metrics import count_error
from qstate.router.query import QueryService, absent_key
from qstate.router.reads import Hit
from qstate.router.top import TopResult
from qstate.router.watch import Push, WatchClosed, WatchHub
from qstate.router.wire import FAR

__all__ = ["QueryableStateService", "serve_api"]

# every method's OK series from the start, at 0 (a dashboard shows 0, not "No data")
for _method in pb.DESCRIPTOR.services_by_name["QueryableState"].methods_by_name:
    RPCS.labels(_method, "OK")


def _value(spec: OperatorSpec, state: str, key: str, h: Hit) -> pb.StateValue:
    """The answer to one key: what ``StateAnswer`` holds, as the proto message (made from the
    read's rows, not from a model: MultiGet makes one per key)."""
    out = pb.StateValue(job=spec.job, operator=spec.operator, state=state, key=key,
                        found=h.found, batch=h.batch, watermark_ms=h.watermark_ms)
    if h.next_from is not None:
        out.next_from_ms = h.next_from
    for w in h.windows:
        pw = out.windows.add()
        if w.start is not None:
            pw.start_ms = w.start
            pw.end_ms = w.end if w.end is not None else 0
        set_value(pw, w.value)
    return out


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


def _range(req: pb.GetRequest | pb.MultiGetRequest) -> tuple[int, int] | None:
    has_from, has_to = req.HasField("from_ms"), req.HasField("to_ms")
    if not has_from and not has_to:
        return None
    return (req.from_ms if has_from else -FAR, req.to_ms if has_to else FAR)


def _limit(req: pb.GetRequest | pb.MultiGetRequest) -> int | None:
    return req.limit if req.HasField("limit") else None


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

    async def Get(self, request: pb.GetRequest, context: grpc.aio.ServicerContext
                  ) -> pb.StateValue:
        t0 = time.perf_counter()
        try:
            self.auth.check(context, request.job, request.operator)
            q = self.query.point(request.job, request.operator, request.state, request.key,
                                 _range(request), _limit(request), _min_batch(request),
                                 _savepoint(request))
            spec, key, hit = await self.query.lookup(q)
            if not hit.found:
                raise absent_key(spec.job, spec.operator, q.state, key, hit.batch,
                                 hit.watermark_ms)
        except QStateError as exc:
            await _fail(context, "Get", exc)
        RPCS.labels("Get", "OK").inc()
        RPC_LATENCY.labels("Get").observe(time.perf_counter() - t0)
        return _value(spec, q.state, key, hit)

    async def MultiGet(self, request: pb.MultiGetRequest, context: grpc.aio.ServicerContext
                       ) -> pb.MultiGetResponse:
        t0 = time.perf_counter()
        try:
            self.auth.check(context, request.job, request.operator)
            if request.states:  # several states of one operator
                if request.state:
                    raise InvalidRequest("name the states in 'states', or one in 'state': "
                                         "not both")
                qs = self.query.states_batch(
                    request.job, request.operator, list(request.states), request.keys,
                    _range(request), _limit(request), _min_batch(request), _savepoint(request))
                spec, several = await self.query.multi_states(qs)
                results = [_value(spec, s, k, h) for k, s, h in several]
            else:
                q = self.query.batch(request.job, request.operator, request.state,
                                     request.keys, _range(request), _limit(request),
                                     _min_batch(request), _savepoint(request))
                spec, hits = await self.query.multi_lookup(q)
                results = [_value(spec, q.state, k, h) for k, h in hits]
        except QStateError as exc:
            await _fail(context, "MultiGet", exc)
        RPCS.labels("MultiGet", "OK").inc()
        RPC_LATENCY.labels("MultiGet").observe(time.perf_counter() - t0)
        return pb.MultiGetResponse(results=results)

    async def Top(self, request: pb.TopRequest, context: grpc.aio.ServicerContext
                  ) -> pb.TopResponse:
        t0 = time.perf_counter()
        try:
            self.auth.check(context, request.job, request.operator)
            q = self.query.top_query(
                request.job, request.operator, request.state, request.n or None,
                not request.ascending,
                request.window_start_ms if request.HasField("window_start_ms") else None,
                _min_batch(request), _savepoint(request))
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


class _Handlers:
    """Records what the generated ``add_..._to_server`` registers (its method handlers)."""

    def __init__(self) -> None:
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, _: Any) -> None:
        pass

    def add_registered_method_handlers(self, _: str, handlers: dict[str, Any]) -> None:
        self.handlers = dict(handlers)


def serve_api(service: QueryableStateService, server: grpc.aio.Server,
              engine: Engine | None = None) -> None:
    """The public API (``qstate.v1.QueryableState``) on ``server``. With ``engine``, ``Get``
    and ``MultiGet`` of partitions on this host are answered with the bytes the engine encodes
    from the request's (docs/architecture.md §5); every other request, and the engine's
    misses, take the methods above."""
    rec = _Handlers()
    pb_grpc.add_QueryableStateServicer_to_server(service, rec)  # type: ignore[arg-type]
    handlers = rec.handlers
    if engine is not None:
        for method, parse, multi in (("Get", pb.GetRequest.FromString, False),
                                     ("MultiGet", pb.MultiGetRequest.FromString, True)):
            handlers[method] = grpc.unary_unary_rpc_method_handler(
                _engine_first(service, engine, method, parse, multi))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)


SERVICE = "qstate.v1.QueryableState"


def _engine_first(service: QueryableStateService, engine: Engine, method: str,
                  parse: Callable[[bytes], Any], multi: bool
                  ) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]:
    """A raw method (bytes in, bytes out): the engine's answer when it has one, else the
    service's method, serialized here."""
    fallback = getattr(service, method)
    latency, ok = RPC_LATENCY.labels(method), RPCS.labels(method, "OK")

    async def handle(raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        t0 = time.perf_counter()
        request = parse(raw)
        try:
            service.auth.check(context, request.job, request.operator)
        except QStateError as exc:
            await _fail(context, method, exc)
        answer = engine.grpc_read(raw, multi)
        if answer is None:
            return (await fallback(request, context)).SerializeToString()  # type: ignore[no-any-return]
        ok.inc()
        latency.observe(time.perf_counter() - t0)
        return answer

    return handle
