"""The raw-ASGI fast path answers exactly what the FastAPI route answers: same status, body,
headers, for hits, misses, bad requests and 503s (one module, its two neighbours faked)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
import pytest

from qstate.core.address import PartitionId, partition_of
from qstate.core.errors import Unavailable, UnknownOperator
from qstate.core.records.operator import OperatorSpec, WindowSpec
from qstate.router.fastpath import with_fast_get
from qstate.router.http import create_app
from qstate.router.query import QueryService
from qstate.router.reads import Hit, Row
from qstate.router.request import StateQuery

SPEC = OperatorSpec("j", "op", "k", {"n": "long"}, partitions=4,
                    window=WindowSpec("tumbling", 10))


class FakeRouting:
    async def spec(self, job: str, operator: str, state: str | None = None) -> OperatorSpec:
        if (job, operator) != ("j", "op") or state not in (None, "n"):
            raise UnknownOperator(f"no {job}/{operator}/{state}", job=job)
        return SPEC


class FakeReads:
    caller: Any = None  # QueryService's Describe poller: never called by these paths

    async def read(self, spec: OperatorSpec, pid: PartitionId, q: StateQuery, key: str) -> Hit:
        rng = q.range_ms
        if key == "down":
            raise Unavailable(f"partition {pid} is being restored", 2.0,
                              partition=pid.partition)
        if key == "absent":
            return Hit(False, 7, 70, [])
        windows = [Row(s, s + 10, len(key) + s) for s in (0, 10, 20)]
        if rng is not None:
            windows = [w for w in windows if w.start is not None and rng[0] <= w.start < rng[1]]
        return Hit(True, 7, 70, windows if rng is not None else windows[-1:])


PATHS = ["/v1/state/j/op/n/key-1", "/v1/state/j/op/n/a%2Fb%20c",
         "/v1/state/j/op/n/key-1?from=5&to=25", "/v1/state/j/op/n/key-1?from=1970-01-01T00:00:00Z",
         "/v1/state/j/op/n/absent", "/v1/state/j/op/n/down", "/v1/state/j/nope/n/k",
         "/v1/state/j/op/zz/k", "/v1/state/b%20ad/op/n/k", "/v1/state/j/op/n/" + "x" * 1025,
         "/v1/state/j/op/n/k?from=soon", "/v1/state/j/op/n/k?from=9&to=3"]


async def answers(app: Any, paths: list[str]) -> list[tuple[int, bytes, str | None, str]]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        out = []
        for p in paths:
            r = await c.get(p)
            out.append((r.status_code, r.content, r.headers.get("retry-after"),
                        r.headers["content-type"]))
        return out


@pytest.mark.parametrize("path", PATHS)
def test_fast_path_answers_like_the_fastapi_route(path: str) -> None:
    query = QueryService(FakeRouting(), FakeReads())  # type: ignore[arg-type]
    app = create_app(query)
    [fast] = asyncio.run(answers(with_fast_get(app, query), [path]))
    [slow] = asyncio.run(answers(app, [path]))
    assert fast == slow  # byte for byte
    status, raw, retry, _ = fast
    body = orjson.loads(raw)
    if "down" in path:
        # the partition the key hashes to, computed here, not read back from the answer
        assert (status, retry, body["partition"]) == (503, "2",
                                                      partition_of("down", SPEC.partitions))
    if status == 200:
        assert body["found"] is True and body["batch"] == 7
