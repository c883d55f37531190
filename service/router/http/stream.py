"""``GET /v1/watch/{job}/{operator}/{state}``: pushed changes as Server-Sent Events
(``qstate.router.watch``: after each committed batch, the watched keys whose value changed, or
the top-N board when it changed; resumable by batch)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import FastAPI, Header, Query
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask

from qstate.core.answer import WatchEvent, error_responses
from qstate.core.errors import InvalidRequest
from qstate.router.http.params import Name
from qstate.router.watch import WatchClosed, WatchHub
from qstate.router.wire import watch_event_json

__all__ = ["SEND_TIMEOUT_S", "add_watch_route"]

# A watch's stream: a send that waits longer than this (a client that stopped reading with
# full buffers) ends the stream rather than hold it (the client resumes); the pings that
# keep it open are QSTATE_WATCH_PING_S apart.
SEND_TIMEOUT_S = 30


def _last_event_id(value: str | None) -> int | None:
    """SSE's Last-Event-ID: the batch of the last event a reconnecting client got."""
    if value is None or not value.strip():
        return None
    try:
        return int(value)
    except ValueError:
        raise InvalidRequest(f"Last-Event-ID {value[:40]!r} is not a batch number (the id "
                             "of a watch event)") from None


def add_watch_route(app: FastAPI, watches: WatchHub, max_n: int, retry_after_s: float) -> None:
    # defaults, not Annotated aliases: they state this router's bounds
    key_param = Query(None, description=f"A key to watch (repeat: at most "
                      f"{watches.max_keys}, QSTATE_MAX_WATCH_KEYS); or top")
    top_param = Query(None, ge=1, le=max_n, description="Watch the current window's top n "
                      f"instead of keys (most: {max_n}, QSTATE_MAX_TOP_N)")

    @app.get("/v1/watch/{job}/{operator}/{state}", response_model=WatchEvent,
             response_class=EventSourceResponse, responses=error_responses(),
             summary="Pushed changes (Server-Sent Events): after each committed batch, the "
                     "watched keys whose value changed, or the top-N board when it changed")
    async def watch(job: Name, operator: Name, state: Name,
                    key: list[str] | None = key_param, top: int | None = top_param,
                    order: Annotated[Literal["desc", "asc"], Query(
                        description="With top: desc, largest first; asc")] = "desc",
                    from_batch: Annotated[int | None, Query(
                        ge=-1, description="Resume after this batch (an event's id): only "
                        "what changed since, or every value (snapshot) when this router "
                        "cannot tell. Last-Event-ID, sent by a reconnecting EventSource, "
                        "takes precedence")] = None,
                    last_event_id: Annotated[str | None, Header(
                        alias="Last-Event-ID", include_in_schema=False)] = None) -> Any:
        resumed = _last_event_id(last_event_id)
        w = await watches.open(watches.watch_query(
            job, operator, state, key or (), top, order == "desc",
            resumed if resumed is not None else from_batch), "http")

        async def events() -> Any:
            retry: int | None = int(retry_after_s * 1000)
            try:
                while True:
                    p = await w.next()
                    yield ServerSentEvent(data=watch_event_json(p).decode(), id=str(p.batch),
                                          retry=retry)
                    retry = None  # once, with the first event
            except WatchClosed:
                return
            finally:
                w.close()

        # closed after the response too: a generator that never started (a client gone
        # before the stream began) runs no finally, and the watch must not outlive it
        return EventSourceResponse(events(), ping=watches.ping_s, send_timeout=SEND_TIMEOUT_S,
                                   headers={"Cache-Control": "no-cache",
                                            "X-Accel-Buffering": "no"},
                                   background=BackgroundTask(w.close))
