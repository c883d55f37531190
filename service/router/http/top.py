"""``GET /v1/top/{job}/{operator}/{state}``: the n keys with the largest (or smallest) value in
one window across every partition (``qstate.router.top``; a board kept current by the watch
hub while it is asked)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson
from fastapi import FastAPI, Query
from fastapi.responses import Response

from qstate._engine import parse_time
from qstate.core.answer import TopAnswer, error_responses
from qstate.router.http.params import (
    TIME_DOC,
    TIME_PATTERN,
    AllowStale,
    Name,
    min_batch_param,
    savepoint_param,
)
from qstate.router.query import QueryService
from qstate.router.watch import WatchHub
from qstate.router.wire import JSON, top_fields

__all__ = ["add_top_route"]

# "current" or a time (a module's name: the annotations below are resolved in its globals)
WINDOW_PATTERN = f"^(?:current|{TIME_PATTERN[1:-1]})$"


def add_top_route(app: FastAPI, query: QueryService, watches: WatchHub) -> None:
    max_n = query.max_top_n
    n_param = Query(None, ge=1, le=max_n, description=f"How many keys (default 10; most: "
                    f"{max_n}, QSTATE_MAX_TOP_N)")
    min_batch = min_batch_param(query.min_batch_wait_s)
    savepoint = savepoint_param()

    @app.get("/v1/top/{job}/{operator}/{state}", response_model=TopAnswer,
             responses=error_responses(),
             summary="The n keys with the largest (or smallest) value in one window, across "
                     "every partition; ties by key")
    async def get_top(job: Name, operator: Name, state: Name, n: int | None = n_param,
                      order: Annotated[Literal["desc", "asc"], Query(
                          description="desc: largest first; asc: smallest first")] = "desc",
                      window: Annotated[str, Query(
                          description="current: the oldest window still open at the "
                          f"watermark (the one still counting); or a time ({TIME_DOC}): "
                          "the newest window starting at or before it. Ignored for state "
                          "without windows", examples=["current", "now-1h"],
                          json_schema_extra={"pattern": WINDOW_PATTERN})] = "current",
                      min_batch: int | None = min_batch,
                      savepoint: str | None = savepoint,
                      allow_stale: AllowStale = False) -> Any:
        # a time as the read core reads one (its words when it is not)
        start = None if window == "current" else parse_time("window", window)
        r = await watches.top(query.top_query(job, operator, state, n, order == "desc", start,
                                              min_batch, savepoint, allow_stale))
        return Response(orjson.dumps(top_fields(r, order == "desc")), media_type=JSON)
