"""What every router front end shares on the wire: times and limits in a query, answers as
bytes without their models (equal to the models' bytes, ``qstate.core.answer``), and the
error answer (status, ErrorBody, Retry-After). The raw-ASGI fast path, the FastAPI app, the
auth and limit wrappers and the gRPC service all take them from here, so no front end
imports another and each rule is written once (docs/architecture.md §5)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

import orjson

from qstate.core.errors import InvalidRequest, QStateError
from qstate.router.metrics import count_error
from qstate.router.request import check_limit
from qstate.router.top import TopResult
from qstate.router.watch import Push

__all__ = ["FAR", "JSON", "TIME_PATTERN", "answer_fields", "batch_answer_json", "error_response",
           "parse_limit", "parse_min_batch", "parse_time", "retry_after", "send_error",
           "state_answer_json", "time_range", "top_fields", "watch_event_json"]

JSON = "application/json"
FAR = 1 << 62  # an open end of a time range


# A time in a query: epoch milliseconds (Grafana's ${__from}), Grafana's relative times (now,
# now-1h, now+5m; a "+" left unencoded in a query string arrives as a space, so a space
# counts as "+"), or an ISO-8601 date or time (naive: UTC). One expression both checks the
# parameter and is the pattern the OpenAPI document states.
_ISO = (r"[0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])"
        r"(?:T(?:[01][0-9]|2[0-3]):[0-5][0-9](?::[0-5][0-9](?:\.[0-9]{1,6})?)?"
        r"(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])?)?")
_TIME = re.compile(r"(?P<epoch>-?[0-9]{1,19})"
                   r"|now(?:(?P<sign>[-+ ])(?P<n>[0-9]{1,12})(?P<unit>ms|s|m|h|d|w))?"
                   rf"|(?P<iso>{_ISO})")
TIME_PATTERN = "^(?:" + re.sub(r"\?P<\w+>", "?:", _TIME.pattern) + ")$"
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


def parse_time(name: str, value: str | None, now_ms: int | None = None) -> int | None:
    """Epoch milliseconds, ISO-8601 (a naive time is UTC), or relative to now (``now-1h``)."""
    if value is None:
        return None
    m = _TIME.fullmatch(value.strip())
    try:
        if m is None:
            raise ValueError(value)
        if m["epoch"] is not None:
            return int(m["epoch"])
        if m["iso"] is None:
            now = int(time.time() * 1000) if now_ms is None else now_ms
            if m["sign"] is None:
                return now
            return now + (-1 if m["sign"] == "-" else 1) * int(m["n"]) * _UNIT_MS[m["unit"]]
        dt = datetime.fromisoformat(m["iso"].replace("Z", "+00:00"))
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
        return int(dt.timestamp() * 1000)
    except (ValueError, OverflowError):  # also a date that does not exist: 2026-02-30
        raise InvalidRequest(f"'{name}' must be epoch milliseconds (at most 19 digits), "
                             f"ISO-8601 (e.g. 2026-01-01T10:00:00Z) or relative to now "
                             f"(now-1h; units ms s m h d w), not {value[:80]!r}") from None


def parse_limit(value: str | None, most: int) -> int | None:
    """The ``limit`` query parameter: a whole number of windows, 1..``most``."""
    if value is None:
        return None
    v = value.strip()
    if not (v.isascii() and v.isdigit() and len(v) <= 9):  # "²".isdigit() too
        raise InvalidRequest(f"'limit' must be a whole number of windows from 1 to {most}, "
                             f"not {value[:80]!r}")
    return check_limit(int(v), most)


def parse_min_batch(value: str | None) -> int | None:
    """The ``min_batch`` query parameter: a batch number, 0 or more."""
    if value is None:
        return None
    v = value.strip()
    if not (v.isascii() and v.isdigit() and len(v) <= 18):
        raise InvalidRequest(f"'min_batch' must be a batch number, 0 or more, not {value[:80]!r}")
    return int(v)


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


class WindowLike(Protocol):  # a Window, or the router's row a Window is made of
    @property
    def start(self) -> int | None: ...
    @property
    def end(self) -> int | None: ...
    @property
    def value(self) -> int | float | None: ...


def answer_fields(job: str, operator: str, state: str, key: str, found: bool, batch: int,
                  watermark: int, windows: Sequence[WindowLike],
                  next_from: int | None) -> dict[str, Any]:
    """A ``StateAnswer``'s fields, in its order, without building the model: the hot paths
    (a point GET, a batch) serialize these (docs/architecture.md §5)."""
    return {"job": job, "operator": operator, "state": state, "key": key, "found": found,
            "batch": batch, "watermark": watermark,
            "windows": [{"start": w.start, "end": w.end, "value": w.value} for w in windows],
            "next_from": next_from}


def state_answer_json(job: str, operator: str, state: str, key: str, found: bool, batch: int,
                      watermark: int, windows: Sequence[WindowLike],
                      next_from: int | None) -> bytes:
    """``StateAnswer(...).model_dump_json()``, byte for byte (a property test holds them
    equal)."""
    return orjson.dumps(answer_fields(job, operator, state, key, found, batch, watermark,
                                      windows, next_from))


def batch_answer_json(answers: Iterable[dict[str, Any]]) -> bytes:
    """``BatchAnswer(results=...).model_dump_json()`` of ``answer_fields`` each, byte for
    byte."""
    return orjson.dumps({"results": list(answers)})


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
    equal): every watcher's event is made per batch, so without the model."""
    spec = p.spec
    return orjson.dumps({
        "job": spec.job, "operator": spec.operator, "state": p.state, "batch": p.batch,
        "watermark": p.watermark_ms, "committed_at": p.committed_ms or None,
        "coalesced": p.coalesced, "snapshot": p.snapshot,
        "changes": [answer_fields(spec.job, spec.operator, p.state, k, h.found, h.batch,
                                  h.watermark_ms, h.windows, h.next_from)
                    for k, h in p.changes],
        "top": None if p.top is None else top_fields(p.top, p.descending)})
