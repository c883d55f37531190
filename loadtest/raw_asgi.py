"""The yardstick: a raw ASGI app answering the same URL shape from an in-memory dict.

    uvicorn loadtest.raw_asgi:app --http httptools --port 8100

What a router could reach with no framework, no hop and no storage: the upper bound the
router's GET throughput is compared with in the same run.
"""

from __future__ import annotations

import os

import orjson

KEYS = int(os.environ.get("RAW_KEYS", "100000"))
DATA = {f"page-{i}": orjson.dumps({
    "job": "shop", "operator": "views_1m", "state": "views", "key": f"page-{i}", "batch": 2,
    "watermark": 120000, "windows": [{"start": 120000, "end": 180000, "value": i}]})
    for i in range(KEYS)}
NOT_FOUND = orjson.dumps({"error": "NotFound", "message": "no such key"})


async def app(scope, receive, send):  # type: ignore[no-untyped-def]
    key = scope["path"].rsplit("/", 1)[-1]
    body = DATA.get(key)
    status = 200 if body is not None else 404
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body or NOT_FOUND})
