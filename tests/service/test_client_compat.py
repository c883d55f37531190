"""An older client reading a newer router, and a client that finds its router in the
environment.

The newer router is the shop deployment's router behind a proxy (a real HTTP server) that
adds a field this client does not know to every JSON object of every answer, errors
included: what a later qstate that adds fields would send. The client's answers through it
equal its answers from the router itself (docs/architecture.md §5, compatibility).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import orjson
import pytest
import uvicorn

from qstate.client import AsyncClient, Client, NotFound
from qstate.core import config
from qstate.embedded.ports import free_port, wait_for_port
from tests.shop import BATCHES, KEYS, WINDOW, Shop

LAST = BATCHES - 1
ADDED = {"added_later": {"nested": [1, {"deeper": True}]}}
_HOP = {b"host", b"content-length", b"accept-encoding"}


def _grow(x: Any) -> Any:
    if isinstance(x, dict):
        return {**{k: _grow(v) for k, v in x.items()}, **ADDED}
    if isinstance(x, list):
        return [_grow(v) for v in x]
    return x


@contextmanager
def newer_router(upstream: str) -> Iterator[str]:
    """The URL of a router that answers as ``upstream`` does, plus a new field in every
    JSON object."""
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        body, more = b"", True
        while more:
            msg = await receive()
            body += msg.get("body", b"")
            more = msg.get("more_body", False)
        async with httpx.AsyncClient(base_url=upstream) as up:
            r = await up.request(scope["method"], scope["path"],
                                 params=scope["query_string"].decode(), content=body,
                                 headers=[(k, v) for k, v in scope["headers"] if k not in _HOP])
        out = r.content
        if r.headers.get("content-type", "").startswith("application/json"):
            out = orjson.dumps(_grow(orjson.loads(out)))
        headers = [(k.encode(), v.encode()) for k, v in r.headers.items()
                   if k.lower() not in ("content-length", "content-encoding",
                                        "transfer-encoding")]
        await send({"type": "http.response.start", "status": r.status_code, "headers": headers})
        await send({"type": "http.response.body", "body": out})

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for_port("127.0.0.1", port, 10)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def _answers(c: Client) -> list[Any]:
    k = KEYS[3]
    return [c.get("shop", "views_1m", "views", k),
            c.history("shop", "views_1m", "avg_ms", k, 0, 10 * WINDOW),
            c.series("shop", "views_1m", "views", k, 0, 10 * WINDOW),
            c.multi_get("shop", "views_1m", "views", [*KEYS[:5], "never-written"]),
            c.top("shop", "views_1m", "views", 5), c.jobs(), c.describe("shop")]


def test_an_older_client_reads_a_newer_routers_answers(shop: Shop) -> None:
    url = shop.routers["local"].url
    with newer_router(url) as newer:
        raw = httpx.get(f"{newer}/v1/state/shop/views_1m/views/{KEYS[3]}").json()
        assert raw["added_later"] and raw["windows"][0]["added_later"]  # it does add them
        with Client(url) as old_way, Client(newer) as c:
            # describe's freshness moves with time: compare what a newer router cannot change
            mine, theirs = _answers(old_way), _answers(c)
            assert mine[:-1] == theirs[:-1]
            assert mine[-1].operators[0].last_batch == theirs[-1].operators[0].last_batch == LAST
            with pytest.raises(NotFound) as absent:  # an error body with a new field too
                c.get("shop", "views_1m", "views", "never-written")
            assert absent.value.detail["batch"] == LAST

        async def go() -> list[Any]:
            async with AsyncClient(newer) as ac:
                return [await ac.get("shop", "views_1m", "views", KEYS[3]),
                        await ac.series("shop", "views_1m", "views", KEYS[3], 0, 10 * WINDOW),
                        await ac.multi_get("shop", "views_1m", "views", KEYS[:5])]

        with Client(url) as c:
            assert asyncio.run(go()) == [
                c.get("shop", "views_1m", "views", KEYS[3]),
                c.series("shop", "views_1m", "views", KEYS[3], 0, 10 * WINDOW),
                c.multi_get("shop", "views_1m", "views", KEYS[:5])]


def test_series_follows_every_page(shop: Shop) -> None:
    """A range of more windows than a page: every point, as one answer."""
    url = shop.routers["local"].url
    with Client(url) as c:
        whole = c.history("shop", "views_1m", "views", KEYS[3], 0, 10 * WINDOW)
        assert len(whole.windows) == BATCHES > 1
        pages: list[str | None] = []
        c._http.event_hooks["response"].append(
            lambda r: pages.append(r.headers.get("Next-From")))
        points = c.series("shop", "views_1m", "views", KEYS[3], 0, 10 * WINDOW, limit=1)
        assert [(p.time, p.value) for p in points] == [(w.start, w.value) for w in whole.windows]
        # one request a window: each page of one said where the next starts, the last did not
        assert pages == [str(w.start) for w in whole.windows[1:]] + [None]


def test_the_router_and_token_come_from_the_environment(shop: Shop,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """QSTATE_ROUTER_URL and QSTATE_TOKEN, as ``qstate get`` reads them: a client made with
    no arguments asks that router and sends that token."""
    seen: list[str] = []

    def record(request: httpx.Request) -> None:
        seen.append(request.headers.get("authorization", ""))

    monkeypatch.setenv("QSTATE_ROUTER_URL", shop.routers["grpc"].url)
    monkeypatch.setenv("QSTATE_TOKEN", "qs_env_token")
    config.settings.cache_clear()
    try:
        with Client() as c:
            c._http.event_hooks["request"].append(record)
            assert c.get("shop", "views_1m", "views", KEYS[3]).batch == LAST
            assert str(c._http.base_url).rstrip("/") == shop.routers["grpc"].url
        assert seen == ["Bearer qs_env_token"]
    finally:
        config.settings.cache_clear()
