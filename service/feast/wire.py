"""The store's batch reads on the wire (docs/feast.md, speed): the ``:batchGet`` of several
states of one operator as qstate's client sends it, over a pool of kept-alive HTTP/1.1
connections (urllib3) instead of httpx. A Feast call is a read per operator (chunked) inside
a model's latency budget, and the transport was most of it:
a one-key ``:batchGet`` from Python cost 0.71 ms through httpx and 0.27 ms through urllib3
against the same router (2026-11-27, this machine). What the client's other calls need
(watch streams, an event loop of their own) a batch read does not.

The rules are the client's, from ``qstate.client``: the router's URL, CA and token
(``connection_args``), the path and query, an error answer as its qstate class, a 503 or
429 asked again after Retry-After up to ``retries`` times (``retry_in``); a router that does
not answer is ``Unavailable`` (``unreachable``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from urllib.parse import urlencode

import httpx
import urllib3

from qstate.client import connection_args, operator_path, read_params, retry_in
from qstate.core.answer import BatchAnswer, StateAnswer
from qstate.core.errors import Unavailable

__all__ = ["Wire", "unreachable"]

# connections kept per router: a call's reads go at once (one per state and chunk), from
# feast serve's read threads (8) and the store's request threads (4)
POOL_SIZE = 16


def unreachable(url: str, timeout_s: float, exc: Exception) -> Unavailable:
    """A router that did not answer (a transport error of httpx or urllib3), as qstate's
    error: never a Feast row of nothing."""
    # urllib3's NewConnectionError (refused) is a ConnectTimeoutError too, for old callers
    timeout = (isinstance(exc, httpx.TimeoutException | urllib3.exceptions.TimeoutError)
               and not isinstance(exc, urllib3.exceptions.NewConnectionError))
    if timeout:
        return Unavailable(f"the qstate router at {url} did not answer within {timeout_s} s "
                           f"(timeout_s): {exc!r}", reason="router-timeout")
    return Unavailable(f"the qstate router at {url} cannot be reached: {exc!r}",
                       reason="router-unreachable")


class Wire:
    """Batch reads of one router; safe to share between threads."""

    def __init__(self, url: str | None, timeout_s: float, retries: int, ca: str | None,
                 token: str | None, token_file: str | None, backoff_s: float = 0.2) -> None:
        kw = connection_args(url, ca, token, token_file, None)
        self.url = str(kw["base_url"]).rstrip("/")
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self.headers = {"content-type": "application/json", **kw.get("headers", {})}
        self.pool = urllib3.PoolManager(
            maxsize=POOL_SIZE, ssl_context=kw.get("verify"), retries=False,
            timeout=urllib3.Timeout(timeout_s))

    def multi_get_states(self, job: str, operator: str, states: Sequence[str],
                         keys: Sequence[str], *, from_: int | None = None, to: int | None = None,
                         min_batch: int | None = None) -> list[StateAnswer]:
        """Several states of one operator in one request (``Client.multi_get_states``): one
        answer per key and state, key by key, each key's states in the order given and as of
        one batch."""
        url = f"{self.url}{operator_path(job, operator)}:batchGet"
        query = read_params(from_, to, min_batch)
        if query:
            url += "?" + urlencode(query)
        data = json.dumps({"keys": list(keys), "states": list(states)}).encode()
        attempt = 0
        while True:
            try:
                r = self.pool.request("POST", url, body=data, headers=self.headers)
            except urllib3.exceptions.HTTPError as exc:
                raise unreachable(self.url, self.timeout_s, exc) from exc
            wait = retry_in(r.status, r.data, r.headers.get("Retry-After"), attempt,
                            self.retries, self.backoff_s)
            if wait is None:
                return BatchAnswer.model_validate_json(r.data).results
            time.sleep(wait)
            attempt += 1

    def close(self) -> None:
        self.pool.clear()
