"""What one router takes at once, answered at once when exceeded: request bodies over
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

from qstate.core.errors import Overloaded, TooLarge
from qstate.router.wire import send_error

__all__ = ["with_limits"]

_EXEMPT = frozenset({"/healthz", "/readyz", "/metrics"})
WATCH_PREFIX = "/v1/watch/"


def _too_large(max_body_bytes: int) -> TooLarge:
    return TooLarge(f"request body over {max_body_bytes} bytes (QSTATE_MAX_BODY_BYTES); send "
                    "fewer keys per request", limit_bytes=max_body_bytes)


def with_limits(app: Any, max_body_bytes: int, max_concurrent: int,
                retry_after_s: float = 1.0) -> Any:
    inflight = 0

    async def asgi(scope: dict, receive: Any, send: Any) -> None:
        nonlocal inflight
        if scope["type"] != "http" or scope["path"] in _EXEMPT or (
                scope["method"] == "GET" and scope["path"].startswith(WATCH_PREFIX)):
            return await app(scope, receive, send)
        if inflight >= max_concurrent:
            return await send_error(send, Overloaded(
                f"this router serves {max_concurrent} requests at once "
                f"(QSTATE_MAX_CONCURRENT_REQUESTS); retry after {retry_after_s:g} s",
                retry_after_s=retry_after_s))
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
            return await send_error(send, _too_large(max_body_bytes))
        inflight += 1
        try:
            if scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE") and declared is None:
                return await app(scope, receive, send)
            chunks, size, more = [], 0, True
            while more:
                msg = await receive()
                if msg["type"] != "http.request":  # the client went away
                    return None
                chunk = msg.get("body", b"")
                size += len(chunk)
                if size > max_body_bytes:
                    return await send_error(send, _too_large(max_body_bytes))
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
