"""What one router takes at once (the Python front's: the native front keeps the same budget
itself), answered at once when exceeded: request bodies over
``max_body_bytes`` get 413, requests beyond ``max_concurrent_requests`` in flight get 429
with Retry-After. Never a wait in a queue: a client told 429 backs off, a client left
waiting times out and retries, which is more load.

An ASGI wrapper outside everything else. A body is read here in full (it is at most
``max_body_bytes``) and handed on, so an oversized chunked body is refused as surely as one
that declared its length, and no route parses a body this module has not measured.
Probes and /metrics are never limited: an overloaded router must still say so. A watch
(/v1/watch/...) is a stream that stays open: it holds no slot, ``max_watchers`` bounds them
(``qstate.router.watch``).
"""

from __future__ import annotations

from typing import Any

from qstate._engine import Engine
from qstate.router.wire import send_error

__all__ = ["with_limits"]

_EXEMPT = frozenset({"/healthz", "/readyz", "/metrics"})
WATCH_PREFIX = "/v1/watch/"


def with_limits(app: Any, engine: Engine, max_body_bytes: int, max_concurrent: int) -> Any:
    """The Python front's budget, refused in the read engine's words (``Engine.refusal``)."""
    inflight = 0

    async def asgi(scope: dict, receive: Any, send: Any) -> None:
        nonlocal inflight
        if scope["type"] != "http" or scope["path"] in _EXEMPT or (
                scope["method"] == "GET" and scope["path"].startswith(WATCH_PREFIX)):
            return await app(scope, receive, send)
        if inflight >= max_concurrent:
            return await send_error(send, engine.refusal("overloaded"))
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
            return await send_error(send, engine.refusal("too-large"))
        inflight += 1
        try:
            chunked = any(k == b"transfer-encoding" for k, _ in scope["headers"])
            if scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE") and declared is None \
                    and not chunked:
                return await app(scope, receive, send)
            chunks, size, more = [], 0, True
            while more:
                msg = await receive()
                if msg["type"] != "http.request":  # the client went away
                    return None
                chunk = msg.get("body", b"")
                size += len(chunk)
                if size > max_body_bytes:
                    return await send_error(send, engine.refusal("too-large"))
                chunks.append(chunk)
                more = msg.get("more_body", False)
            replayed = False

            async def replay() -> dict[str, Any]:
                nonlocal replayed
                if replayed:
                    return await receive()  # what comes after the body: a disconnect
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

            return await app(scope, replay, send)
        finally:
            inflight -= 1

    return asgi
