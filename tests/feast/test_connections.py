"""The Feast store's own HTTP/1.1 connections (``qstate.feast.connections``) and the batch
reads over them (``qstate.feast.wire``), against a server over a real socket that answers as a
test scripts it: connections kept and reused, one the server closed while idle replaced, an
answer cut short, what is not HTTP, a server that never answers, and any bytes at all (a
Hypothesis property): a transport failure is ``Unavailable`` by name, never another
exception or a hang. The same reads against real routers: tests/feast/test_tweets.py (and
over TLS, tests/security/test_transport.py)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qstate.core.errors import QStateError, Unavailable
from qstate.feast.connections import RECV_BYTES, Closed, Connections
from qstate.feast.wire import Wire
from tests.helpers import http_message

Conn = Callable[[socket.socket], None]  # what the server does with one accepted connection


def http(status: int, body: bytes, *headers: str) -> bytes:
    lines = "".join(f"{h}\r\n" for h in headers)
    return (f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n{lines}\r\n").encode() + body


def results(n: int) -> bytes:
    one = {"job": "j", "operator": "o", "state": "s", "key": "k", "found": True, "batch": 4,
           "watermark": 9, "windows": [{"start": 0, "end": 60_000, "value": 3}]}
    return json.dumps({"results": [one] * n}).encode()


def sends(data: bytes) -> Conn:
    """A connection that reads one request, answers ``data`` and closes."""
    def conn(sock: socket.socket) -> None:
        http_message(sock)
        sock.sendall(data)
    return conn


def hangs(until: threading.Event) -> Conn:
    """A connection that reads one request and answers nothing (until the test ends)."""
    def conn(sock: socket.socket) -> None:
        http_message(sock)
        until.wait(30)
    return conn


@dataclass
class Server:
    """Accepts connections on 127.0.0.1 and hands each to ``script`` (per connection, in
    order; the last one for every connection after), keeping what it was sent."""

    script: list[Conn]
    sock: socket.socket = field(default_factory=socket.socket)
    accepted: int = 0
    requests: list[bytes] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed: the test ended
            handler = self.script[min(self.accepted, len(self.script) - 1)]
            self.accepted += 1
            threading.Thread(target=self._one, args=(handler, conn), daemon=True).start()

    def _one(self, handler: Conn, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):  # the client went away
            handler(conn)

    def answers(self, *answers: bytes, close: bool = False) -> Conn:
        """A connection that answers its requests with ``answers`` in turn (then closes, or,
        without ``close``, repeats the last)."""
        def conn(sock: socket.socket) -> None:
            i = 0
            while (req := http_message(sock)) is not None:
                self.requests.append(req)
                sock.sendall(answers[min(i, len(answers) - 1)])
                i += 1
                if close and i == len(answers):
                    return
        return conn


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server([])
    s.sock.bind(("127.0.0.1", 0))
    s.sock.listen(16)
    t = threading.Thread(target=s.serve, daemon=True)
    t.start()
    yield s
    stop(s)
    t.join(10)


def stop(s: Server) -> None:
    """Closes the listening socket (shut down first: a close alone leaves accept waiting)."""
    with contextlib.suppress(OSError):  # closed already
        s.sock.shutdown(socket.SHUT_RDWR)
    s.sock.close()


def wire(s: Server, **kw: object) -> Wire:
    args: dict = {"timeout_s": 5.0, "retries": 0, "ca": None, "token": "t0ken",
                  "token_file": None, **kw}
    return Wire(s.url, **args)


def test_a_connection_is_kept_and_every_request_says_what_the_client_says(
        server: Server) -> None:
    server.script = [server.answers(http(200, results(2)))]
    w = wire(server)
    for _ in range(3):
        got = w.multi_get_states("j", "o p", ["s", "t"], ["k"], min_batch=4)
        assert [a["windows"][-1]["value"] for a in got] == [3, 3]
    assert server.accepted == 1
    head, _, body = server.requests[0].partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /v1/state/j/o%20p:batchGet?min_batch=4 HTTP/1.1"
    assert {"host: " + server.url.removeprefix("http://"), "content-type: application/json",
            "authorization: bearer t0ken"} <= {line.lower() for line in lines[1:]}
    assert json.loads(body) == {"keys": ["k"], "states": ["s", "t"]}
    w.close()


def test_a_kept_connection_the_server_closed_is_replaced_and_the_read_sent_again(
        server: Server) -> None:
    # each connection answers one request, then the server closes it: as a router's idle
    # timeout would, unannounced (no Connection: close)
    server.script = [server.answers(http(200, results(1)), close=True)]
    w = wire(server)
    for _ in range(3):
        assert len(w.multi_get_states("j", "o", ["s"], ["k"])) == 1
    assert server.accepted == 3


def test_connection_close_is_not_kept(server: Server) -> None:
    server.script = [server.answers(http(200, results(1), "Connection: close"), close=True)]
    c = Connections(server.url, None, 5.0, 4, {})
    for _ in range(2):
        assert c.request("POST", "/x", b"{}").status == 200
        assert c._idle == []
    assert server.accepted == 2


def test_chunked_and_large_answers_are_read_whole_and_a_503_asked_again_after_retry_after(
        server: Server) -> None:
    body = results(1)
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               + b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 7]), body[i:i + 7])
                          for i in range(0, len(body), 7)) + b"0\r\n\r\n")
    busy = http(503, json.dumps({"error": "Unavailable", "message": "restoring",
                                 "retry_after_s": 0}).encode(), "Retry-After: 0")
    big = results(2_000)  # several reads of the connection's buffer
    assert len(big) > 4 * RECV_BYTES
    server.script = [server.answers(busy, chunked, http(200, big))]
    c = Connections(server.url, None, 5.0, 4, {})
    assert c.request("POST", "/x", b"{}").retry_after == "0"
    assert c.request("POST", "/x", b"{}").body == body
    assert c.request("POST", "/x", b"{}").body == big
    server.requests.clear()
    server.script = [server.answers(busy, busy, chunked)]
    w = wire(server, retries=2, backoff_s=0.001)
    assert len(w.multi_get_states("j", "o", ["s"], ["k"])) == 1
    assert len(server.requests) == 3


def test_an_answer_cut_short_is_unavailable_by_name(server: Server) -> None:
    server.script = [sends(http(200, results(1))[:-5])]
    with pytest.raises(Unavailable, match="cannot be reached: Closed") as caught:
        wire(server).multi_get_states("j", "o", ["s"], ["k"])
    assert caught.value.reason == "router-unreachable"
    with pytest.raises(Closed):
        Connections(server.url, None, 5.0, 4, {}).request("POST", "/x", b"{}")


def test_what_is_not_http_or_not_an_answer_is_unavailable_by_name(server: Server) -> None:
    server.script = [sends(b"SSH-2.0-OpenSSH_9.2\r\n")]
    with pytest.raises(Unavailable, match=r"answered what is not HTTP/1\.1"):
        wire(server).multi_get_states("j", "o", ["s"], ["k"])
    server.script = [server.answers(http(200, b'{"results": [{"found": "maybe"}]}'))]
    with pytest.raises(Unavailable, match="what is not a batch answer") as caught:
        wire(server).multi_get_states("j", "o", ["s"], ["k"])
    assert caught.value.reason == "router-garbled"
    server.script = [server.answers(http(200, results(1)))]
    with pytest.raises(Unavailable, match=r"answered 1 of the 2 \(keys × states\) asked"):
        wire(server).multi_get_states("j", "o", ["s", "t"], ["k"])


def test_a_server_that_never_answers_is_a_timeout_and_a_refusal_is_unreachable(
        server: Server) -> None:
    done = threading.Event()
    server.script = [hangs(done)]
    with pytest.raises(Unavailable, match=r"did not answer within 0.2 s") as caught:
        wire(server, timeout_s=0.2).multi_get_states("j", "o", ["s"], ["k"])
    assert caught.value.reason == "router-timeout"
    done.set()
    port = server.sock.getsockname()[1]
    stop(server)
    with pytest.raises(Unavailable, match="cannot be reached") as refused:
        Wire(f"http://127.0.0.1:{port}", 5.0, 0, None, None, None).multi_get_states(
            "j", "o", ["s"], ["k"])
    assert refused.value.reason == "router-unreachable"


HEADS = st.sampled_from([b"", b"HTTP/1.1 200 OK\r\n", b"HTTP/1.1 503 X\r\nRetry-After: x\r\n",
                         b"HTTP/1.1 404 X\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n",
                         b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"])


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(head=HEADS, rest=st.binary(max_size=300), well_formed=st.booleans())
def test_any_bytes_answered_are_an_answer_or_a_qstate_error(server: Server, head: bytes,
                                                            rest: bytes,
                                                            well_formed: bool) -> None:
    """Whatever a server (or something else on its port) sends before it closes, a read
    returns one answer per key and state or raises qstate's error: never another exception,
    never a hang."""
    sent = http(200, rest) if well_formed else head + rest
    server.script = [sends(sent)]
    w = wire(server, timeout_s=2.0)
    try:
        got = w.multi_get_states("j", "o", ["s"], ["k"])
    except QStateError:
        return
    finally:
        w.close()
    assert len(got) == 1
