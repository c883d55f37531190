"""A raw-ASGI fast path for the hottest request, ``GET /v1/state/{job}/{op}/{state}/{key}``.

FastAPI costs ~150 µs of CPU a request against ~30 µs for raw ASGI (docs/architecture.md
§8); a point lookup is the request dashboards make thousands of times a second. This path
answers exactly what the FastAPI route (kept for validation docs and OpenAPI) would, the
same bytes (``state_answer_json``) and error answers, and hands every other request to
FastAPI.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import parse_qsl

from qstate.core.errors import QStateError
from qstate.router.metrics import HTTP_LATENCY, HTTP_REQUESTS
from qstate.router.query import QueryService, absent_key
from qstate.router.wire import (
    JSON,
    error_response,
    parse_limit,
    parse_min_batch,
    state_answer_json,
    time_range,
)

__all__ = ["with_fast_get"]

PREFIX = "/v1/state/"
ROUTE = "/v1/state/{job}/{operator}/{state}/{key}"  # the FastAPI route's template
_JSON = [(b"content-type", JSON.encode())]


def with_fast_get(app: Any, query: QueryService) -> Any:
    # the metric children, resolved once (a labels() lookup is a dict and a lock a request)
    latency = HTTP_LATENCY.labels(ROUTE)
    requests: dict[int, Any] = {}

    async def asgi(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "GET" or \
                not scope["path"].startswith(PREFIX):
            return await app(scope, receive, send)
        parts = scope["path"][len(PREFIX):].split("/", 3)
        if len(parts) != 4 or not parts[3]:
            return await app(scope, receive, send)
        t0 = time.perf_counter()
        job, operator, state, key = parts
        headers = _JSON
        try:
            params = dict(parse_qsl(scope["query_string"].decode("latin-1"))) \
                if scope["query_string"] else {}
            q = query.point(
                job, operator, state, key, time_range(params.get("from"), params.get("to")),
                parse_limit(params.get("limit"), query.max_windows),
                parse_min_batch(params.get("min_batch")), params.get("savepoint"))
            spec, key, hit = await query.lookup(q)
            if not hit.found:
                raise absent_key(spec.job, spec.operator, q.state, key, hit.batch,
                                 hit.watermark_ms)
            status, body = 200, state_answer_json(
                spec.job, spec.operator, q.state, key, True, hit.batch, hit.watermark_ms,
                hit.windows, hit.next_from)
        except QStateError as exc:
            status, body, hdrs = error_response(exc)
            headers = [(k.encode(), v.encode()) for k, v in hdrs.items()]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        latency.observe(time.perf_counter() - t0)
        counter = requests.get(status)
        if counter is None:
            counter = requests[status] = HTTP_REQUESTS.labels(ROUTE, "GET", str(status))
        counter.inc()
        return None

    return asgi
