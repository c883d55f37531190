"""``qstate router --workers 2`` (issue 26): two router processes serve the same HTTP and
gRPC ports over the session's shop, both take connections, /metrics sums them, and the
router stops as one however it is stopped (nothing left, the ports free)."""

from __future__ import annotations

import os
import re
import signal
import socket
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import grpc
import httpx
import pytest

from qstate.embedded.procs import RouterProcess
from qstate.proto import qstate_pb2 as qpb
from qstate.proto import qstate_pb2_grpc as qpb_grpc
from tests.helpers import metric, wait_until
from tests.shop import BATCHES, KEYS, Shop, views


def _workers(log: Path) -> list[int]:
    m = wait_until(lambda: log.read_text().count("qstate router ready") == 2 and re.search(
        r"2 workers, pids (\d+) (\d+)", log.read_text()), 30, "both workers ready")
    assert isinstance(m, re.Match)
    return [int(m.group(1)), int(m.group(2))]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"  # a zombie is gone
    except FileNotFoundError:
        return False


@pytest.fixture
def two(shop: Shop, tmp_path: Path) -> Iterator[tuple[RouterProcess, list[int]]]:
    r = RouterProcess.make(shop.storage.uri, tmp_path / "logs", "workers", None,
                           "--workers", "2").start_and_wait()
    try:
        yield r, _workers(r.log_path)
    finally:
        r.stop()


def test_two_workers_share_both_ports_and_their_metrics(
        two: tuple[RouterProcess, list[int]]) -> None:
    r, pids = two
    seen: set[int] = set()
    asked = 0
    for _ in range(200):  # a new connection each: the kernel hands them to either worker
        seen.add(httpx.get(f"{r.url}/healthz", timeout=10).json()["pid"])
        asked += 1
        if seen == set(pids):
            break
    assert seen == set(pids)
    key = KEYS[7]
    got = httpx.get(f"{r.url}/v1/state/shop/views_1m/views/{key}", timeout=10)
    assert got.status_code == 200 and got.json()["windows"][-1]["value"] == \
        views(key, BATCHES - 1)
    for _ in range(20):  # separate channels: connections spread over both gRPC servers
        with grpc.insecure_channel(r.grpc_address) as ch:
            v = qpb_grpc.QueryableStateStub(ch).Get(qpb.GetRequest(
                job="shop", operator="views_1m", state="views", key=key), timeout=10)
            assert v.windows[-1].int_value == views(key, BATCHES - 1)
    # whichever worker answers /metrics, it counts both workers' requests
    counts = {metric(r.url, "qstate_router_http_requests_total", route="/healthz",
                     method="GET", status="200") for _ in range(10)}
    assert counts == {asked}


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM", "SIGKILL-parent", "SIGKILL-worker"])
def test_the_router_stops_as_one(shop: Shop, tmp_path: Path, how: str) -> None:
    r = RouterProcess.make(shop.storage.uri, tmp_path / "logs", "workers", None,
                           "--workers", "2").start_and_wait()
    pids = _workers(r.log_path)
    assert r.proc is not None
    if how == "SIGKILL-worker":
        os.kill(pids[0], signal.SIGKILL)  # one dies: the other is stopped, the router exits 1
        assert r.proc.wait(20) == 1
    elif how == "SIGKILL-parent":
        r.proc.kill()  # the workers die with it (PR_SET_PDEATHSIG)
        r.proc.wait(10)
    else:
        r.proc.send_signal(getattr(signal, how))
        assert r.proc.wait(20) == 0
    wait_until(lambda: not any(_alive(p) for p in pids), 10, "no worker left")
    for port in (r.http_port, r.grpc_port):  # both ports free again (no listener left)
        wait_until(partial(_free, port), 10, f"port {port} free")


def _free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
        except OSError:  # a process's last thread still exiting holds it a moment
            return False
    return True
