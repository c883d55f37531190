"""Kept-alive HTTP/1.1 connections to one router, for the Feast store's batch reads
(docs/feast.md, speed). A Feast call is one request per operator inside a model's latency
budget: a one-key ``:batchGet`` of two states, back to back against the same router, took
0.12-0.16 ms (p50) through urllib3, whose ``http.client`` parses headers with ``email``, and
0.10-0.11 ms through a socket and httptools' parser (llhttp, which uvicorn parses requests
with), in four runs (2026-11-27, this machine).

What a batch read needs and no more: a request written at once, its answer read to its end
(Content-Length or chunked, as llhttp frames them), its status, body and Retry-After, and the
connection kept while both sides keep it alive. A kept connection the router closed while it
was idle is replaced once and the request sent again: every request sent here is a read.
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools

from qstate.core.errors import InvalidRequest
from qstate.core.transport.cluster_map import OWNER as OWNER_HEADER

__all__ = ["Answer", "Closed", "Connections"]

# read into one buffer per connection: socket.recv(n) allocates n bytes a call, 2 µs at
# 64 KiB and 13-17 µs at 256 KiB here (a 100-key answer of two states is ~40 KB)
RECV_BYTES = 64 * 1024
OWNER = OWNER_HEADER.encode("latin-1")


class Closed(ConnectionError):
    """The router closed the connection before its answer ended."""


@dataclass(frozen=True, slots=True)
class Answer:
    """A router's answer: what ``qstate.client.retry_in`` reads."""

    status: int
    body: bytes
    retry_after: str | None
    owner: str | None = None  # qstate-owner: the server that owns the keys read, when one does


class _Connection:
    """One socket and its parser, one request at a time."""

    def __init__(self, host: str, port: int, tls: ssl.SSLContext | None,
                 timeout_s: float) -> None:
        sock = socket.create_connection((host, port), timeout=timeout_s)
        try:
            # a request is one write, its answer awaited: Nagle would hold a small write back
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if tls is not None:
                sock = tls.wrap_socket(sock, server_hostname=host)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self.parser = httptools.HttpResponseParser(self)
        self._buf = memoryview(bytearray(RECV_BYTES))
        self._body: list[bytes] = []
        self._retry_after: str | None = None
        self._owner: str | None = None
        self._done = self._alive = False

    # httptools' callbacks, by name
    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"retry-after":
            self._retry_after = value.decode("latin-1")
        elif name == OWNER:
            self._owner = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        # read here: once the message ends, llhttp's state is the next one's (not alive)
        self._done, self._alive = True, self.parser.should_keep_alive()

    def exchange(self, request: bytes) -> tuple[Answer, bool]:
        """Sends ``request``, reads its answer; and whether the connection may be kept."""
        self._body, self._retry_after, self._owner, self._done = [], None, None, False
        self.sock.sendall(request)
        while not self._done:
            n = self.sock.recv_into(self._buf)
            if not n:
                raise Closed("the router closed the connection before its answer ended")
            self.parser.feed_data(self._buf[:n])
        answer = Answer(self.parser.get_status_code(), b"".join(self._body), self._retry_after,
                        self._owner)
        return answer, self._alive

    def close(self) -> None:
        self.sock.close()


class Connections:
    """Connections to the router at ``url`` (http or https, trusting ``tls``, else the
    system's CAs), at most ``keep`` kept idle, every request with ``headers``; safe to share
    between threads: a request takes an idle connection or opens one, and gives it back after
    its answer."""

    def __init__(self, url: str, tls: ssl.SSLContext | None, timeout_s: float, keep: int,
                 headers: Mapping[str, str]) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidRequest(f"the router's URL {url!r} is not http://host:port or "
                                 "https://host:port")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.tls = (tls or ssl.create_default_context()) if parts.scheme == "https" else None
        self.prefix = parts.path.rstrip("/")
        # every request's headers but its length, written once
        self.head = "".join(f"{k}: {v}\r\n" for k, v in {
            "Host": parts.netloc.rpartition("@")[2], **headers}.items())
        self.timeout_s, self.keep = timeout_s, keep
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()

    def request(self, method: str, target: str, body: bytes) -> Answer:
        """``method`` ``target`` (a path and query) with ``body``; raises OSError (``Closed``,
        a timeout, a refusal, TLS) or ``httptools.HttpParserError`` (not HTTP/1.1)."""
        request = (f"{method} {self.prefix}{target} HTTP/1.1\r\n{self.head}"
                   f"Content-Length: {len(body)}\r\n\r\n").encode("latin-1") + body
        with self._lock:
            kept = self._idle.pop() if self._idle else None
        if kept is not None:
            try:
                return self._exchange(kept, request)
            except (Closed, ConnectionResetError, BrokenPipeError):
                pass  # closed by the router while idle: once more, on a new connection
        return self._exchange(_Connection(self.host, self.port, self.tls, self.timeout_s),
                              request)

    def _exchange(self, conn: _Connection, request: bytes) -> Answer:
        try:
            answer, alive = conn.exchange(request)
        except BaseException:
            conn.close()
            raise
        with self._lock:
            if alive and len(self._idle) < self.keep:
                self._idle.append(conn)
                return answer
        conn.close()
        return answer

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
