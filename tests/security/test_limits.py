"""Limits with clear answers, on real processes over real sockets: a body over
``max_body_bytes`` gets 413 (declared or chunked), requests beyond
``max_concurrent_requests`` get 429 with Retry-After (gRPC: RESOURCE_EXHAUSTED), keys beyond
``max_shard_queue`` waiting for one shard get 429 at once, and a shard's cap on windows
is never silent (the answer says where the next page starts).

To hold requests in flight on purpose the lab's one shard server is frozen (SIGSTOP): the
routers, which read it over gRPC only, wait for it (up to their long shard timeout) while a
test fills their slots or queue; thawed, every waiting request must be answered right.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import grpc
import httpx
import pytest

from qstate.control.coordinator import Coordinator
from qstate.core.errors import Overloaded, from_grpc
from qstate.core.records.operator import save_spec
from qstate.core.records.storage import Storage
from qstate.core.transport.shard_client import ShardClients
from qstate.embedded.procs import RouterProcess, ShardProcess
from qstate.proto import qstate_pb2 as qpb
from qstate.proto import qstate_pb2_grpc as qpb_grpc
from qstate.router.engine import ENGINE_THREADS
from tests.helpers import metric, wait_until
from tests.shop import BATCHES, KEYS, SPEC, commit_batch, views, window

pytestmark = pytest.mark.security

STATE = f"/v1/state/{SPEC.job}/{SPEC.operator}/views"
REFUSED = "qstate_router_refused_total"
QUEUE = 5  # keys that may wait for the lab's shard at the "queue" router
SLOTS = 2  # requests the "tight" router serves at once
BODY = 1024  # bytes of body the "tight" router takes


@dataclass
class Lab:
    storage: Storage
    shard: ShardProcess
    routers: dict[str, RouterProcess]

    @contextmanager
    def frozen(self) -> Iterator[None]:
        """The shard stopped (SIGSTOP) for the block: lookups wait for it, nothing fails."""
        os.kill(self.shard.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(self.shard.pid, signal.SIGCONT)


def _env(**settings: str) -> dict[str, str]:
    return {**os.environ, **{f"QSTATE_{k.upper()}": v for k, v in settings.items()}}


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """One shard server that returns at most one window per key and lookup (its own
    max_windows), the shop's operator committed for BATCHES batches, and two routers that
    read it over gRPC only: "queue" (QUEUE keys may wait) and "tight" (SLOTS requests at
    once, BODY bytes of body, at most 2 windows per answer)."""
    tmp = tmp_path_factory.mktemp("limits")
    storage = Storage(str(tmp / "storage"))
    save_spec(storage, SPEC)
    shard = ShardProcess.make("lim0", tmp / "data", storage.uri, tmp / "logs",
                              env=_env(max_windows="1")).start_and_wait()
    routers: dict[str, RouterProcess] = {}
    try:
        coord = Coordinator(storage, SPEC.job, [shard.address])
        coord.register(SPEC)
        clients = ShardClients()
        try:
            wait_until(lambda: len([p for p in clients.describe(shard.address, 5).partitions
                                    if not p.restoring]) == SPEC.partitions, 30,
                       "the shard serving every partition")
        finally:
            clients.close()
        for batch in range(BATCHES):
            commit_batch(storage, coord, batch)
        coord.stop()
        slow = {"shard_timeout_s": "60"}  # a frozen shard is waited for, not a 503
        routers["queue"] = RouterProcess.make(
            storage.uri, tmp / "logs", "queue", _env(max_shard_queue=str(QUEUE), **slow),
            "--no-local-reads").start_and_wait()
        routers["tight"] = RouterProcess.make(
            storage.uri, tmp / "logs", "tight",
            _env(max_concurrent_requests=str(SLOTS), max_body_bytes=str(BODY),
                 max_windows="2", **slow), "--no-local-reads").start_and_wait()
        yield Lab(storage, shard, routers)
    finally:
        for r in routers.values():
            r.stop()
        shard.stop()


def _log(router: RouterProcess) -> str:
    return router.log_path.read_text(errors="replace")


WAITING = "qstate_router_shard_keys_waiting"


async def _waiting_keys(url: str) -> float:
    """Keys the router has asked of its (frozen) shard and not been answered, as it says."""
    from prometheus_client.parser import text_string_to_metric_families

    async with httpx.AsyncClient(timeout=10) as c:
        text = (await c.get(f"{url}/metrics")).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == WAITING)


async def _park_until_refused(url: str, send: Callable[[int], Awaitable[object]],
                              refused: Callable[[object], bool], most: int
                              ) -> tuple[object, list[asyncio.Task[object]]]:
    """Start one-key requests one at a time (``send(i)``), each left in flight once the router
    at ``url`` says it waits for the shard (its key among those asked and not answered), until
    one is refused at once instead; returns it and the waiting ones. Fails if ``most``
    requests never got a refusal, or one neither waits nor is answered within 30 s."""
    waiting: list[asyncio.Task[object]] = []
    for i in range(most):
        task = asyncio.ensure_future(send(i))
        deadline = time.monotonic() + 30
        while not task.done() and await _waiting_keys(url) < len(waiting) + 1:
            assert time.monotonic() < deadline, f"request {i} neither waits nor was answered"
            await asyncio.wait({task}, timeout=0.02)
        if not task.done():
            waiting.append(task)
            continue
        answer = task.result()
        assert refused(answer), f"request {i} was answered, not refused: {answer}"
        return answer, waiting
    raise AssertionError(f"{most} requests in flight and none refused")


# ---------------------------------------------------------------------------- body size


def test_a_declared_body_over_the_limit_is_refused_413(lab: Lab) -> None:
    url = lab.routers["tight"].url
    keys = [f"page-{i}" for i in range(200)]  # ~2.4 KB of JSON
    before = metric(url, REFUSED, reason="too-large")
    r = httpx.post(f"{url}{STATE}:batchGet", json={"keys": keys}, timeout=10)
    assert r.status_code == 413
    body = r.json()
    assert body["error"] == "TooLarge" and body["limit_bytes"] == BODY
    assert "QSTATE_MAX_BODY_BYTES" in body["message"]
    assert metric(url, REFUSED, reason="too-large") == before + 1
    # under the limit the same route answers
    ok = httpx.post(f"{url}{STATE}:batchGet", json={"keys": keys[:5]}, timeout=10)
    assert ok.status_code == 200
    assert [a["windows"][-1]["value"] for a in ok.json()["results"]] == [
        views(k, BATCHES - 1) for k in keys[:5]]


def test_a_chunked_body_over_the_limit_is_refused_413(lab: Lab) -> None:
    url = lab.routers["tight"].url

    def chunks() -> Iterator[bytes]:  # no Content-Length: the router must count
        yield b'{"keys": ['
        for i in range(300):
            yield f'"page-{i}", '.encode()
        yield b'"page-0"]}'

    r = httpx.post(f"{url}{STATE}:batchGet", content=chunks(),
                   headers={"content-type": "application/json"}, timeout=10)
    assert r.status_code == 413
    assert r.json()["error"] == "TooLarge"

    def small() -> Iterator[bytes]:
        yield b'{"keys": ["page-1",'
        yield b' "page-2"]}'

    ok = httpx.post(f"{url}{STATE}:batchGet", content=small(),
                    headers={"content-type": "application/json"}, timeout=10)
    assert ok.status_code == 200, ok.text
    assert [a["key"] for a in ok.json()["results"]] == ["page-1", "page-2"]


# ---------------------------------------------------------------------- requests at once


def test_requests_beyond_the_limit_get_429_at_once_and_the_waiting_ones_are_answered(
        lab: Lab) -> None:
    url = lab.routers["tight"].url
    before = metric(url, REFUSED, reason="overloaded")

    async def scenario() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            with lab.frozen():
                refusal, waiting = await _park_until_refused(
                    url, lambda i: c.get(f"{STATE}/{KEYS[i]}"),
                    lambda r: isinstance(r, httpx.Response) and r.status_code == 429,
                    SLOTS + 3)
                assert len(waiting) == SLOTS
                assert isinstance(refusal, httpx.Response)
                assert refusal.headers["retry-after"] == "1"
                assert refusal.json()["error"] == "Overloaded"
                assert "QSTATE_MAX_CONCURRENT_REQUESTS" in refusal.json()["message"]
                # probes and /metrics are never limited: an overloaded router says so
                for path in ("/healthz", "/readyz", "/metrics"):
                    assert (await c.get(path, timeout=5)).status_code == 200, path
            answers = await asyncio.gather(*waiting)
        for i, r in enumerate(answers):
            assert isinstance(r, httpx.Response) and r.status_code == 200, r
            assert r.json()["windows"][-1]["value"] == views(KEYS[i], BATCHES - 1)

    asyncio.run(scenario())
    assert metric(url, REFUSED, reason="overloaded") >= before + 1


def test_grpc_calls_beyond_the_limit_get_resource_exhausted_at_once(lab: Lab) -> None:
    address = lab.routers["tight"].grpc_address

    async def scenario() -> None:
        async with grpc.aio.insecure_channel(address) as ch:
            stub = qpb_grpc.QueryableStateStub(ch)

            async def get(i: int) -> object:
                try:
                    return await stub.Get(qpb.GetRequest(
                        job=SPEC.job, operator=SPEC.operator, state="views", key=KEYS[i]),
                        timeout=60)
                except grpc.aio.AioRpcError as exc:
                    return exc

            with lab.frozen():
                refusal, waiting = await _park_until_refused(
                    lab.routers["tight"].url, get,
                    lambda r: isinstance(r, grpc.aio.AioRpcError), SLOTS + 3)
            assert isinstance(refusal, grpc.aio.AioRpcError)
            assert refusal.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert len(waiting) == SLOTS
            answers = await asyncio.gather(*waiting)
        for i, a in enumerate(answers):
            assert isinstance(a, qpb.StateValue), a
            assert a.windows[-1].int_value == views(KEYS[i], BATCHES - 1)

    asyncio.run(scenario())


# ---------------------------------------------------------------- the per-shard queue


def test_a_batch_beyond_the_shard_queue_is_refused_whole_and_the_router_goes_on(
        lab: Lab) -> None:
    router = lab.routers["queue"]
    keys = KEYS[:2 * QUEUE]  # all owned by the lab's one shard
    r = httpx.post(f"{router.url}{STATE}:batchGet", json={"keys": keys}, timeout=30)
    assert r.status_code == 429
    assert r.headers["retry-after"] == "1"
    assert r.json()["error"] == "Overloaded"
    assert "QSTATE_MAX_SHARD_QUEUE" in r.json()["message"]
    # the part that was queued was dropped cleanly: the next batches are answered right
    for _ in range(3):
        ok = httpx.post(f"{router.url}{STATE}:batchGet", json={"keys": keys[:QUEUE]},
                        timeout=30)
        assert ok.status_code == 200
        assert [a["windows"][-1]["value"] for a in ok.json()["results"]] == [
            views(k, BATCHES - 1) for k in keys[:QUEUE]]
    with grpc.insecure_channel(router.grpc_address) as ch, \
            pytest.raises(grpc.RpcError) as info:
        qpb_grpc.QueryableStateStub(ch).MultiGet(qpb.MultiGetRequest(
            job=SPEC.job, operator=SPEC.operator, state="views", keys=keys), timeout=30)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
    trailers = dict(info.value.trailing_metadata())  # type: ignore[attr-defined]
    assert trailers["retry-after-ms"] == "1000"
    assert isinstance(from_grpc(info.value), Overloaded)
    assert "never retrieved" not in _log(router)


def test_single_gets_beyond_the_shard_queue_get_429_and_the_queued_ones_are_answered(
        lab: Lab) -> None:
    """The fast path's answer: two calls in flight to the frozen shard from each front thread
    (a connection a GET spreads them over every thread, each its own lane: remote.rs), QUEUE
    keys waiting behind them, the next GET refused at once; thawed, every waiting GET gets
    its value."""
    router = lab.routers["queue"]

    async def scenario() -> None:
        async with httpx.AsyncClient(base_url=router.url, timeout=60) as c:
            with lab.frozen():
                refusal, waiting = await _park_until_refused(
                    router.url, lambda i: c.get(f"{STATE}/{KEYS[i]}"),
                    lambda r: isinstance(r, httpx.Response) and r.status_code == 429,
                    QUEUE + 2 * ENGINE_THREADS + 4)
            assert isinstance(refusal, httpx.Response)
            assert refusal.json()["error"] == "Overloaded"
            assert refusal.headers["retry-after"] == "1"
            # two calls in flight a front thread (the router has this process's cores),
            # QUEUE keys queued: the bound is the shard's, over every thread
            assert len(waiting) == QUEUE + 2 * ENGINE_THREADS
            answers = await asyncio.gather(*waiting)
        for i, r in enumerate(answers):
            assert isinstance(r, httpx.Response) and r.status_code == 200, r
            assert r.json()["windows"][-1]["value"] == views(KEYS[i], BATCHES - 1)

    asyncio.run(scenario())
    assert "never retrieved" not in _log(router)


# ------------------------------------------------------------------ windows per answer


def test_a_shard_cap_on_windows_is_never_silent(lab: Lab) -> None:
    """The lab's shard returns one window per lookup (its max_windows): the router's answer
    says where the next page starts, and paging on gives every window exactly once."""
    url = lab.routers["queue"].url
    key = KEYS[3]
    got: list[dict[str, int]] = []
    frm: str | None = "0"
    pages = 0
    while frm is not None:
        r = httpx.get(f"{url}{STATE}/{key}", params={"from": frm, "to": "now"}, timeout=10)
        assert r.status_code == 200, r.text
        a = r.json()
        assert len(a["windows"]) == 1
        got += a["windows"]
        frm = None if a["next_from"] is None else str(a["next_from"])
        pages += 1
        assert pages <= BATCHES
    assert [(w["start"], w["value"]) for w in got] == [
        (window(b)[0], views(key, b)) for b in range(BATCHES)]


def test_a_limit_beyond_the_routers_max_windows_is_refused(lab: Lab) -> None:
    url = lab.routers["tight"].url
    r = httpx.get(f"{url}{STATE}/{KEYS[0]}", params={"from": "0", "limit": "3"}, timeout=10)
    assert r.status_code == 400
    assert r.json()["error"] == "InvalidRequest"
    assert "1 to 2" in r.json()["message"] and "QSTATE_MAX_WINDOWS" in r.json()["message"]
    doc = httpx.get(f"{url}/openapi.json", timeout=10).json()
    limit = next(p for p in doc["paths"]["/v1/state/{job}/{operator}/{state}/{key}"]["get"]
                 ["parameters"] if p["name"] == "limit")
    assert (limit["schema"]["minimum"], limit["schema"]["maximum"]) == (1, 2)
