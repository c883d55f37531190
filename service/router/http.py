"""HTTP front end (FastAPI): GET a key, batchGet many, list and describe jobs.

Bodies are the models of ``service.core.answer``, serialized by those models; errors are
``ErrorBody`` with the status of their class (``service.core.errors``) and, for a 503, a
Retry-After header.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any

import orjson
from fastapi import Body, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.core.address import MAX_KEY_BYTES, NAME_PATTERN, check_key, check_name
from service.core.answer import (
    BatchAnswer,
    ClusterInfo,
    JobInfo,
    JobList,
    JobSummary,
    OperatorInfo,
    Point,
    Series,
    StateAnswer,
    StateInfo,
    WindowInfo,
    error_responses,
)
from service.core.config import DEFAULTS
from service.core.errors import InvalidRequest, QStateError
from service.router.cluster import cluster
from service.router.metrics import (
    HTTP_LATENCY,
    HTTP_REQUESTS,
    count_refused,
    count_unavailable,
    http_method,
)
from service.router.query import OperatorStatus, QueryService, absent
from service.router.ui import mount_ui

__all__ = ["create_app", "error_response", "json_response", "time_range"]

JSON = "application/json"
FAR = 1 << 62  # an open end of a time range


class BatchGetIn(BaseModel):
    keys: list[str] = Field(max_length=DEFAULTS.max_batch_keys,
                            description=f"At most {DEFAULTS.max_batch_keys} keys")
    model_config = {"extra": "forbid",
                    "json_schema_extra": {"examples": [{"keys": ["tw-1", "tw-2", "tw-404"]}]}}


# Grafana's relative times: now, now-1h, now-30m, now+5m. A "+" left unencoded in a query
# string arrives as a space, so a space counts as "+".
_RELATIVE = re.compile(r"now(?:([-+ ])(\d+)(ms|s|m|h|d|w))?")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


def parse_time(name: str, value: str | None, now_ms: int | None = None) -> int | None:
    """Epoch milliseconds (Grafana's ``${__from}``), ISO-8601 (a naive time is UTC), or
    relative to now (``now-1h``)."""
    if value is None:
        return None
    v = value.strip()
    if v.lstrip("-").isdigit():
        return int(v)
    rel = _RELATIVE.fullmatch(v)
    if rel:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        sign, n, unit = rel.groups()
        return now if sign is None else now + (-1 if sign == "-" else 1) * int(n) * _UNIT_MS[unit]
    try:
        dt = datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidRequest(f"'{name}' must be epoch milliseconds, ISO-8601 "
                             f"(e.g. 2026-01-01T10:00:00Z) or relative to now (now-1h; units "
                             f"ms s m h d w), not {value!r}") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() * 1000)


def time_range(from_: str | None, to: str | None) -> tuple[int, int] | None:
    lo, hi = parse_time("from", from_), parse_time("to", to)
    if lo is None and hi is None:
        return None
    # beyond +-FAR is "open": clamped, so no time a client can write overflows an int64
    return (max(-FAR, min(FAR, lo if lo is not None else -FAR)),
            max(-FAR, min(FAR, hi if hi is not None else FAR)))


def retry_after(exc: QStateError) -> int:
    """Whole seconds for the Retry-After header (HTTP has no finer unit)."""
    return max(1, round(float(exc.detail.get("retry_after_s", 1.0))))


def error_response(exc: QStateError) -> tuple[int, bytes, dict[str, str]]:
    """Status, body and headers of an error answer: the one place they are decided (and
    503s counted by reason)."""
    headers = {"content-type": JSON}
    if "retry_after_s" in exc.detail:  # 503 unavailable, 429 overloaded
        headers["retry-after"] = str(retry_after(exc))
    if exc.http_status == 401:
        headers["www-authenticate"] = "Bearer"
    count_unavailable(exc)
    count_refused(exc)
    return exc.http_status, orjson.dumps(exc.body()), headers


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


Name = Annotated[str, Path(pattern=NAME_PATTERN, description="[A-Za-z0-9_.-]{1,64}")]
Key = Annotated[str, Path(min_length=1, max_length=MAX_KEY_BYTES,
                          description=f"The grouping key as UTF-8, at most {MAX_KEY_BYTES} "
                          "bytes (URL-encoded)")]
From = Annotated[str | None, Query(alias="from", description="Epoch ms, ISO-8601 or relative "
                                   "to now (now-1h; units ms s m h d w)",
                                   examples=["2026-01-01T10:00:00Z"])]
To = Annotated[str | None, Query(description="Epoch ms, ISO-8601 or relative to now "
                                 "(exclusive)", examples=["now"])]


def _may_read(request: Request, job: str, operator: str | None = None) -> bool:
    """Whether the request's token (``service.router.auth`` leaves it in the request's state
    when the router asks for tokens) may read ``job`` (``operator``)."""
    principal = getattr(request.state, "principal", None)
    return principal is None or principal.allows(job, operator)


def create_app(query: QueryService, ready: Callable[[], bool] = lambda: True) -> FastAPI:
    app = FastAPI(title="qstate", version="1",
                  description="Live per-key window aggregates of Spark Structured Streaming "
                              "jobs, served from RocksDB shards.")
    errors = error_responses()

    @app.middleware("http")
    async def measure(request: Request, call_next):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        response = await call_next(request)
        # the route's template, never the path asked: a label per key would be a series
        # per key
        route = getattr(request.scope.get("route"), "path_format", None) or "unmatched"
        HTTP_LATENCY.labels(route).observe(time.perf_counter() - t0)
        HTTP_REQUESTS.labels(route, http_method(request.method),
                             str(response.status_code)).inc()
        return response

    def _error(exc: QStateError) -> Response:
        status, body, headers = error_response(exc)
        return Response(body, status_code=status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(_: Request, exc: RequestValidationError) -> Response:
        # A name or key that breaks its documented pattern gets the very answer the fast
        # path gives (service.core.address words it), whichever route saw it.
        try:
            for e in exc.errors():
                loc = e.get("loc", ())
                if len(loc) == 2 and loc[0] == "path" and isinstance(e.get("input"), str):
                    if loc[1] == "key":
                        check_key(e["input"])
                    else:
                        check_name(str(loc[1]), e["input"])
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
                        to: To = None) -> Any:
        a = await query.get(job, operator, state, key, time_range(from_, to))
        if not a.found:
            raise absent(a)
        return json_response(a)

    @app.post("/v1/state/{job}/{operator}/{state}:batchGet", response_model=BatchAnswer,
              responses=errors, summary="Many keys of one state; misses are marked")
    async def batch_get(job: Name, operator: Name, state: Name,
                        body: Annotated[BatchGetIn, Body()], from_: From = None,
                        to: To = None) -> Any:
        answers = await query.multi_get(job, operator, state, body.keys, time_range(from_, to))
        return json_response(BatchAnswer.model_construct(results=answers))

    @app.get("/v1/series/{job}/{operator}/{state}/{key:path}", response_model=Series,
             responses=errors, summary="A key's windows as points [{time, value}], for "
             "dashboards; [] when the key has no data")
    async def get_series(job: Name, operator: Name, state: Name, key: Key, from_: From = None,
                         to: To = None) -> Any:
        a = await query.get(job, operator, state, key, time_range(from_, to))
        return json_response(Series([
            Point.model_construct(time=a.watermark if w.start is None else w.start,
                                  value=w.value) for w in a.windows]))

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

    @app.get("/v1/cluster", response_model=ClusterInfo,
             summary="Shard servers, their partitions and how each stands: state, last batch, "
                     "watermark, freshness")
    async def describe_cluster() -> Any:
        await query.routing.refresh()
        return json_response(await cluster(query.routing, query.reads.caller))

    def openapi() -> dict[str, Any]:
        """FastAPI's document, minus the 422 answers it adds by default: a request that does
        not validate is answered 400 with an ErrorBody (``on_invalid`` above)."""
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version,
                              description=app.description, routes=app.routes)
            for ops in doc["paths"].values():
                for op in ops.values():
                    op.get("responses", {}).pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                doc.get("components", {}).get("schemas", {}).pop(name, None)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> Any:
        return {"status": "ok"}

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> Any:
        ok = bool(ready())
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    mount_ui(app)
    return app
