"""The read routes: a key's latest window or its windows in a range, many keys of one state,
many keys of several states, a key's windows as points. FastAPI holds their definition (the
typed signatures below make the OpenAPI document and /docs); the read core answers them
(``qstate._engine``: the request's raw path, query and body, parsed, checked, read and
answered there, once), so the app answers exactly what the native front answers
(docs/architecture.md §5, one read core). Which requests are reads is the core's rule too
(``reads_first``). Behind the native front the app sees only what it hands over (a HEAD, say);
under the Python front (``QSTATE_NATIVE_FRONT=false``) every read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import Body, FastAPI
from fastapi.routing import APIRoute
from starlette.convertors import PathConvertor, register_url_convertor

from qstate._engine import Engine, answer, read_route
from qstate.core.answer import NEXT_FROM, BatchAnswer, Series, StateAnswer, error_responses
from qstate.core.errors import QStateError
from qstate.router.http.params import (
    AllowStale,
    BatchGetIn,
    From,
    Key,
    Name,
    StatesBatchGetIn,
    To,
    limit_param,
    min_batch_param,
    savepoint_param,
)
from qstate.router.metrics import HTTP_REQUESTS, http_method
from qstate.router.wire import send_error

__all__ = ["COUNTED", "add_read_routes", "reads_first"]

JSON = (b"content-type", b"application/json")


class _KeyConvertor(PathConvertor):
    """A key is any text after the third name, line breaks too (Starlette's ``path`` is
    ``.*``, which stops at one: such a key found no route)."""

    regex = "(?s:.*)"


register_url_convertor("key", _KeyConvertor())


def _raw_path(scope: dict[str, Any]) -> str:
    raw = scope.get("raw_path")
    return raw.decode("utf-8", "replace") if raw else quote(scope["path"])


# set in a request's scope the read core answered: the engine counted it (route, method,
# status, latency) as the native front counts its own, so the app's ``_Measured`` does not
COUNTED = "qstate.counted"


def _core(engine: Engine) -> Any:
    """The read core as an ASGI app: the request's method, raw path, query, content type and
    body as they came."""

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        scope[COUNTED] = True
        method = scope["method"]
        query = scope["query_string"].decode("utf-8", "replace")
        ctype = next((v for k, v in scope["headers"] if k == b"content-type"), None)
        chunks, more = [], method not in ("GET", "HEAD")
        while more:
            msg = await receive()
            if msg["type"] != "http.request":
                return  # the client went away
            chunks.append(msg.get("body", b""))
            more = msg.get("more_body", False)
        body, raw_path = b"".join(chunks), _raw_path(scope)
        try:
            status, headers, out = await answer(lambda loop, fut: engine.http(
                method, raw_path, query, ctype, body, loop, fut))
        except QStateError as exc:  # the engine failed (a panic it caught): counted here
            await send_error(send, exc)
            route = read_route("GET" if method == "HEAD" else method, raw_path) or "unmatched"
            HTTP_REQUESTS.labels(route, http_method(method), str(exc.http_status)).inc()
            return
        await send({"type": "http.response.start", "status": status,
                    "headers": [JSON, *((k.encode(), v.encode()) for k, v in headers)]})
        await send({"type": "http.response.body", "body": out})

    return asgi


def reads_first(app: Any, engine: Engine) -> Any:
    """``app`` (the FastAPI app) behind the read core: a read goes to the core before
    anything of FastAPI runs (its middleware, its routing), as the native front sends it.
    Which requests are reads is the core's rule (``qstate._engine.read_route``: names are raw
    path segments), not FastAPI's match on the decoded path."""
    core = _core(engine)

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and read_route(scope["method"], _raw_path(scope)):
            return await core(scope, receive, send)
        return await app(scope, receive, send)

    return asgi


def add_read_routes(app: FastAPI, engine: Engine, max_windows: int,
                    min_batch_wait_s: float) -> None:
    limit = limit_param(max_windows)
    min_batch = min_batch_param(min_batch_wait_s)
    savepoint = savepoint_param()
    errors = error_responses()

    core = _core(engine)

    def read(path: str, method: str, **kw: Any) -> Callable[[Callable[..., Any]], None]:
        def define(endpoint: Callable[..., Any]) -> None:
            app.add_api_route(path, endpoint, methods=[method], **kw)
            route = next(r for r in app.router.routes  # the route just added
                         if isinstance(r, APIRoute) and r.path == path)
            # what FastAPI still routes here (a HEAD; a path whose decoded form reads as one
            # but whose raw segments do not: the core's 404) goes to the core too
            route.app = core  # type: ignore[assignment]  # an ASGI app, as Starlette's own
        return define

    @read("/v1/state/{job}/{operator}/{state}/{key:key}", "GET", response_model=StateAnswer,
          responses=errors, summary="The latest window of a key, or its windows in a range")
    def get_state(job: Name, operator: Name, state: Name, key: Key, from_: From = None,
                  to: To = None, limit: int | None = limit, min_batch: int | None = min_batch,
                  savepoint: str | None = savepoint,
                  allow_stale: AllowStale = False) -> None:
        """A definition: the read core answers it."""

    @read("/v1/state/{job}/{operator}/{state}:batchGet", "POST", response_model=BatchAnswer,
          responses=error_responses(body=True),
          summary="Many keys of one state; misses are marked")
    def batch_get(job: Name, operator: Name, state: Name, body: Annotated[BatchGetIn, Body()],
                  from_: From = None, to: To = None, limit: int | None = limit,
                  min_batch: int | None = min_batch, savepoint: str | None = savepoint,
                  allow_stale: AllowStale = False) -> None:
        """A definition: the read core answers it."""

    @read("/v1/state/{job}/{operator}:batchGet", "POST", response_model=BatchAnswer,
          responses=error_responses(body=True),
          summary="Many keys of several states of one operator: each key's states as of one "
                  "batch, key by key in the states' order; misses are marked")
    def batch_get_states(job: Name, operator: Name, body: Annotated[StatesBatchGetIn, Body()],
                         from_: From = None, to: To = None, limit: int | None = limit,
                         min_batch: int | None = min_batch,
                         savepoint: str | None = savepoint,
                  allow_stale: AllowStale = False) -> None:
        """A definition: the read core answers it."""

    @read("/v1/series/{job}/{operator}/{state}/{key:key}", "GET", response_model=Series,
          responses={**errors, 200: {"headers": {NEXT_FROM: {
              "description": "Set when the range held more than limit windows: the start of "
                             "the next one; ask again with from=<it> for the rest",
              "schema": {"type": "integer"}}}}},
          summary="A key's windows as points [{time, value}], for dashboards; [] when the key "
                  "has no data")
    def get_series(job: Name, operator: Name, state: Name, key: Key, from_: From = None,
                   to: To = None, limit: int | None = limit, min_batch: int | None = min_batch,
                   savepoint: str | None = savepoint,
                  allow_stale: AllowStale = False) -> None:
        """A definition: the read core answers it."""
