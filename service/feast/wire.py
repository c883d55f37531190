"""The store's batch reads on the wire (docs/feast.md, speed): the ``:batchGet`` of several
states of one operator as qstate's client sends it, over kept-alive HTTP/1.1 connections of
its own (``qstate.feast.connections``) instead of httpx. What the client's other calls need
(watch streams, an event loop of their own) a batch read does not.

The rules are the client's, from ``qstate.client``: the router's URL, CA and token
(``connection_args``), the path and query, an error answer as its qstate class, a 503 or
429 asked again after Retry-After up to ``retries`` times (``retry_in``); a router that does
not answer is ``Unavailable`` (``unreachable``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from urllib.parse import urlencode

import httptools
import httpx
import orjson
from pydantic import ValidationError

from qstate.client import connection_args, operator_path, read_params, retry_in
from qstate.core.answer import StateValues, batch_values
from qstate.core.errors import Unavailable
from qstate.feast.connections import Connections

__all__ = ["Wire", "unreachable"]

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
    """Batch reads of one router; safe to share between threads."""

    def __init__(self, url: str | None, timeout_s: float, retries: int, ca: str | None,
                 token: str | None, token_file: str | None, backoff_s: float = 0.2) -> None:
        kw = connection_args(url, ca, token, token_file, None)
        self.url = str(kw["base_url"]).rstrip("/")
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self.connections = Connections(
            self.url, kw.get("verify"), timeout_s, POOL_SIZE,
            {"Content-Type": "application/json", **kw.get("headers", {})})
        self._paths: dict[tuple[str, str], str] = {}

    def multi_get_states(self, job: str, operator: str, states: Sequence[str],
                         keys: Sequence[str], *, from_: int | None = None, to: int | None = None,
                         min_batch: int | None = None) -> list[StateValues]:
        """Several states of one operator in one request (``Client.multi_get_states``): one
        answer per key and state, key by key, each key's states in the order given and as of
        one batch; read as ``StateValues``, the fields a feature needs."""
        target = self._paths.get((job, operator))
        if target is None:
            target = self._paths.setdefault((job, operator),
                                            f"{operator_path(job, operator)}:batchGet")
        query = read_params(from_, to, min_batch)
        if query:
            target += "?" + urlencode(query)
        data = orjson.dumps({"keys": list(keys), "states": list(states)})
        attempt = 0
        while True:
            try:
                r = self.connections.request("POST", target, data)
            except (OSError, httptools.HttpParserError) as exc:
                raise unreachable(self.url, self.timeout_s, exc) from exc
            wait = retry_in(r.status, r.body, r.retry_after, attempt, self.retries,
                            self.backoff_s)
            if wait is None:
                return self._results(r.body, len(keys) * len(states))
            time.sleep(wait)
            attempt += 1

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
