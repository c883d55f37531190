"""The store's batch reads on the wire (docs/feast.md, speed): the ``:batchGet`` of several
states of one operator as qstate's client sends it, over kept-alive HTTP/1.1 connections of
its own (``qstate.feast.connections``) instead of httpx. What the client's other calls need
(watch streams, an event loop of their own) a batch read does not.

The rules are the client's, from ``qstate.client``: the router's URL, CA and token
(``connection_args``), the path and query, an error answer as its qstate class, a 503 or
429 asked again after Retry-After up to ``retries`` times (``retry_in``); a router that does
not answer is ``Unavailable`` (``unreachable``); with ``direct``, each key asked at a router
on its owner's node, as the client's ``direct`` does (the job's cluster map: a hint, a stale
one costs a hop, never a wrong answer).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlencode

import httptools
import httpx
import orjson
from pydantic import ValidationError

from qstate.client import connection_args, operator_path, read_params, retry_in
from qstate.core.answer import StateValues, batch_values
from qstate.core.errors import InvalidRequest, Unavailable
from qstate.core.transport.cluster_map import Owners, map_path
from qstate.feast.connections import Connections

__all__ = ["Wire", "unreachable"]

log = logging.getLogger(__name__)

# connections kept per router: a call's reads go at once (one per operator and chunk), from
# feast serve's read threads (8) and the store's request threads (4)
POOL_SIZE = 16


def unreachable(url: str, timeout_s: float, exc: Exception) -> Unavailable:
    """A router that did not answer (a transport error of httpx or of the wire's own
    connections), as qstate's error: never a Feast row of nothing."""
    if isinstance(exc, httpx.TimeoutException | TimeoutError):
        return Unavailable(f"the qstate router at {url} did not answer within {timeout_s} s "
                           f"(timeout_s): {exc!r}", reason="router-timeout")
    if isinstance(exc, httptools.HttpParserError):
        return Unavailable(f"the qstate router at {url} answered what is not HTTP/1.1: "
                           f"{exc!r}", reason="router-unreachable")
    return Unavailable(f"the qstate router at {url} cannot be reached: {exc!r}",
                       reason="router-unreachable")


class Wire:
    """Batch reads of one router, and with ``direct`` of the routers its cluster map names
    (``qstate.core.transport.cluster_map``); safe to share between threads."""

    def __init__(self, url: str | None, timeout_s: float, retries: int, ca: str | None,
                 token: str | None, token_file: str | None, backoff_s: float = 0.2,
                 direct: bool = False, map_ttl_s: float = 30.0,
                 allow_stale: bool = False) -> None:
        kw = connection_args(url, ca, token, token_file, None)
        self.url = str(kw["base_url"]).rstrip("/")
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self.allow_stale = allow_stale  # a follower may answer when the owner cannot
        self.connections = self._connect(kw)
        self._auth = (ca, token, token_file)
        self._paths: dict[tuple[str, str], str] = {}
        # direct: the job's map, and connections to the routers it names (None: one the
        # token may not be sent to, whose keys the client's router is asked)
        self.owners = Owners(map_ttl_s) if direct else None
        self._peers: dict[str, Connections | None] = {}
        self._lock = threading.Lock()

    def _connect(self, kw: dict[str, Any]) -> Connections:
        return Connections(str(kw["base_url"]).rstrip("/"), kw.get("verify"), self.timeout_s,
                           POOL_SIZE, {"Content-Type": "application/json",
                                       **kw.get("headers", {})})

    def split(self, job: str, operator: str, keys: Sequence[str]
              ) -> dict[str | None, list[int]]:
        """``keys``' indices by the router each is asked at (None: the client's): with
        ``direct``, a router on its owner's node as the job's map (fetched when due) names."""
        if self.owners is None or not keys:
            return {None: list(range(len(keys)))}
        with self._lock:
            due = self.owners.wants(job)
        if due:
            self._fetch_map(job)
        with self._lock:
            return self.owners.split(job, operator, keys)

    def _fetch_map(self, job: str) -> None:
        assert self.owners is not None
        try:
            r = self.connections.request("GET", map_path(job), b"")
            status, body = r.status, r.body
        except (OSError, httptools.HttpParserError):
            status, body = None, b""  # none to follow until the map is due again
        with self._lock:
            self.owners.put_answer(job, status, body)

    def _peer(self, at: str | None) -> Connections:
        if at is None:
            return self.connections
        with self._lock:
            if at not in self._peers:
                ca, token, token_file = self._auth
                try:
                    self._peers[at] = self._connect(
                        connection_args(at, ca, token, token_file, None))
                except InvalidRequest as exc:
                    log.warning("the cluster map names %s; asking the client's router "
                                "instead: %s", at, exc)
                    self._peers[at] = None
            return self._peers[at] or self.connections

    def multi_get_states(self, job: str, operator: str, states: Sequence[str],
                         keys: Sequence[str], *, from_: int | None = None, to: int | None = None,
                         min_batch: int | None = None, at: str | None = None
                         ) -> list[StateValues]:
        """Several states of one operator in one request (``Client.multi_get_states``): one
        answer per key and state, key by key, each key's states in the order given and as of
        one batch; read as ``StateValues``, the fields a feature needs. ``at``: the router
        that ``split`` named (None: the client's); one that cannot be reached is skipped a
        while and the client's router asked, which forwards the keys."""
        target = self._paths.get((job, operator))
        if target is None:
            target = self._paths.setdefault((job, operator),
                                            f"{operator_path(job, operator)}:batchGet")
        query = read_params(from_, to, min_batch, allow_stale=self.allow_stale)
        if query:
            target += "?" + urlencode(query)
        data = orjson.dumps({"keys": list(keys), "states": list(states)})
        attempt = 0
        via = self._peer(at)
        while True:
            try:
                r = via.request("POST", target, data)
            except (OSError, httptools.HttpParserError) as exc:
                if via is self.connections:
                    raise unreachable(self.url, self.timeout_s, exc) from exc
                self._down(job, at, exc)
                via = self.connections
                continue
            wait = retry_in(r.status, r.body, r.retry_after, attempt, self.retries,
                            self.backoff_s)
            if wait is None:
                if self.owners is not None and keys:
                    with self._lock:
                        self.owners.answered(job, operator, keys[0], r.owner)
                return self._results(r.body, len(keys) * len(states))
            time.sleep(wait)
            attempt += 1

    def _down(self, job: str, at: str | None, exc: Exception) -> None:
        assert self.owners is not None and at is not None
        with self._lock:
            self.owners.down(job, at, exc)

    def _results(self, body: bytes, asked: int) -> list[StateValues]:
        try:
            results = batch_values(body)
        except ValidationError as exc:
            raise Unavailable(f"the qstate router at {self.url} answered a batch read with "
                              f"what is not a batch answer: {exc}",
                              reason="router-garbled") from None
        if len(results) != asked:
            raise Unavailable(f"the qstate router at {self.url} answered {len(results)} of the "
                              f"{asked} (keys × states) asked", reason="router-garbled")
        return results

    def close(self) -> None:
        self.connections.close()
        with self._lock:
            peers, self._peers = list(self._peers.values()), {}
        for c in peers:
            if c is not None:
                c.close()
