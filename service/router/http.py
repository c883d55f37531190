"""HTTP front end (FastAPI): GET a key, batchGet many, list and describe jobs."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Annotated, Any

import orjson
from fastapi import Body, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import ORJSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest
from pydantic import BaseModel, Field

from service.errors import InvalidRequest, NotFound, QueryError
from service.router.query import Answer, OperatorStatus, QueryService

REQUESTS = Counter("qstate_router_http_requests_total", "HTTP requests", ["route", "status"])
LATENCY = Histogram("qstate_router_http_request_seconds", "HTTP request latency", ["route"],
                    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1))


class WindowOut(BaseModel):
    start: int | None = Field(description="Window start, epoch ms (null: not windowed)")
    end: int | None = Field(description="Window end, epoch ms, exclusive")
    value: int | float | None = Field(description="The aggregate; counts are exact integers")


class StateOut(BaseModel):
    job: str
    operator: str
    state: str
    key: str
    batch: int = Field(description="The job's batch this answer reflects")
    watermark: int = Field(description="The event-time watermark at that batch, epoch ms")
    windows: list[WindowOut]

    model_config = {"json_schema_extra": {"examples": [{
        "job": "tweets", "operator": "per_tweet_1h", "state": "impressions", "key": "tw-42",
        "batch": 311, "watermark": 1767225590000,
        "windows": [{"start": 1767225600000, "end": 1767229200000, "value": 17}]}]}}


class BatchItem(StateOut):
    found: bool


class BatchGetIn(BaseModel):
    keys: list[str] = Field(max_length=1000, description="At most 1000 keys")
    model_config = {"json_schema_extra": {"examples": [{"keys": ["tw-1", "tw-2", "tw-404"]}]}}


class BatchGetOut(BaseModel):
    results: list[BatchItem]


class ErrorOut(BaseModel):
    error: str
    message: str


def state_body(a: Answer) -> dict[str, Any]:
    return {"job": a.job, "operator": a.operator, "state": a.state, "key": a.key,
            "batch": a.batch, "watermark": a.watermark_ms,
            "windows": [{"start": w.start, "end": w.end, "value": w.value} for w in a.windows]}


def _operator(s: OperatorStatus) -> dict[str, Any]:
    sp = s.spec
    return {"name": sp.operator, "key": sp.key,
            "states": [{"name": n, "type": t} for n, t in sp.states.items()],
            "window": {"kind": sp.window.kind, "size_ms": sp.window.size_ms,
                       "slide_ms": sp.window.slide_ms, "gap_ms": sp.window.gap_ms},
            "partitions": sp.partitions, "partitions_available": s.partitions_available,
            "retention_ms": sp.retention_ms, "last_batch": s.last_batch,
            "watermark": s.watermark_ms}


def parse_time(name: str, value: str | None) -> int | None:
    """Epoch milliseconds, or ISO-8601 (a naive time is UTC)."""
    if value is None:
        return None
    v = value.strip()
    if v.lstrip("-").isdigit():
        return int(v)
    try:
        dt = datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidRequest(f"'{name}' must be epoch milliseconds or ISO-8601 "
                             f"(e.g. 2026-01-01T10:00:00Z), not {value!r}") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() * 1000)


def time_range(from_: str | None, to: str | None) -> tuple[int, int] | None:
    lo, hi = parse_time("from", from_), parse_time("to", to)
    if lo is None and hi is None:
        return None
    return (lo if lo is not None else -(1 << 62), hi if hi is not None else 1 << 62)


def retry_after(exc: QueryError) -> int:
    """Whole seconds for the Retry-After header (HTTP has no finer unit)."""
    return max(1, round(getattr(exc, "retry_after_s", 1.0)))


def _error(exc: QueryError) -> ORJSONResponse:
    headers = {}
    if exc.http_status == 503:
        headers["Retry-After"] = str(retry_after(exc))
    return ORJSONResponse(exc.body(), status_code=exc.http_status, headers=headers)


ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorOut, "description": "Invalid name, key or time range"},
    404: {"model": ErrorOut, "description": "Unknown job/operator/state, or no data for the key"},
    503: {"model": ErrorOut, "description": "Shard unavailable; retry after Retry-After"},
}


def create_app(query: QueryService, ready: Any = lambda: True) -> FastAPI:
    app = FastAPI(title="qstate", version="1",
                  description="Live per-key window aggregates of Spark Structured Streaming "
                              "jobs, served from RocksDB shards.",
                  default_response_class=ORJSONResponse)

    @app.middleware("http")
    async def measure(request: Request, call_next):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        path = getattr(route, "path", "unmatched")
        LATENCY.labels(path).observe(time.perf_counter() - t0)
        REQUESTS.labels(path, str(response.status_code)).inc()
        return response

    @app.exception_handler(RequestValidationError)
    async def on_invalid(_: Request, exc: RequestValidationError) -> ORJSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or 'body'}: {e['msg']}"
            for e in exc.errors())
        return _error(InvalidRequest(f"invalid request: {problems}"))

    @app.exception_handler(QueryError)
    async def on_query_error(_: Request, exc: QueryError) -> ORJSONResponse:
        return _error(exc)

    @app.get("/v1/state/{job}/{operator}/{state}/{key:path}", response_model=StateOut,
             responses=ERRORS, summary="The latest window of a key, or its windows in a range")
    async def get_state(job: str, operator: str, state: str, key: str,
                        from_: Annotated[str | None, Query(
                            alias="from", description="Epoch ms or ISO-8601",
                            examples=["2026-01-01T10:00:00Z"])] = None,
                        to: Annotated[str | None, Query(description="Epoch ms or ISO-8601 "
                                                        "(exclusive)")] = None) -> Any:
        a = await query.get(job, operator, state, key, time_range(from_, to))
        if not a.found:
            raise NotFound(f"key {key[:200]!r} has no data in {job}/{operator}/{state} as of "
                           f"batch {a.batch}", batch=a.batch, watermark=a.watermark_ms)
        return Response(orjson.dumps(state_body(a)), media_type="application/json")

    @app.post("/v1/state/{job}/{operator}/{state}:batchGet", response_model=BatchGetOut,
              responses=ERRORS, summary="Many keys of one state; misses are marked")
    async def batch_get(job: str, operator: str, state: str,
                        body: Annotated[BatchGetIn, Body()],
                        from_: Annotated[str | None, Query(alias="from")] = None,
                        to: Annotated[str | None, Query()] = None) -> Any:
        answers = await query.multi_get(job, operator, state, body.keys, time_range(from_, to))
        return Response(orjson.dumps({"results": [{**state_body(a), "found": a.found}
                                                  for a in answers]}),
                        media_type="application/json")

    @app.get("/v1/jobs", summary="Jobs whose state is queryable")
    async def list_jobs() -> Any:
        jobs = await query.jobs()
        return {"jobs": [{"name": j, "operators": [s.operator for s in specs]}
                         for j, specs in jobs.items()]}

    @app.get("/v1/jobs/{job}", responses=ERRORS,
             summary="Operators, states, windows, partitions, last batch and watermark")
    async def describe_job(job: str) -> Any:
        ops = await query.describe_job(job)
        return {"name": job, "operators": [_operator(s) for s in ops]}

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> Any:
        return {"status": "ok"}

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> Any:
        ok = bool(ready())
        return ORJSONResponse({"ready": ok}, status_code=200 if ok else 503)

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return app
