"""A panic in the read engine stays inside (docs/architecture.md §5): planted faults
(``QSTATE_FAULT``, ``qstate.core.process.faults``) make a router's engine panic in a read of
a partition at a named batch, or while its front hands out its Nth connection. A read so
failing is answered 500 with a JSON body naming ``EngineFailed`` (HTTP) or ``INTERNAL`` (gRPC),
counted in ``qstate_router_engine_panics_total``; the router goes on answering, and its front
goes on accepting. Real shard and router processes over the shop (tests/shop.py: batches
0-2, every partition at batch 2)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from qstate.embedded.procs import RouterProcess
from qstate.proto import qstate_pb2 as qpb
from qstate.proto import qstate_pb2_grpc as qpb_grpc
from tests.helpers import http_message, metric, wait_until
from tests.shop import KEYS, Shop, own_shop

PANICS = "qstate_router_engine_panics_total"
REQUESTS = "qstate_router_http_requests_total"
READ = "/v1/state/shop/views_1m/views/"


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shop]:
    with own_shop(tmp_path_factory.mktemp("faults")) as s:
        yield s


def _read_locally(r: RouterProcess) -> bool:
    """Reads of the shop come from this host's files (the fault is in that read)."""
    httpx.get(f"{r.url}{READ}{KEYS[0]}")
    return metric(r.url, "qstate_router_shard_reads_total", path="local") > 0 or \
        metric(r.url, PANICS, at="front") > 0


def test_a_panic_in_a_read_is_a_500_and_the_router_goes_on(shop: Shop, tmp_path: Path) -> None:
    with shop.router_with(tmp_path, "panics", QSTATE_FAULT="router.read-panic@2:views_1m") as r:
        wait_until(lambda: _read_locally(r), 30, "the router reading the shop in-process")
        before = metric(r.url, PANICS, at="front")
        served = {"route": "/v1/state/{job}/{operator}/{state}/{key}", "method": "GET",
                  "status": "500"}
        failed = metric(r.url, REQUESTS, **served)
        for key in KEYS[:5]:  # each read panics: each is answered, the router lives on
            got = httpx.get(f"{r.url}{READ}{key}", timeout=10)
            assert got.status_code == 500, got.text
            assert got.headers["content-type"] == "application/json"
            body = got.json()
            assert body["error"] == "EngineFailed", body
            assert "router.read-panic@2" in body["message"], body
        assert metric(r.url, PANICS, at="front") == before + 5
        assert metric(r.url, REQUESTS, **served) == failed + 5  # counted as every read is
        assert httpx.get(f"{r.url}/healthz", timeout=10).status_code == 200
        # gRPC's read is the engine's too, on its own gRPC port: the panic is INTERNAL there
        calls = metric(r.url, PANICS, at="grpc")
        with grpc.insecure_channel(r.grpc_address) as ch, pytest.raises(grpc.RpcError) as e:
            qpb_grpc.QueryableStateStub(ch).Get(qpb.GetRequest(
                job="shop", operator="views_1m", state="views", key=KEYS[0]), timeout=10)
        assert e.value.code() == grpc.StatusCode.INTERNAL, e.value
        assert "router.read-panic@2" in (e.value.details() or "")
        assert dict(e.value.trailing_metadata() or ())["qstate-error"] == "EngineFailed"
        assert metric(r.url, PANICS, at="grpc") == calls + 1
        assert r.alive()


def _answered(port: int) -> bool:
    """One request on a connection of its own: answered, or the connection closed on it."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        try:
            s.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            got = http_message(s)
        except (ConnectionResetError, BrokenPipeError):
            return False
    return got is not None and got.startswith(b"HTTP/1.1 200")


def test_a_panic_while_accepting_loses_one_connection_not_the_front(shop: Shop,
                                                                  tmp_path: Path) -> None:
    with shop.router_with(tmp_path, "accepting", QSTATE_FAULT="router.accept-panic@6") as r:
        answered = [_answered(r.http_port) for _ in range(12)]
        # the sixth connection since the front opened (the start-up's wait for the port is
        # one of them): lost; every other one answered, before and after it
        assert answered.count(False) == 1, answered
        assert all(answered[answered.index(False) + 1:]), answered
        assert metric(r.url, PANICS, at="accept") == 1
