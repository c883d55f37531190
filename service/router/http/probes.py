"""What a process answers about itself: /healthz (which worker answered, with --workers),
/readyz (an assignment to route by), /metrics (every series, docs/metrics.md). None of them
needs a token or holds a request slot."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from qstate.router.metrics import exposition

__all__ = ["add_probes"]


def add_probes(app: FastAPI, ready: Callable[[], bool]) -> None:
    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> Any:
        return {"status": "ok", "pid": os.getpid()}

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> Any:
        ok = bool(ready())
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        body, media_type = exposition()
        return Response(body, media_type=media_type)
