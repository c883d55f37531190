"""Python client of the qstate HTTP API, sync (`Client`) and async (`AsyncClient`).

    with Client("http://127.0.0.1:8000") as qs:
        v = qs.get("tweets", "per_tweet_1h", "impressions", "tw-42")
        print(v.latest.value, "as of batch", v.batch)

A 503 (shard unavailable or restoring) is retried with backoff, honouring Retry-After.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import quote

import httpx


class QStateError(Exception):
    def __init__(self, status: int, message: str, body: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.body = body or {}


@dataclass(frozen=True)
class Window:
    start: int | None
    end: int | None
    value: int | float | None


@dataclass(frozen=True)
class StateValue:
    job: str
    operator: str
    state: str
    key: str
    batch: int
    watermark: int
    windows: list[Window] = field(default_factory=list)
    found: bool = True

    @property
    def latest(self) -> Window | None:
        return self.windows[-1] if self.windows else None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def parse(cls, d: dict[str, Any]) -> StateValue:
        return cls(d["job"], d["operator"], d["state"], d["key"], d["batch"], d["watermark"],
                   [Window(**w) for w in d["windows"]], d.get("found", True))


TimeArg = int | str | datetime | None


def _t(v: TimeArg) -> str | None:
    if v is None:
        return None
    if isinstance(v, datetime):
        return v.isoformat()
    return str(v)


def _params(from_: TimeArg, to: TimeArg) -> dict[str, str]:
    return {k: s for k, v in (("from", from_), ("to", to)) if (s := _t(v)) is not None}


def _path(job: str, operator: str, state: str) -> str:
    return f"/v1/state/{quote(job, safe='')}/{quote(operator, safe='')}/{quote(state, safe='')}"


def _raise(r: httpx.Response) -> None:
    if r.status_code < 400:
        return
    try:
        body = r.json()
    except ValueError:
        body = {"message": r.text}
    raise QStateError(r.status_code, body.get("message") or str(body.get("detail")), body)


def _delay(r: httpx.Response, attempt: int, backoff: float) -> float:
    try:
        hinted = float(r.headers.get("Retry-After", "0"))
    except ValueError:
        hinted = 0.0
    return max(hinted if attempt == 0 else 0.0, backoff * (2 ** attempt))


class Client:
    def __init__(self, url: str = "http://127.0.0.1:8000", timeout: float = 5.0,
                 retries: int = 3, backoff_s: float = 0.2) -> None:
        self._http = httpx.Client(base_url=url, timeout=timeout)
        self.retries = retries
        self.backoff_s = backoff_s

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        for attempt in range(self.retries + 1):
            r = self._http.request(method, path, **kw)
            if r.status_code != 503 or attempt == self.retries:
                break
            time.sleep(_delay(r, attempt, self.backoff_s))
        _raise(r)
        return r

    def get(self, job: str, operator: str, state: str, key: str, *, from_: TimeArg = None,
            to: TimeArg = None) -> StateValue:
        r = self._request("GET", f"{_path(job, operator, state)}/{quote(key, safe='')}",
                          params=_params(from_, to))
        return StateValue.parse(r.json())

    def history(self, job: str, operator: str, state: str, key: str, from_: TimeArg,
                to: TimeArg) -> StateValue:
        return self.get(job, operator, state, key, from_=from_, to=to)

    def multi_get(self, job: str, operator: str, state: str, keys: list[str], *,
                  from_: TimeArg = None, to: TimeArg = None) -> list[StateValue]:
        r = self._request("POST", f"{_path(job, operator, state)}:batchGet",
                          json={"keys": keys}, params=_params(from_, to))
        return [StateValue.parse(d) for d in r.json()["results"]]

    def jobs(self) -> list[dict[str, Any]]:
        return self._request("GET", "/v1/jobs").json()["jobs"]

    def describe(self, job: str) -> dict[str, Any]:
        return self._request("GET", f"/v1/jobs/{quote(job, safe='')}").json()


class AsyncClient:
    def __init__(self, url: str = "http://127.0.0.1:8000", timeout: float = 5.0,
                 retries: int = 3, backoff_s: float = 0.2) -> None:
        self._http = httpx.AsyncClient(base_url=url, timeout=timeout)
        self.retries = retries
        self.backoff_s = backoff_s

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        for attempt in range(self.retries + 1):
            r = await self._http.request(method, path, **kw)
            if r.status_code != 503 or attempt == self.retries:
                break
            await asyncio.sleep(_delay(r, attempt, self.backoff_s))
        _raise(r)
        return r

    async def get(self, job: str, operator: str, state: str, key: str, *,
                  from_: TimeArg = None, to: TimeArg = None) -> StateValue:
        r = await self._request("GET", f"{_path(job, operator, state)}/{quote(key, safe='')}",
                                params=_params(from_, to))
        return StateValue.parse(r.json())

    async def history(self, job: str, operator: str, state: str, key: str, from_: TimeArg,
                      to: TimeArg) -> StateValue:
        return await self.get(job, operator, state, key, from_=from_, to=to)

    async def multi_get(self, job: str, operator: str, state: str, keys: list[str], *,
                        from_: TimeArg = None, to: TimeArg = None) -> list[StateValue]:
        r = await self._request("POST", f"{_path(job, operator, state)}:batchGet",
                                json={"keys": keys}, params=_params(from_, to))
        return [StateValue.parse(d) for d in r.json()["results"]]
