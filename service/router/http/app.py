"""The router's FastAPI app: every route (``reads``, ``top``, ``stream``, ``jobs``,
``probes``, the /ui page), one error shape (``ErrorBody``, with the status of its class and
Retry-After for a 503 or 429: ``qstate.router.wire``), each request counted by route template
and status, and the OpenAPI document (docs/architecture.md §5)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from qstate._engine import Engine
from qstate.core.address import MAX_KEY_BYTES, check_name
from qstate.core.config import DEFAULTS
from qstate.core.errors import InvalidRequest, QStateError
from qstate.router.http.jobs import add_job_routes, json_response
from qstate.router.http.probes import add_probes
from qstate.router.http.reads import COUNTED, add_read_routes, reads_first
from qstate.router.http.stream import add_watch_route
from qstate.router.http.top import add_top_route
from qstate.router.metrics import HTTP_LATENCY, HTTP_REQUESTS, http_method
from qstate.router.query import QueryService
from qstate.router.ui import mount_ui
from qstate.router.watch import WatchHub
from qstate.router.wire import JSON, error_response

__all__ = ["create_app", "create_asgi", "json_response"]


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
            if scope.get(COUNTED):  # a read: the engine counted it
                return
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


def create_app(query: QueryService, engine: Engine, ready: Callable[[], bool] = lambda: True,
               hub: WatchHub | None = None) -> FastAPI:
    app = FastAPI(title="qstate", version="1",
                  description="Live per-key window aggregates of Spark Structured Streaming "
                              "jobs, served from RocksDB shards.")
    def _error(exc: QStateError) -> Response:
        status, body, headers = error_response(exc)
        return Response(body, status_code=status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(_: Request, exc: RequestValidationError) -> Response:
        # a name that breaks its documented pattern gets the words of qstate.core.address,
        # the read core's (tests/vectors/address.json), whichever route saw it
        try:
            for e in exc.errors():
                loc = e.get("loc", ())
                if len(loc) == 2 and loc[0] == "path" and isinstance(e.get("input"), str):
                    check_name(str(loc[1]), e["input"])
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

    watches = hub or WatchHub.of(query, DEFAULTS)
    add_read_routes(app, engine, query.max_windows, query.min_batch_wait_s)
    app.add_middleware(_Measured)
    add_top_route(app, query, watches)
    add_watch_route(app, watches, query.max_top_n, query.retry_after_s)
    add_job_routes(app, query)

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
    add_probes(app, ready)
    mount_ui(app)
    return app


def create_asgi(query: QueryService, engine: Engine, ready: Callable[[], bool] = lambda: True,
                hub: WatchHub | None = None) -> Any:
    """The router's HTTP app as served: the read core ahead of FastAPI's (``reads_first``)."""
    return reads_first(create_app(query, engine, ready, hub), engine)
