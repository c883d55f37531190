"""HTTP front end (FastAPI): GET a key, batchGet many, list and describe jobs.

Bodies are the models of ``qstate.core.answer``, serialized by those models; errors are
``ErrorBody`` with the status of their class (``qstate.core.errors``) and, for a 503, a
Retry-After header.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Annotated, Any, Literal

import orjson
from fastapi import Body, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException

from qstate.core.address import MAX_KEY_BYTES, NAME_PATTERN, check_key, check_name
from qstate.core.answer import (
    NEXT_FROM,
    BatchAnswer,
    ClusterInfo,
    JobInfo,
    JobList,
    JobPosition,
    JobSummary,
    OperatorInfo,
    Point,
    Series,
    StateAnswer,
    StateInfo,
    TopAnswer,
    WatchEvent,
    WindowInfo,
    error_responses,
)
from qstate.core.config import DEFAULTS
from qstate.core.errors import InvalidRequest, QStateError
from qstate.router.cluster import cluster
from qstate.router.metrics import (
    HTTP_LATENCY,
    HTTP_REQUESTS,
    exposition,
    http_method,
)
from qstate.router.position import TOPIC_PATTERN
from qstate.router.query import OperatorStatus, QueryService, absent
from qstate.router.ui import mount_ui
from qstate.router.watch import WatchClosed, WatchHub
from qstate.router.wire import (
    JSON,
    TIME_PATTERN,
    answer_fields,
    batch_answer_json,
    error_response,
    parse_limit,
    parse_min_batch,
    parse_time,
    time_range,
    top_fields,
    watch_event_json,
)

__all__ = ["create_app", "json_response"]

# A watch's stream: a send that waits longer than this (a client that stopped reading with
# full buffers) ends the stream rather than hold it (the client resumes); the pings that
# keep it open are QSTATE_WATCH_PING_S apart.
SEND_TIMEOUT_S = 30


KeyItem = Annotated[str, Field(min_length=1, max_length=MAX_KEY_BYTES)]


class BatchGetIn(BaseModel):
    # the cap is this router's max_batch_keys, checked by the query core for HTTP and gRPC
    # alike and stated in the document by ``create_app``'s openapi()
    keys: list[KeyItem] = Field(description="Each 1 to "
                                f"{MAX_KEY_BYTES} bytes of UTF-8")
    model_config = {"extra": "forbid",
                    "json_schema_extra": {"examples": [{"keys": ["tw-1", "tw-2", "tw-404"]}]}}


class StatesBatchGetIn(BaseModel):
    # keys × states is bounded by this router's max_batch_keys, checked by the query core
    keys: list[KeyItem] = Field(description=f"Each 1 to {MAX_KEY_BYTES} bytes of UTF-8")
    states: list[str] = Field(description="States of the operator, each named once; every "
                              "key is answered in each, in this order")
    model_config = {"extra": "forbid", "json_schema_extra": {"examples": [
        {"keys": ["tw-1", "tw-404"], "states": ["impressions", "clicks"]}]}}


def json_response(model: BaseModel) -> Response:
    return Response(model.model_dump_json(), media_type=JSON)


def _operator(s: OperatorStatus) -> OperatorInfo:
    sp = s.spec
    return OperatorInfo(
        name=sp.operator, key=sp.key,
        states=[StateInfo(name=n, type=t) for n, t in sp.types.items()],
        window=WindowInfo(kind=sp.window.kind, size_ms=sp.window.size_ms,
                          slide_ms=sp.window.slide_ms, gap_ms=sp.window.gap_ms),
        partitions=sp.partitions, partitions_available=s.partitions_available,
        retention_ms=sp.retention_ms, last_batch=s.last_batch, watermark=s.watermark_ms)


Name = Annotated[str, Path(pattern=NAME_PATTERN, description="1 to 64 characters of "
                           "A-Z a-z 0-9 _ . -, not starting with . or -")]
Key = Annotated[str, Path(min_length=1, max_length=MAX_KEY_BYTES,
                          description=f"The grouping key: 1 to {MAX_KEY_BYTES} bytes of UTF-8 "
                          "(URL-encoded; a non-ASCII character counts 2-4 bytes)")]
_TIME_DOC = ("epoch milliseconds (at most 19 digits), an ISO-8601 date or time (naive: UTC), "
             "or relative to now: now, now-1h, now+5m (units ms s m h d w)")
From = Annotated[str | None, Query(alias="from", description=f"Windows starting at or after: "
                                   f"{_TIME_DOC}. With neither from nor to: the latest window",
                                   examples=["2026-01-01T10:00:00Z"],
                                   json_schema_extra={"pattern": TIME_PATTERN})]
To = Annotated[str | None, Query(description=f"Windows starting before (exclusive): "
                                 f"{_TIME_DOC}; must be after from", examples=["now"],
                                 json_schema_extra={"pattern": TIME_PATTERN})]


def _may_read(request: Request, job: str, operator: str | None = None) -> bool:
    """Whether the request's token (``qstate.router.auth`` leaves it in the request's state
    when the router asks for tokens) may read ``job`` (``operator``)."""
    principal = getattr(request.state, "principal", None)
    return principal is None or principal.allows(job, operator)


def _not_null(param: dict[str, Any]) -> None:
    """An optional query parameter is absent or a value, never null (a query string has no
    null): its schema says so, and a generator does not send the text "null"."""
    schema = param.get("schema", {})
    kinds = schema.get("anyOf")
    if param.get("in") == "query" and kinds and {"type": "null"} in kinds:
        rest = [k for k in kinds if k != {"type": "null"}]
        if len(rest) == 1:
            del schema["anyOf"]
            schema.update(rest[0])


class _Measured:
    """Each request's latency (to the start of its answer: a watch's stream is open long
    after) and count by route template and status. Plain ASGI: Starlette's
    BaseHTTPMiddleware passes every chunk of a body through a stream and a task of its own,
    which was most of a watch event's cost on the router (docs/architecture.md §5, watch)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        started = False

        def count(status: int) -> None:
            # the route's template, never the path asked: a label per key would be a
            # series per key
            route = getattr(scope.get("route"), "path_format", None) or "unmatched"
            HTTP_LATENCY.labels(route).observe(time.perf_counter() - t0)
            HTTP_REQUESTS.labels(route, http_method(scope["method"]), str(status)).inc()

        async def measured(message: dict[str, Any]) -> None:
            nonlocal started
            if not started and message["type"] == "http.response.start":
                started = True
                count(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, measured)
        except BaseException:
            if not started:  # answered 500 by Starlette's outermost handler
                count(500)
            raise


def _last_event_id(value: str | None) -> int | None:
    """SSE's Last-Event-ID: the batch of the last event a reconnecting client got."""
    if value is None or not value.strip():
        return None
    try:
        return int(value)
    except ValueError:
        raise InvalidRequest(f"Last-Event-ID {value[:40]!r} is not a batch number (the id "
                             "of a watch event)") from None


def create_app(query: QueryService, ready: Callable[[], bool] = lambda: True,
               hub: WatchHub | None = None) -> FastAPI:
    app = FastAPI(title="qstate", version="1",
                  description="Live per-key window aggregates of Spark Structured Streaming "
                              "jobs, served from RocksDB shards.")
    errors = error_responses()
    most = query.max_windows
    # this router's max_windows, so the document states the bound it enforces (a default,
    # not an Annotated alias: annotations here are strings resolved in the module's globals)
    limit_param = Query(
        None, ge=1, le=most, description=f"Most windows per key in a range answer (default "
        f"and most: {most}, QSTATE_MAX_WINDOWS). An answer cut short carries next_from: ask "
        "again with from=next_from for the next page")
    min_batch_param = Query(
        None, ge=0, description="Read your writes: answer as of this batch or a later one, "
        f"waiting up to {query.min_batch_wait_s:g} s (QSTATE_MIN_BATCH_WAIT_S) for the "
        "partitions read to have it; then 503 + Retry-After naming the batch they have. "
        "Every answer carries the batch it reflects")

    savepoint_param = Query(
        None, description="Answer as of this savepoint of the job (`qstate savepoint "
        "create`), its batch in the answer; the first read of a partition opens it on its "
        "shard server and answers 503 + Retry-After meanwhile. Not with min_batch",
        pattern=NAME_PATTERN)

    app.add_middleware(_Measured)

    def _error(exc: QStateError) -> Response:
        status, body, headers = error_response(exc)
        return Response(body, status_code=status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(_: Request, exc: RequestValidationError) -> Response:
        # A name or key that breaks its documented pattern gets the very answer the fast
        # path gives (qstate.core.address words it), whichever route saw it.
        try:
            for e in exc.errors():
                loc = e.get("loc", ())
                if len(loc) == 2 and loc[0] == "path" and isinstance(e.get("input"), str):
                    if loc[1] == "key":
                        check_key(e["input"])
                    else:
                        check_name(str(loc[1]), e["input"])
                if loc == ("query", "limit"):  # the fast path's words for a bad limit
                    parse_limit(str(e.get("input")), most)
                if loc == ("query", "min_batch"):
                    parse_min_batch(str(e.get("input")))
                if loc == ("query", "savepoint"):
                    check_name("savepoint name", str(e.get("input")))
        except QStateError as named:
            return _error(named)
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or 'body'}: {e['msg']}"
            for e in exc.errors())
        return _error(InvalidRequest(f"invalid request: {problems}"))

    @app.exception_handler(QStateError)
    async def on_query_error(_: Request, exc: QStateError) -> Response:
        return _error(exc)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(_: Request, exc: StarletteHTTPException) -> Response:
        # Starlette's own answers (no such route 404, wrong method 405, a body FastAPI could
        # not read 400) in the one documented error shape, not {"detail": ...}
        name = {400: "InvalidRequest", 404: "NotFound"}.get(exc.status_code, "HTTPError")
        return Response(orjson.dumps({"error": name, "message": str(exc.detail)}),
                        status_code=exc.status_code,
                        headers={**(exc.headers or {}), "content-type": JSON})

    @app.get("/v1/state/{job}/{operator}/{state}/{key:path}", response_model=StateAnswer,
             responses=errors, summary="The latest window of a key, or its windows in a range")
    async def get_state(job: Name, operator: Name, state: Name, key: Key, from_: From = None,
                        to: To = None, limit: int | None = limit_param,
                        min_batch: int | None = min_batch_param,
                        savepoint: str | None = savepoint_param) -> Any:
        a = await query.get(query.point(job, operator, state, key, time_range(from_, to), limit,
                                        min_batch, savepoint))
        if not a.found:
            raise absent(a)
        return json_response(a)

    @app.post("/v1/state/{job}/{operator}/{state}:batchGet", response_model=BatchAnswer,
              responses=error_responses(body=True),
              summary="Many keys of one state; misses are marked")
    async def batch_get(job: Name, operator: Name, state: Name,
                        body: Annotated[BatchGetIn, Body()], from_: From = None,
                        to: To = None, limit: int | None = limit_param,
                        min_batch: int | None = min_batch_param,
                        savepoint: str | None = savepoint_param) -> Any:
        q = query.batch(job, operator, state, body.keys, time_range(from_, to), limit,
                        min_batch, savepoint)
        spec, hits = await query.multi_lookup(q)
        return Response(batch_answer_json(
            answer_fields(spec.job, spec.operator, q.state, k, h.found, h.batch,
                          h.watermark_ms, h.windows, h.next_from) for k, h in hits),
            media_type=JSON)

    @app.post("/v1/state/{job}/{operator}:batchGet", response_model=BatchAnswer,
              responses=error_responses(body=True),
              summary="Many keys of several states of one operator: each key's states as of "
                      "one batch, key by key in the states' order; misses are marked")
    async def batch_get_states(job: Name, operator: Name,
                               body: Annotated[StatesBatchGetIn, Body()], from_: From = None,
                               to: To = None, limit: int | None = limit_param,
                               min_batch: int | None = min_batch_param,
                               savepoint: str | None = savepoint_param) -> Any:
        qs = query.states_batch(job, operator, body.states, body.keys, time_range(from_, to),
                                limit, min_batch, savepoint)
        spec, hits = await query.multi_states(qs)
        return Response(batch_answer_json(
            answer_fields(spec.job, spec.operator, s, k, h.found, h.batch, h.watermark_ms,
                          h.windows, h.next_from) for k, s, h in hits), media_type=JSON)

    @app.get("/v1/series/{job}/{operator}/{state}/{key:path}", response_model=Series,
             responses={**errors, 200: {"headers": {NEXT_FROM: {
                 "description": "Set when the range held more than limit windows: the start "
                                "of the next one; ask again with from=<it> for the rest",
                 "schema": {"type": "integer"}}}}},
             summary="A key's windows as points [{time, value}], for dashboards; [] when the "
                     "key has no data")
    async def get_series(job: Name, operator: Name, state: Name, key: Key, from_: From = None,
                         to: To = None, limit: int | None = limit_param,
                         min_batch: int | None = min_batch_param,
                         savepoint: str | None = savepoint_param) -> Any:
        a = await query.get(query.point(job, operator, state, key, time_range(from_, to), limit,
                                        min_batch, savepoint))
        out = json_response(Series([
            Point.model_construct(time=a.watermark if w.start is None else w.start,
                                  value=w.value) for w in a.windows]))
        if a.next_from is not None:
            out.headers[NEXT_FROM] = str(a.next_from)
        return out

    watches = hub or WatchHub.of(query, DEFAULTS)
    max_n = query.max_top_n
    n_param = Query(None, ge=1, le=max_n, description=f"How many keys (default 10; most: "
                    f"{max_n}, QSTATE_MAX_TOP_N)")

    @app.get("/v1/top/{job}/{operator}/{state}", response_model=TopAnswer, responses=errors,
             summary="The n keys with the largest (or smallest) value in one window, across "
                     "every partition; ties by key")
    async def get_top(job: Name, operator: Name, state: Name, n: int | None = n_param,
                      order: Annotated[Literal["desc", "asc"], Query(
                          description="desc: largest first; asc: smallest first")] = "desc",
                      window: Annotated[str, Query(
                          description="current: the oldest window still open at the "
                          f"watermark (the one still counting); or a time ({_TIME_DOC}): "
                          "the newest window starting at or before it. Ignored for state "
                          "without windows", examples=["current", "now-1h"],
                          json_schema_extra={"pattern": f"^(?:current|{TIME_PATTERN[1:-1]})$"})
                      ] = "current",
                      min_batch: int | None = min_batch_param,
                      savepoint: str | None = savepoint_param) -> Any:
        start = None if window == "current" else parse_time("window", window)
        r = await watches.top(query.top_query(job, operator, state, n, order == "desc", start,
                                              min_batch, savepoint))
        return Response(orjson.dumps(top_fields(r, order == "desc")), media_type=JSON)


    # defaults, not Annotated aliases, as limit_param above: they state this router's bounds
    key_param = Query(None, description=f"A key to watch (repeat: at most "
                      f"{watches.max_keys}, QSTATE_MAX_WATCH_KEYS); or top")
    top_param = Query(None, ge=1, le=max_n, description="Watch the current window's top n "
                      f"instead of keys (most: {max_n}, QSTATE_MAX_TOP_N)")

    @app.get("/v1/watch/{job}/{operator}/{state}", response_model=WatchEvent,
             response_class=EventSourceResponse, responses=errors,
             summary="Pushed changes (Server-Sent Events): after each committed batch, the "
                     "watched keys whose value changed, or the top-N board when it changed")
    async def watch(job: Name, operator: Name, state: Name,
                    key: list[str] | None = key_param, top: int | None = top_param,
                    order: Annotated[Literal["desc", "asc"], Query(
                        description="With top: desc, largest first; asc")] = "desc",
                    from_batch: Annotated[int | None, Query(
                        ge=-1, description="Resume after this batch (an event's id): only "
                        "what changed since, or every value (snapshot) when this router "
                        "cannot tell. Last-Event-ID, sent by a reconnecting EventSource, "
                        "takes precedence")] = None,
                    last_event_id: Annotated[str | None, Header(
                        alias="Last-Event-ID", include_in_schema=False)] = None) -> Any:
        resumed = _last_event_id(last_event_id)
        w = await watches.open(watches.watch_query(
            job, operator, state, key or (), top, order == "desc",
            resumed if resumed is not None else from_batch), "http")

        async def events() -> Any:
            retry: int | None = int(query.reads.retry_after_s * 1000)
            try:
                while True:
                    p = await w.next()
                    yield ServerSentEvent(data=watch_event_json(p).decode(), id=str(p.batch),
                                          retry=retry)
                    retry = None  # once, with the first event
            except WatchClosed:
                return
            finally:
                w.close()

        # closed after the response too: a generator that never started (a client gone
        # before the stream began) runs no finally, and the watch must not outlive it
        return EventSourceResponse(events(), ping=watches.ping_s, send_timeout=SEND_TIMEOUT_S,
                                   headers={"Cache-Control": "no-cache",
                                            "X-Accel-Buffering": "no"},
                                   background=BackgroundTask(w.close))

    @app.get("/v1/jobs", response_model=JobList, responses=errors,
             summary="Jobs whose state is queryable (with tokens: those the token may read)")
    async def list_jobs(request: Request) -> Any:
        jobs = await query.jobs()
        return json_response(JobList(jobs=[
            JobSummary(name=j, operators=[s.operator for s in specs
                                          if _may_read(request, j, s.operator)])
            for j, specs in jobs.items() if _may_read(request, j)]))

    @app.get("/v1/jobs/{job}", response_model=JobInfo, responses=errors,
             summary="Operators, states, windows, partitions, last batch and watermark")
    async def describe_job(request: Request, job: Name) -> Any:
        ops = await query.describe_job(job)
        return json_response(JobInfo(name=job, operators=[
            _operator(s) for s in ops if _may_read(request, job, s.spec.operator)]))

    @app.get("/v1/jobs/{job}/position", response_model=JobPosition, responses=errors,
             summary="The batch that counted a Kafka record: read with min_batch=<it> to "
                     "read your own writes")
    async def job_position(
            job: Name,
            topic: Annotated[str, Query(pattern=TOPIC_PATTERN,
                                        description="The Kafka topic the job reads")],
            partition: Annotated[int, Query(ge=0, description="The record's partition")],
            offset: Annotated[int, Query(ge=0, lt=2**63, description="The record's offset, "
                                         "as the producer's delivery report gives it")]
    ) -> Any:
        p = await query.position(job, topic, partition, offset)
        return json_response(JobPosition(job=p.job, topic=p.topic, partition=p.partition,
                                         offset=p.offset, batch=p.batch,
                                         end_offset=p.end_offset))

    @app.get("/v1/cluster", response_model=ClusterInfo,
             summary="Shard servers, their partitions and how each stands: state, last batch, "
                     "watermark, freshness")
    async def describe_cluster() -> Any:
        await query.routing.refresh()
        return json_response(await cluster(query.routing, query.describer))

    def openapi() -> dict[str, Any]:
        """FastAPI's document, minus the 422 answers it adds by default: a request that does
        not validate is answered 400 with an ErrorBody (``on_invalid`` above)."""
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version,
                              description=app.description, routes=app.routes)
            for ops in doc["paths"].values():
                for op in ops.values():
                    op.get("responses", {}).pop("422", None)
                    for param in op.get("parameters", ()):
                        _not_null(param)
            for name in ("HTTPValidationError", "ValidationError"):
                doc.get("components", {}).get("schemas", {}).pop(name, None)
            cap = query.max_batch_keys  # the settings this router runs with
            keys = doc["components"]["schemas"]["BatchGetIn"]["properties"]["keys"]
            keys["maxItems"] = cap
            keys["description"] = (f"At most {cap} keys (QSTATE_MAX_BATCH_KEYS), each 1 to "
                                   f"{MAX_KEY_BYTES} bytes of UTF-8")
            # tokens are asked for only by a router given a tokens file; the document
            # serves both kinds, so a bearer token is offered, and none is also allowed
            doc.setdefault("components", {})["securitySchemes"] = {"bearer": {
                "type": "http", "scheme": "bearer",
                "description": "A client token (`qstate token add`), required when the "
                               "router has a tokens file (QSTATE_TOKENS_FILE): 401 without "
                               "or with an unknown one, 403 outside its scopes"}}
            doc["security"] = [{"bearer": []}, {}]
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> Any:
        return {"status": "ok", "pid": os.getpid()}  # which worker answered (--workers)

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> Any:
        ok = bool(ready())
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        body, media_type = exposition()
        return Response(body, media_type=media_type)

    mount_ui(app)
    return app
