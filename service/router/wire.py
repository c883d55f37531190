"""What the router's Python answers share on the wire: the error answer (status, ErrorBody,
Retry-After), a top-N's fields, a watch event's bytes (equal to the models' bytes,
``qstate.core.answer``). The read core writes the reads' answers and errors itself
(``qstate._engine``) in the same forms: ``tests/vectors/errors.json`` and ``json.json`` pin
the two writers (docs/architecture.md §5)."""

from __future__ import annotations

from typing import Any

import orjson

from qstate._engine import answer_json
from qstate.core.errors import QStateError
from qstate.router.metrics import count_error
from qstate.router.top import TopResult
from qstate.router.watch import Push

__all__ = ["JSON", "error_response", "retry_after", "send_error", "top_fields", "watch_event_json"]

JSON = "application/json"


def retry_after(exc: QStateError) -> int:
    """Whole seconds for the Retry-After header (HTTP has no finer unit)."""
    return max(1, round(float(exc.detail.get("retry_after_s", 1.0))))


def error_response(exc: QStateError) -> tuple[int, bytes, dict[str, str]]:
    """Status, body and headers of an error answer: the one place they are decided (and
    counted)."""
    headers = {"content-type": JSON}
    if "retry_after_s" in exc.detail:  # 503 unavailable, 429 overloaded
        headers["retry-after"] = str(retry_after(exc))
    if exc.http_status == 401:
        headers["www-authenticate"] = "Bearer"
    count_error(exc)
    return exc.http_status, orjson.dumps(exc.body()), headers


async def send_error(send: Any, exc: QStateError) -> None:
    """``exc``'s error answer straight over raw ASGI (the wrappers in front of the app)."""
    status, body, headers = error_response(exc)
    await send({"type": "http.response.start", "status": status,
                "headers": [(k.encode(), v.encode()) for k, v in headers.items()]})
    await send({"type": "http.response.body", "body": body})


def top_fields(r: TopResult, descending: bool) -> dict[str, Any]:
    """A ``TopAnswer``'s fields, in its order (served by GET /v1/top and in watch events)."""
    return {"job": r.spec.job, "operator": r.spec.operator, "state": r.state,
            "window": None if r.start is None or r.end is None
            else {"start": r.start, "end": r.end},
            "order": "desc" if descending else "asc", "batch": r.batch,
            "watermark": r.watermark_ms,
            "entries": [{"key": k, "value": v} for k, v in r.entries]}


def watch_event_json(p: Push) -> bytes:
    """``WatchEvent(...).model_dump_json()`` of a push, byte for byte (a test holds them
    equal): every watcher's event is made per batch, so without the model; each change in the
    bytes every read answers with (``qstate._engine.answer_json``)."""
    spec = p.spec
    return orjson.dumps({
        "job": spec.job, "operator": spec.operator, "state": p.state, "batch": p.batch,
        "watermark": p.watermark_ms, "committed_at": p.committed_ms or None,
        "coalesced": p.coalesced, "snapshot": p.snapshot,
        "changes": [orjson.Fragment(answer_json(spec.job, spec.operator, p.state, k, h.found,
                                                h.batch, h.watermark_ms, h.windows,
                                                h.next_from))
                    for k, h in p.changes],
        "top": None if p.top is None else top_fields(p.top, p.descending)})
