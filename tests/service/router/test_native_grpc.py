"""The engine's gRPC port answers what grpc.aio answered, byte for byte (docs/architecture.md
§5, native gRPC reads): two routers over one shop, one whose gRPC port the read engine holds
(``Get`` and ``MultiGet`` in Rust, every other call passed to the Python server behind it)
and one with ``QSTATE_NATIVE_FRONT=false`` (grpc.aio holds the port), with the same tokens
file. A Hypothesis property sends each random read (valid and invalid names, keys of every
kind, ranges and limits, ``min_batch`` reached and not, a savepoint that does not exist,
tokens of every kind, bytes that are no request at all) to both as raw bytes and compares the
code, the message, the trailers a client acts on (``qstate-error``, ``qstate-detail``,
``retry-after-ms``) and the answer's bytes. The calls passed behind (``Top``, ``Watch``,
``ListJobs``, health) answer on the native port as on the other, a message over the largest
body is RESOURCE_EXHAUSTED on both, and the native port counts what it answered in the
router's series."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from qstate.core.transport.tokens import add_token
from qstate.embedded.procs import RouterProcess
from qstate.proto import qstate_pb2 as pb
from qstate.proto import qstate_pb2_grpc as pb_grpc
from tests.helpers import Scrape, wait_until
from tests.shop import KEYS, own_shop

SCOPES = {"admin": ["*"], "shop": ["shop"], "views": ["shop/views_1m"], "other": ["other"]}
MAX_BODY = 64 << 10
TRAILERS = ("qstate-error", "qstate-detail", "retry-after-ms")
EXAMPLES = 200  # under `make test`
LONG = 2000  # under `make soak` (QSTATE_LONG=1)


@dataclass
class Pair:
    native: RouterProcess
    python: RouterProcess
    tokens: dict[str, str]
    channels: dict[int, grpc.Channel]

    def channel(self, port: int) -> grpc.Channel:
        if port not in self.channels:
            self.channels[port] = grpc.insecure_channel(
                f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 4 * MAX_BODY)])
        return self.channels[port]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    tmp = tmp_path_factory.mktemp("native-grpc")
    with own_shop(tmp) as shop:
        file = tmp / "tokens.json"
        tokens = {who: add_token(file, who, scopes) for who, scopes in SCOPES.items()}
        env = {"QSTATE_TOKENS_FILE": str(file), "QSTATE_MIN_BATCH_WAIT_S": "0.05",
               "QSTATE_MAX_BODY_BYTES": str(MAX_BODY)}
        logs = tmp / "logs"
        with shop.router_with(logs, "grpc-native", QSTATE_NATIVE_FRONT="true", **env) as n, \
                shop.router_with(logs, "grpc-python", QSTATE_NATIVE_FRONT="false", **env) as p:
            pr = Pair(n, p, tokens, {})
            try:
                yield pr
            finally:
                for ch in pr.channels.values():
                    ch.close()


Outcome = tuple[str, str, tuple[tuple[str, str], ...], bytes | None]


def call(p: Pair, port: int, method: str, request: bytes,
         metadata: list[tuple[str, str]]) -> Outcome:
    fn = p.channel(port).unary_unary(f"/qstate.v1.QueryableState/{method}")
    try:
        answer = fn(request, metadata=metadata, timeout=30)
        return ("OK", "", (), answer)
    except grpc.RpcError as e:
        trailers = tuple(sorted((k, v) for k, v in (e.trailing_metadata() or ())
                                if k in TRAILERS))
        return (e.code().name, e.details() or "", trailers, None)


def both(p: Pair, method: str, request: bytes, metadata: list[tuple[str, str]]
         ) -> tuple[Outcome, Outcome]:
    return (call(p, p.native.grpc_port, method, request, metadata),
            call(p, p.python.grpc_port, method, request, metadata))


# ---- what a read is made of: usual (what a client reading the shop sends) or not ----------

def either(draw: st.DrawFn, usual: st.SearchStrategy[Any], other: st.SearchStrategy[Any]
           ) -> Any:
    return draw(usual if draw(st.integers(0, 9)) < 7 else other)


NAMES = st.sampled_from(["other", "", "bad name", "shop/x", "ü", "x" * 200])


@st.composite
def key(draw: st.DrawFn) -> str:
    return either(draw, st.sampled_from(KEYS[:20] + KEYS[-3:]),
                  st.one_of(st.just(""), st.just("missing-key"), st.text(max_size=30),
                            st.just("k" * 1025)))


@st.composite
def reads(draw: st.DrawFn) -> tuple[str, bytes]:
    if draw(st.integers(0, 19)) == 0:
        return draw(st.sampled_from(["Get", "MultiGet"])), draw(st.binary(max_size=40))
    fields: dict[str, Any] = {
        "job": either(draw, st.just("shop"), NAMES),
        "operator": either(draw, st.just("views_1m"), NAMES),
    }
    if draw(st.booleans()):
        fields["from_ms"] = draw(st.sampled_from([0, 60_000, -5, 2**62, 120_000]))
    if draw(st.booleans()):
        fields["to_ms"] = draw(st.sampled_from([0, 60_000, 180_000, 2**62, -1]))
    if draw(st.integers(0, 3)) == 0:
        fields["limit"] = draw(st.sampled_from([0, 1, 2, 5000]))
    if draw(st.integers(0, 4)) == 0:
        fields["min_batch"] = draw(st.sampled_from([0, 2, 3, 99, -1]))
    if draw(st.integers(0, 19)) == 0:
        fields["savepoint"] = draw(st.sampled_from(["nope", "bad name"]))
    state = either(draw, st.sampled_from(["views", "avg_ms"]), NAMES)
    if draw(st.booleans()):
        return "Get", pb.GetRequest(state=state, key=draw(key()), **fields).SerializeToString()
    keys = draw(st.lists(key(), max_size=12))
    if draw(st.integers(0, 3)) == 0:
        states = either(draw, st.lists(st.sampled_from(["views", "avg_ms"]), min_size=1,
                                       max_size=3), st.lists(NAMES, max_size=2))
        extra = {"state": state} if draw(st.integers(0, 4)) == 0 else {}
        return "MultiGet", pb.MultiGetRequest(keys=keys, states=states, **extra,
                                              **fields).SerializeToString()
    return "MultiGet", pb.MultiGetRequest(keys=keys, state=state, **fields).SerializeToString()


@st.composite
def credentials(draw: st.DrawFn) -> str | None:
    return either(draw, st.just("admin"),
                  st.sampled_from([None, "shop", "views", "other", "unknown", "scheme",
                                   "basic"]))


def metadata(p: Pair, who: str | None) -> list[tuple[str, str]]:
    if who is None:
        return []
    v = {"unknown": "Bearer qs_forged-token-nobody-issued", "scheme": "Bearer",
         "basic": f"Basic {p.tokens['admin']}"}.get(who) or f"Bearer {p.tokens[who]}"
    return [("authorization", v)]


@settings(max_examples=LONG if os.environ.get("QSTATE_LONG") else EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(read=reads(), who=credentials())
def test_the_native_port_answers_reads_as_grpc_aio_did(pair: Pair, read: tuple[str, bytes],
                                                       who: str | None) -> None:
    method, request = read
    native, python = both(pair, method, request, metadata(pair, who))
    event(f"{method} {native[0]}")
    assert native == python, (method, request)


def test_calls_the_engine_does_not_answer_pass_to_the_python_server(pair: Pair) -> None:
    auth = metadata(pair, "admin")
    for port in (pair.native.grpc_port, pair.python.grpc_port):
        stub = pb_grpc.QueryableStateStub(pair.channel(port))
        top = stub.Top(pb.TopRequest(job="shop", operator="views_1m", state="views", n=3),
                       metadata=auth, timeout=30)
        assert len(top.entries) == 3
        jobs = stub.ListJobs(pb.ListJobsRequest(), metadata=auth, timeout=30)
        assert "shop" in [j.name for j in jobs.jobs]
        watch = stub.Watch(pb.WatchRequest(job="shop", operator="views_1m", state="views",
                                           keys=[KEYS[0]]), metadata=auth, timeout=30)
        first = next(iter(watch))
        assert first.snapshot and [c.key for c in first.changes] == [KEYS[0]]
        watch.cancel()
        health = health_pb2_grpc.HealthStub(pair.channel(port)).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=30)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as e:
            stub.Top(pb.TopRequest(job="shop", operator="views_1m", state="views", n=3),
                     timeout=30)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    big = pb.MultiGetRequest(job="shop", operator="views_1m", state="views",
                             keys=["x" * 1000] * (MAX_BODY // 1000 + 2)).SerializeToString()
    native, python = both(pair, "MultiGet", big, auth)
    assert native[0] == python[0] == "RESOURCE_EXHAUSTED"


def test_the_native_port_counts_what_it_answered(pair: Pair) -> None:
    auth = {"authorization": f"Bearer {pair.tokens['admin']}"}

    def scrape() -> Scrape:
        text = httpx.get(f"{pair.native.url}/metrics", headers=auth, timeout=10).text
        return Scrape([x for f in text_string_to_metric_families(text) for x in f.samples])

    def count(code: str) -> float:
        return scrape().value("qstate_router_grpc_requests_total", method="Get", code=code)

    def by_engine() -> float:  # answered by the engine, not passed to grpc.aio
        return scrape().value("qstate_router_front_requests_total", route="grpc:Get",
                              answered_by="engine")

    ok, nf, engine = count("OK"), count("NOT_FOUND"), by_engine()
    found = pb.GetRequest(job="shop", operator="views_1m", state="views", key=KEYS[0])
    absent = pb.GetRequest(job="shop", operator="views_1m", state="views", key="missing-key")
    for _ in range(3):
        assert call(pair, pair.native.grpc_port, "Get", found.SerializeToString(),
                    metadata(pair, "admin"))[0] == "OK"
    assert call(pair, pair.native.grpc_port, "Get", absent.SerializeToString(),
                metadata(pair, "admin"))[0] == "NOT_FOUND"
    wait_until(lambda: count("OK") >= ok + 3 and count("NOT_FOUND") >= nf + 1, 10,
               "the native port's calls counted")
    assert by_engine() == engine + 4
