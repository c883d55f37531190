"""Python client of the qstate HTTP API, sync (``Client``) and async (``AsyncClient``).

    with Client("http://127.0.0.1:8000") as qs:
        v = qs.get("tweets", "per_tweet_1h", "impressions", "tw-42")
        print(v.latest.value, "as of batch", v.batch)

What is not given is read from the settings, as ``qstate get`` reads them: the router's URL
from ``QSTATE_ROUTER_URL`` (default http://127.0.0.1:8000), the token from ``QSTATE_TOKEN``
(else the file ``QSTATE_TOKEN_FILE``), the CA from ``QSTATE_TLS_CA``, or the file
``QSTATE_CONFIG`` names (README, Configuration).

Answers are ``qstate.core.answer`` models, the ones the router serializes; fields a newer
router adds are ignored, so a client need not be upgraded with the routers. Errors are
``QStateError`` and its classes, importable from here (``NotFound``, ``InvalidRequest``,
``Unavailable`` ...). A 503 (shard unavailable or restoring) or a 429 is retried with
backoff, honouring Retry-After.
With ``direct=True`` (QSTATE_CLIENT_DIRECT) the client caches each job's cluster map and
asks each key, each batch split by owner, at a router on its owner's node: no hop on a
cluster (``qstate.core.transport.cluster_map``; a stale map costs a hop, never a wrong
answer).
``watch()`` yields pushed changes (Server-Sent Events) and resumes where it left off when
the connection drops or the router restarts.
Over HTTPS, ``ca`` names the CA bundle that signed the router's certificate (``qstate
certs`` makes one); ``token`` (or the content of ``token_file``, e.g. a mounted secret) is
sent as ``Authorization: Bearer``, and never in plain text off loopback: over ``http://`` to
another host the client refuses (InvalidRequest) unless ``insecure_token=True`` says the
network is protected otherwise (a service mesh).
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections.abc import AsyncGenerator, Generator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from httpx_sse import SSEError, aconnect_sse, connect_sse

from qstate.core.answer import (
    NEXT_FROM,
    BatchAnswer,
    JobInfo,
    JobList,
    JobPosition,
    Point,
    Series,
    StateAnswer,
    TopAnswer,
    WatchEvent,
)
from qstate.core.config import settings
from qstate.core.errors import (
    Forbidden,
    InvalidAddress,
    InvalidRequest,
    NotFound,
    Overloaded,
    QStateError,
    TooLarge,
    Unauthenticated,
    Unavailable,
    UnknownOperator,
    from_http,
)
from qstate.core.transport.cluster_map import OWNER, Owners, map_path
from qstate.core.transport.security import clean_token, is_loopback

__all__ = ["AsyncClient", "Client", "Forbidden", "InvalidAddress", "InvalidRequest",
           "NotFound", "Overloaded", "QStateError", "StateAnswer", "TimeArg", "TooLarge",
           "Unauthenticated", "Unavailable", "UnknownOperator"]

log = logging.getLogger(__name__)

TimeArg = int | str | datetime | None


def _t(v: TimeArg) -> str | None:
    if v is None:
        return None
    if isinstance(v, datetime):
        return v.isoformat()
    return str(v)


def read_params(from_: TimeArg, to: TimeArg, min_batch: int | None = None,
                savepoint: str | None = None, allow_stale: bool = False) -> dict[str, str]:
    """Query parameters; ``min_batch``: answer as of that batch or a later one (the router
    waits a while for it, then 503: retried like any other); ``savepoint``: as of that
    savepoint of the job; ``allow_stale``: a follower may answer when the owner cannot."""
    out = {k: s for k, v in (("from", from_), ("to", to)) if (s := _t(v)) is not None}
    if allow_stale:
        out["allow_stale"] = "true"
    if min_batch is not None:
        out["min_batch"] = str(min_batch)
    if savepoint is not None:
        out["savepoint"] = savepoint
    return out


def operator_path(job: str, operator: str) -> str:
    return f"/v1/state/{quote(job, safe='')}/{quote(operator, safe='')}"


def state_path(job: str, operator: str, state: str) -> str:
    return f"{operator_path(job, operator)}/{quote(state, safe='')}"


def by_key(keys: Sequence[str], states: Sequence[str],
           answers: list[StateAnswer]) -> list[dict[str, StateAnswer]]:
    """A several-state batch's answers (key by key, each key's states in the order asked) as
    one ``{state: answer}`` per key, in the keys' order."""
    n = len(states)
    if len(answers) != len(keys) * n:
        raise QStateError(f"the router answered {len(answers)} of {len(keys)} keys × {n} "
                          "states")
    return [dict(zip(states, answers[i * n:(i + 1) * n], strict=True))
            for i in range(len(keys))]


T = TypeVar("T")


def _with_keys(kw: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    """A batch request's arguments for ``keys`` alone (a point read's unchanged)."""
    if "json" not in kw:
        return kw
    return {**kw, "json": {**kw["json"], "keys": keys}}


def _merged(n: int, parts: list[tuple[list[int], list[T]]]) -> list[T]:
    """Each group's answers, per key, put back in the order of the ``n`` keys asked."""
    out: list[T | None] = [None] * n
    for idx, got in parts:
        if len(got) != len(idx):
            raise QStateError(f"a router answered {len(got)} of {len(idx)} keys")
        for i, a in zip(idx, got, strict=True):
            out[i] = a
    return [a for a in out if a is not None]


def _key_path(job: str, operator: str, state: str, key: str) -> str:
    return f"{state_path(job, operator, state)}/{quote(key, safe='')}"


def _series_path(job: str, operator: str, state: str, key: str) -> str:
    return f"/v1/series/{quote(job, safe='')}/{quote(operator, safe='')}/" \
           f"{quote(state, safe='')}/{quote(key, safe='')}"


def _series_params(from_: TimeArg, to: TimeArg, min_batch: int | None,
                   limit: int | None, savepoint: str | None = None,
                   allow_stale: bool = False) -> dict[str, str]:
    params = read_params(from_, to, min_batch, savepoint, allow_stale)
    if limit is not None:
        params["limit"] = str(limit)
    return params


def _page(r: httpx.Response, params: dict[str, str]) -> tuple[list[Point], dict[str, str] | None]:
    """A series page's points, and the parameters of the next page (None: the last)."""
    nxt = r.headers.get(NEXT_FROM)
    return Series.model_validate_json(r.content).root, \
        None if nxt is None else {**params, "from": nxt}


def _top(job: str, operator: str, state: str, n: int, descending: bool, window: TimeArg,
         min_batch: int | None, savepoint: str | None = None,
         allow_stale: bool = False) -> tuple[str, dict[str, str]]:
    """The path and parameters of a top-N request."""
    path = f"/v1/top/{quote(job, safe='')}/{quote(operator, safe='')}/{quote(state, safe='')}"
    return path, {"n": str(n), "order": "desc" if descending else "asc",
                  "window": _t(window) or "current",
                  **read_params(None, None, min_batch, savepoint, allow_stale)}


# A watch's stream is quiet between batches; the router sends a comment every 15 s, so a read
# that waits longer than this finds a connection that is gone.
WATCH_READ_TIMEOUT_S = 45.0
WATCH_MAX_BACKOFF_S = 5.0
# what ends a watch's connection without ending the watch: it reconnects and resumes
_DROPPED = (httpx.TransportError, SSEError)


def _watch_event(data: str) -> WatchEvent | None:
    """A watch event's data as the answer, or None for the router's keep-alive pings:
    comments, which the SSE standard does not dispatch, but which httpx-sse dispatches as an
    event without data once an earlier event set an id."""
    return WatchEvent.model_validate_json(data) if data else None


def _watch(job: str, operator: str, state: str, keys: Sequence[str], top: int | None,
           descending: bool, from_batch: int | None) -> tuple[str, list[tuple[str, str]]]:
    """The path and parameters of a watch: ``keys``, or ``top`` n of the current window."""
    path = f"/v1/watch/{quote(job, safe='')}/{quote(operator, safe='')}/{quote(state, safe='')}"
    params = [("key", k) for k in keys]
    if top is not None:
        params += [("top", str(top)), ("order", "desc" if descending else "asc")]
    if from_batch is not None:
        params.append(("from_batch", str(from_batch)))
    return path, params


def _position(topic: str, partition: int, offset: int) -> dict[str, str]:
    return {"topic": topic, "partition": str(partition), "offset": str(offset)}


def connection_args(url: str | None, ca: str | None, token: str | None,
                    token_file: str | None, insecure_token: bool | None) -> dict[str, Any]:
    """httpx client arguments (``base_url``, ``verify``, ``headers``): the router at ``url``,
    trusting ``ca`` (else the system's CAs), sending ``token`` (else the content of
    ``token_file``), never in plain text off loopback unless told so; what is None comes
    from the settings (QSTATE_ROUTER_URL, QSTATE_TLS_CA, QSTATE_TOKEN, QSTATE_TOKEN_FILE,
    QSTATE_ALLOW_INSECURE)."""
    s = settings()
    url = url or s.router_url
    ca = (s.tls_ca or None) if ca is None else ca
    if token is None and token_file is None:
        token, token_file = s.token or None, s.token_file or None
    if insecure_token is None:
        insecure_token = s.allow_insecure
    kw: dict[str, Any] = {"base_url": url}
    if not token and token_file:
        try:
            token = Path(token_file).read_text()
        except OSError as exc:
            raise InvalidRequest(f"client token file {token_file}: {exc.strerror}") from None
    token = clean_token(token or "", "the client token (QSTATE_TOKEN, --token)")
    parsed = httpx.URL(url)
    if token and parsed.scheme == "http" and not is_loopback(parsed.host):
        if not insecure_token:
            raise InvalidRequest(
                f"refusing to send the client token to {parsed.host} in plain text: use an "
                "https:// URL (and ca=), or insecure_token=True (QSTATE_ALLOW_INSECURE) where "
                "the network protects it")
        log.warning("the client token goes to %s in plain text (insecure_token)", parsed.host)
    if ca:
        kw["verify"] = ssl.create_default_context(cafile=ca)
    if token:
        kw["headers"] = {"authorization": f"Bearer {token}"}
    return kw


def _answer_error(status: int, content: bytes) -> QStateError:
    """The error an HTTP answer of ``status`` >= 400 carries (its body names the class)."""
    try:
        body = json.loads(content)
    except ValueError:
        body = {"message": content.decode("utf-8", "replace")}
    return from_http(status, body if isinstance(body, dict) else {"message": str(body)})


def _raise(r: httpx.Response) -> None:
    if r.status_code >= 400:
        raise _answer_error(r.status_code, r.content)


# the answers asked again (`retries` times): a shard or router that is busy or recovering
RETRIED = (429, 503)


def _retry_delay(retry_after: str | None, attempt: int, backoff: float) -> float:
    """Seconds before asking again after a 503 or 429 (``attempt`` from 0): ``backoff``
    doubling, at least the answer's Retry-After the first time."""
    try:
        hinted = float(retry_after or "0")
    except ValueError:
        hinted = 0.0
    return max(hinted if attempt == 0 else 0.0, backoff * (2 ** attempt))


def _delay(r: httpx.Response, attempt: int, backoff: float) -> float:
    return _retry_delay(r.headers.get("Retry-After"), attempt, backoff)


def retry_in(status: int, content: bytes, retry_after: str | None, attempt: int,
             retries: int, backoff: float) -> float | None:
    """After answer ``attempt`` (from 0) of a request: None when it is the answer (below
    400), the seconds to wait before asking again (a 503 or 429 with retries left), else
    raises the error the answer carries. What every client call of this module follows, and
    ``qstate.feast.wire``'s batch reads."""
    if status in RETRIED and attempt < retries:
        return _retry_delay(retry_after, attempt, backoff)
    if status >= 400:
        raise _answer_error(status, content)
    return None


class _Base:
    def __init__(self, retries: int, backoff_s: float, direct: bool | None,
                 map_ttl_s: float | None, allow_stale: bool | None,
                 connect: tuple[Any, ...]) -> None:
        self.retries = retries
        self.backoff_s = backoff_s
        s = settings()
        self.allow_stale = s.client_allow_stale if allow_stale is None else allow_stale
        direct = s.client_direct if direct is None else direct
        self._owners = Owners(s.client_map_ttl_s if map_ttl_s is None else map_ttl_s) \
            if direct else None
        self._connect = connect  # (timeout, ca, token, token_file, insecure_token)

    def _peer_args(self, url: str) -> dict[str, Any] | None:
        """httpx arguments for the router at ``url`` (as for the client's own), or None: it
        may not be asked (the token would cross in plain text), so the client's router is."""
        timeout, ca, token, token_file, insecure = self._connect
        try:
            return {"timeout": timeout, **connection_args(url, ca, token, token_file,
                                                          insecure)}
        except InvalidRequest as exc:
            log.warning("the cluster map names %s; asking the client's router instead: %s",
                        url, exc)
            return None

    def _map_path(self, job: str) -> str | None:
        """The path of ``job``'s cluster map when it is to be fetched now, else None."""
        if self._owners is None or not self._owners.wants(job):
            return None
        return map_path(job)

    def _mapped(self, job: str, r: httpx.Response | None) -> None:
        """``job``'s map as the router answered it (None, or not a 200: none to follow)."""
        assert self._owners is not None
        self._owners.put_answer(job, None if r is None else r.status_code,
                                b"" if r is None else r.content)

    def _split(self, job: str, operator: str, keys: Sequence[str]
               ) -> dict[str | None, list[int]]:
        """``keys``' indices by the router they are asked at (None: the client's)."""
        if self._owners is None or not keys:  # none: the router's 400 says why
            return {None: list(range(len(keys)))}
        return self._owners.split(job, operator, keys)

    def _unreachable(self, job: str, url: str | None, exc: Exception) -> None:
        """``url`` (a router of the map) could not be asked: re-raised when it is the
        client's own, else marked down (the key is asked at the client's router)."""
        if url is None or self._owners is None:
            raise exc
        self._owners.down(job, url, exc)

    def _answered(self, job: str, operator: str, key: str, r: httpx.Response) -> None:
        if self._owners is not None:
            self._owners.answered(job, operator, key, r.headers.get(OWNER))

    def _reconnect_in(self, r: httpx.Response | None, attempt: int,
                      max_reconnects: int | None) -> float:
        """Seconds before a watch connects again after ``r`` (None: the connection dropped
        or the stream ended), or the error: a 4xx other than 429 is the answer."""
        if r is not None and r.status_code not in RETRIED:
            _raise(r)
        if max_reconnects is not None and attempt >= max_reconnects:
            if r is not None:
                _raise(r)
            raise httpx.ReadError("the watch's connection dropped "
                                  f"{attempt + 1} times in a row (max_reconnects)")
        wait = self.backoff_s * (2 ** min(attempt, 10))
        if r is not None:
            wait = max(wait, _delay(r, 0, self.backoff_s))
        return min(wait, WATCH_MAX_BACKOFF_S)

    def _retry(self, r: httpx.Response, attempt: int) -> float | None:
        """Seconds to wait before asking again, or None: this is the answer."""
        return retry_in(r.status_code, r.content, r.headers.get("Retry-After"), attempt,
                        self.retries, self.backoff_s)


class Client(_Base):
    """A router's HTTP API. Use it as a context manager, or ``close()`` it."""

    def __init__(self, url: str | None = None, timeout: float = 5.0, retries: int = 3,
                 backoff_s: float = 0.2, *, ca: str | None = None, token: str | None = None,
                 token_file: str | None = None, insecure_token: bool | None = None,
                 direct: bool | None = None, map_ttl_s: float | None = None,
                 allow_stale: bool | None = None) -> None:
        """``url``: the router (None: QSTATE_ROUTER_URL). ``timeout``: seconds per request.
        ``retries``: times a 503 or 429 is asked again, after ``backoff_s`` doubling (at
        least the Retry-After the router sent). ``ca``: CA bundle of an https:// router
        (None: QSTATE_TLS_CA, else the system's). ``token`` or ``token_file``: the client
        token (both None: QSTATE_TOKEN, QSTATE_TOKEN_FILE). ``insecure_token``: send it over
        http:// to another host (None: QSTATE_ALLOW_INSECURE). ``direct``: ask each key at a
        router on its owner's node, as the job's cluster map (cached, at most ``map_ttl_s``
        old) names it (None: QSTATE_CLIENT_DIRECT, QSTATE_CLIENT_MAP_TTL_S). ``allow_stale``:
        when a partition's owner cannot answer, a follower of it may, as of its own batch
        (each answer's ``batch``; None: QSTATE_CLIENT_ALLOW_STALE); else that read is the
        owner's 503, retried."""
        super().__init__(retries, backoff_s, direct, map_ttl_s, allow_stale,
                         (timeout, ca, token, token_file, insecure_token))
        self._http = httpx.Client(timeout=timeout, **connection_args(
            url, ca, token, token_file, insecure_token))
        self._peers: dict[str, httpx.Client | None] = {}

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes the connections to the router (and to those of the cluster map)."""
        self._http.close()
        for c in self._peers.values():
            if c is not None:
                c.close()

    def _request(self, method: str, path: str, via: httpx.Client | None = None,
                 **kw: Any) -> httpx.Response:
        attempt = 0
        while True:
            r = (via or self._http).request(method, path, **kw)
            wait = self._retry(r, attempt)
            if wait is None:
                return r
            time.sleep(wait)
            attempt += 1

    def _peer(self, url: str | None) -> httpx.Client:
        if url is None:
            return self._http
        if url not in self._peers:
            args = self._peer_args(url)
            self._peers[url] = httpx.Client(**args) if args is not None else None
        return self._peers[url] or self._http

    def _read(self, job: str, operator: str, keys: Sequence[str], method: str, path: str,
              **kw: Any) -> list[tuple[list[int], httpx.Response]]:
        """A read of ``keys``, each group of them asked where the cluster map says (one
        group, the client's router, without ``direct``): (indices, answer) per group."""
        if (mp := self._map_path(job)) is not None:
            try:
                self._mapped(job, self._http.get(mp))
            except httpx.TransportError:
                self._mapped(job, None)
        out = []
        for url, idx in self._split(job, operator, keys).items():
            sub = kw if len(idx) == len(keys) else _with_keys(kw, [keys[i] for i in idx])
            try:
                r = self._request(method, path, via=self._peer(url), **sub)
            except httpx.TransportError as exc:
                self._unreachable(job, url, exc)
                r = self._request(method, path, **sub)
            if idx:
                self._answered(job, operator, keys[idx[0]], r)
            out.append((idx, r))
        return out

    def get(self, job: str, operator: str, state: str, key: str, *, from_: TimeArg = None,
            to: TimeArg = None, min_batch: int | None = None,
            savepoint: str | None = None) -> StateAnswer:
        """One key of one state: its latest window, or (``from_``, ``to``) its windows
        starting in [from_, to), oldest first; a time is epoch ms, an ISO-8601 string, a
        datetime, or relative (``"now-1h"``). ``min_batch``: answer as of that batch or a
        later one (read your writes). ``savepoint``: as of that savepoint of the job
        (``qstate savepoint create``; the answer's ``batch`` is its batch). Raises NotFound
        when the key has no data (its ``detail`` names the batch) or the job, operator or
        state (or savepoint) is unknown."""
        [(_, r)] = self._read(job, operator, [key], "GET", _key_path(job, operator, state, key),
                              params=read_params(from_, to, min_batch, savepoint,
                                                 self.allow_stale))
        return StateAnswer.model_validate_json(r.content)

    def history(self, job: str, operator: str, state: str, key: str, from_: TimeArg,
                to: TimeArg) -> StateAnswer:
        """``get`` of the key's windows starting in [from_, to)."""
        return self.get(job, operator, state, key, from_=from_, to=to)

    def series(self, job: str, operator: str, state: str, key: str, from_: TimeArg = None,
               to: TimeArg = None, *, min_batch: int | None = None,
               limit: int | None = None, savepoint: str | None = None) -> list[Point]:
        """The key's windows in [from_, to) as points (``time``: the window's start,
        ``value``), oldest first, every page of them; [] when the key has no data. Without
        ``from_``: its latest window. ``limit``: windows a request (None: the router's
        most, QSTATE_MAX_WINDOWS). ``savepoint``: as in ``get``."""
        params: dict[str, str] | None = _series_params(from_, to, min_batch, limit, savepoint,
                                                       self.allow_stale)
        points: list[Point] = []
        while params is not None:
            page, params = _page(self._request(
                "GET", _series_path(job, operator, state, key), params=params), params)
            points += page
        return points

    def multi_get(self, job: str, operator: str, state: str, keys: list[str], *,
                  from_: TimeArg = None, to: TimeArg = None, min_batch: int | None = None,
                  savepoint: str | None = None) -> list[StateAnswer]:
        """``get`` of many keys of one state in one request, one answer per key in order
        (a key without data: ``found`` false, not an error). At most the router's
        QSTATE_MAX_BATCH_KEYS keys."""
        got = self._read(job, operator, keys, "POST",
                         f"{state_path(job, operator, state)}:batchGet", json={"keys": keys},
                         params=read_params(from_, to, min_batch, savepoint,
                                            self.allow_stale))
        return _merged(len(keys), [(idx, BatchAnswer.model_validate_json(r.content).results)
                                   for idx, r in got])

    def multi_get_states(self, job: str, operator: str, states: list[str], keys: list[str], *,
                         from_: TimeArg = None, to: TimeArg = None,
                         min_batch: int | None = None,
                         savepoint: str | None = None) -> list[dict[str, StateAnswer]]:
        """``multi_get`` of several states of one operator in one request: one
        ``{state: answer}`` per key in order, **a key's states as of one batch** (the router
        reads them again when a commit lands between them). At most the router's
        QSTATE_MAX_BATCH_KEYS answers (keys × states)."""
        got = self._read(job, operator, keys, "POST", f"{operator_path(job, operator)}:batchGet",
                         json={"keys": keys, "states": states},
                         params=read_params(from_, to, min_batch, savepoint,
                                            self.allow_stale))
        return _merged(len(keys), [
            (idx, by_key([keys[i] for i in idx], states,
                         BatchAnswer.model_validate_json(r.content).results))
            for idx, r in got])

    def top(self, job: str, operator: str, state: str, n: int = 10, *,
            descending: bool = True, window: TimeArg = None,
            min_batch: int | None = None, savepoint: str | None = None) -> TopAnswer:
        """The ``n`` keys with the largest (``descending=False``: smallest) value of
        ``state`` in one window across every partition, ties by key; ``window``: a time in
        the window (None: the current one, the oldest still open at the watermark).
        ``savepoint``: as of that savepoint of the job."""
        path, params = _top(job, operator, state, n, descending, window, min_batch,
                            savepoint, self.allow_stale)
        return TopAnswer.model_validate_json(self._request("GET", path, params=params).content)

    def watch(self, job: str, operator: str, state: str, keys: Sequence[str] = (), *,
              top: int | None = None, descending: bool = True, from_batch: int | None = None,
              max_reconnects: int | None = None) -> Generator[WatchEvent, None, None]:
        """Pushed changes, as the router commits batches: events with the latest window of
        each of ``keys`` that changed, or (``top=n``) the current window's board whenever it
        changed. The first event holds every value (``snapshot``). A dropped connection, a
        503 or the end of the stream (a router stopping) reconnects with backoff and
        resumes after the last event's ``batch``: nothing is missed, though a value may come
        twice. ``max_reconnects``: consecutive failures before raising (None: never).
        Break out of the loop to stop watching."""
        path, _ = _watch(job, operator, state, keys, top, descending, None)
        last, attempt = from_batch, 0
        timeout = httpx.Timeout(self._http.timeout.connect, read=WATCH_READ_TIMEOUT_S)
        while True:
            failed: httpx.Response | None = None
            try:
                with connect_sse(self._http, "GET", path, timeout=timeout, params=_watch(
                        job, operator, state, keys, top, descending, last)[1]) as es:
                    if es.response.status_code >= 400:
                        es.response.read()
                        failed = es.response
                    else:
                        for sse in es.iter_sse():
                            if (ev := _watch_event(sse.data)) is not None:
                                attempt, last = 0, ev.batch
                                yield ev
            except _DROPPED as exc:
                log.info("watch of %s/%s/%s dropped (%s): resuming", job, operator, state, exc)
            time.sleep(self._reconnect_in(failed, attempt, max_reconnects))
            attempt += 1

    def position(self, job: str, topic: str, partition: int, offset: int) -> JobPosition:
        """The batch of ``job`` that counted the Kafka record at ``offset`` (the offset a
        producer's delivery report gives): read with ``min_batch`` set to its ``batch`` and
        the answer counts the record. While the job has not read it, the router answers 503,
        retried like any other."""
        r = self._request("GET", f"/v1/jobs/{quote(job, safe='')}/position",
                          params=_position(topic, partition, offset))
        return JobPosition.model_validate_json(r.content)

    def jobs(self) -> JobList:
        """The jobs the router serves, with their operators' names."""
        return JobList.model_validate_json(self._request("GET", "/v1/jobs").content)

    def describe(self, job: str) -> JobInfo:
        """One job's operators: key, states and their types, window, partitions (and how
        many answer now), last batch and watermark."""
        r = self._request("GET", f"/v1/jobs/{quote(job, safe='')}")
        return JobInfo.model_validate_json(r.content)


class AsyncClient(_Base):
    """``Client`` for asyncio: the same methods, awaited (``watch``: an async iterator)."""

    def __init__(self, url: str | None = None, timeout: float = 5.0, retries: int = 3,
                 backoff_s: float = 0.2, *, ca: str | None = None, token: str | None = None,
                 token_file: str | None = None, insecure_token: bool | None = None,
                 direct: bool | None = None, map_ttl_s: float | None = None,
                 allow_stale: bool | None = None) -> None:
        """As ``Client``'s."""
        super().__init__(retries, backoff_s, direct, map_ttl_s, allow_stale,
                         (timeout, ca, token, token_file, insecure_token))
        self._http = httpx.AsyncClient(timeout=timeout, **connection_args(
            url, ca, token, token_file, insecure_token))
        self._peers: dict[str, httpx.AsyncClient | None] = {}

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Closes the connections to the router (and to those of the cluster map)."""
        await self._http.aclose()
        for c in self._peers.values():
            if c is not None:
                await c.aclose()

    async def _request(self, method: str, path: str, via: httpx.AsyncClient | None = None,
                       **kw: Any) -> httpx.Response:
        attempt = 0
        while True:
            r = await (via or self._http).request(method, path, **kw)
            wait = self._retry(r, attempt)
            if wait is None:
                return r
            await asyncio.sleep(wait)
            attempt += 1

    def _peer(self, url: str | None) -> httpx.AsyncClient:
        if url is None:
            return self._http
        if url not in self._peers:
            args = self._peer_args(url)
            self._peers[url] = httpx.AsyncClient(**args) if args is not None else None
        return self._peers[url] or self._http

    async def _read(self, job: str, operator: str, keys: Sequence[str], method: str,
                    path: str, **kw: Any) -> list[tuple[list[int], httpx.Response]]:
        """``Client._read``, the groups asked at once."""
        if (mp := self._map_path(job)) is not None:
            try:
                self._mapped(job, await self._http.get(mp))
            except httpx.TransportError:
                self._mapped(job, None)

        async def one(url: str | None, idx: list[int]) -> tuple[list[int], httpx.Response]:
            sub = kw if len(idx) == len(keys) else _with_keys(kw, [keys[i] for i in idx])
            try:
                r = await self._request(method, path, via=self._peer(url), **sub)
            except httpx.TransportError as exc:
                self._unreachable(job, url, exc)
                r = await self._request(method, path, **sub)
            if idx:
                self._answered(job, operator, keys[idx[0]], r)
            return idx, r

        return list(await asyncio.gather(*(
            one(url, idx) for url, idx in self._split(job, operator, keys).items())))

    async def get(self, job: str, operator: str, state: str, key: str, *,
                  from_: TimeArg = None, to: TimeArg = None, min_batch: int | None = None,
                  savepoint: str | None = None) -> StateAnswer:
        """``Client.get``."""
        [(_, r)] = await self._read(job, operator, [key], "GET",
                                    _key_path(job, operator, state, key),
                                    params=read_params(from_, to, min_batch, savepoint,
                                                       self.allow_stale))
        return StateAnswer.model_validate_json(r.content)

    async def history(self, job: str, operator: str, state: str, key: str, from_: TimeArg,
                      to: TimeArg) -> StateAnswer:
        """``Client.history``."""
        return await self.get(job, operator, state, key, from_=from_, to=to)

    async def series(self, job: str, operator: str, state: str, key: str,
                     from_: TimeArg = None, to: TimeArg = None, *,
                     min_batch: int | None = None, limit: int | None = None,
                     savepoint: str | None = None) -> list[Point]:
        """``Client.series``."""
        params: dict[str, str] | None = _series_params(from_, to, min_batch, limit, savepoint,
                                                       self.allow_stale)
        points: list[Point] = []
        while params is not None:
            page, params = _page(await self._request(
                "GET", _series_path(job, operator, state, key), params=params), params)
            points += page
        return points

    async def multi_get(self, job: str, operator: str, state: str, keys: list[str], *,
                        from_: TimeArg = None, to: TimeArg = None,
                        min_batch: int | None = None,
                        savepoint: str | None = None) -> list[StateAnswer]:
        """``Client.multi_get``."""
        got = await self._read(job, operator, keys, "POST",
                               f"{state_path(job, operator, state)}:batchGet",
                               json={"keys": keys},
                               params=read_params(from_, to, min_batch, savepoint,
                                                  self.allow_stale))
        return _merged(len(keys), [(idx, BatchAnswer.model_validate_json(r.content).results)
                                   for idx, r in got])

    async def multi_get_states(self, job: str, operator: str, states: list[str],
                               keys: list[str], *, from_: TimeArg = None, to: TimeArg = None,
                               min_batch: int | None = None,
                               savepoint: str | None = None) -> list[dict[str, StateAnswer]]:
        """``Client.multi_get_states``."""
        got = await self._read(job, operator, keys, "POST",
                               f"{operator_path(job, operator)}:batchGet",
                               json={"keys": keys, "states": states},
                               params=read_params(from_, to, min_batch, savepoint,
                                                  self.allow_stale))
        return _merged(len(keys), [
            (idx, by_key([keys[i] for i in idx], states,
                         BatchAnswer.model_validate_json(r.content).results))
            for idx, r in got])

    async def top(self, job: str, operator: str, state: str, n: int = 10, *,
                  descending: bool = True, window: TimeArg = None,
                  min_batch: int | None = None, savepoint: str | None = None) -> TopAnswer:
        """``Client.top``."""
        path, params = _top(job, operator, state, n, descending, window, min_batch,
                            savepoint, self.allow_stale)
        r = await self._request("GET", path, params=params)
        return TopAnswer.model_validate_json(r.content)

    async def watch(self, job: str, operator: str, state: str, keys: Sequence[str] = (), *,
                    top: int | None = None, descending: bool = True,
                    from_batch: int | None = None, max_reconnects: int | None = None
                    ) -> AsyncGenerator[WatchEvent, None]:
        """``Client.watch``, as an async iterator."""
        path, _ = _watch(job, operator, state, keys, top, descending, None)
        last, attempt = from_batch, 0
        timeout = httpx.Timeout(self._http.timeout.connect, read=WATCH_READ_TIMEOUT_S)
        while True:
            failed: httpx.Response | None = None
            try:
                async with aconnect_sse(self._http, "GET", path, timeout=timeout, params=_watch(
                        job, operator, state, keys, top, descending, last)[1]) as es:
                    if es.response.status_code >= 400:
                        await es.response.aread()
                        failed = es.response
                    else:
                        async for sse in es.aiter_sse():
                            if (ev := _watch_event(sse.data)) is not None:
                                attempt, last = 0, ev.batch
                                yield ev
            except _DROPPED as exc:
                log.info("watch of %s/%s/%s dropped (%s): resuming", job, operator, state, exc)
            await asyncio.sleep(self._reconnect_in(failed, attempt, max_reconnects))
            attempt += 1

    async def position(self, job: str, topic: str, partition: int, offset: int
                       ) -> JobPosition:
        """``Client.position``."""
        r = await self._request("GET", f"/v1/jobs/{quote(job, safe='')}/position",
                                params=_position(topic, partition, offset))
        return JobPosition.model_validate_json(r.content)

    async def jobs(self) -> JobList:
        """``Client.jobs``."""
        return JobList.model_validate_json((await self._request("GET", "/v1/jobs")).content)

    async def describe(self, job: str) -> JobInfo:
        """``Client.describe``."""
        r = await self._request("GET", f"/v1/jobs/{quote(job, safe='')}")
        return JobInfo.model_validate_json(r.content)
