"""The cluster map and the clients that follow it (docs/architecture.md §5, cluster map;
docs/querying.md): two shard servers on two nodes (QSTATE_NODE, as a DaemonSet's pods name
their node), a router on each node reading its node's shard in-process, real processes over
sockets. The map names each partition's owner, its readiness and the router on its node; a
direct client asks each key (each batch split by owner) there, so neither router takes the
hop, where a plain client's keys of the other node cross it; an answer names its keys'
owner; a router of the map that is gone costs a fallback, never a wrong answer.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import grpc
import httpx
import pytest
from google.protobuf.json_format import MessageToDict

from qstate.client import AsyncClient, Client
from qstate.control.coordinator import Coordinator
from qstate.core.address import partition_of
from qstate.core.answer import ClusterMap, StateAnswer
from qstate.core.records.operator import save_spec
from qstate.core.records.storage import Storage
from qstate.embedded.ports import wait_for_port
from qstate.embedded.procs import RouterProcess, ShardProcess
from qstate.proto import qstate_pb2 as pb
from qstate.proto import qstate_pb2_grpc as pb_grpc
from tests.clients.test_node_client import node, node_json  # noqa: F401  (node: a fixture)
from tests.helpers import metric, wait_until
from tests.shop import BATCHES, KEYS, READS, SPEC, P, commit_batch, views

NODES = ("node-a", "node-b")
LAST = BATCHES - 1


@dataclass
class Hosts:
    storage: Storage
    coordinator: Coordinator
    shards: dict[str, ShardProcess]  # node -> its shard
    routers: dict[str, RouterProcess]  # node -> its router

    def node_of(self, key: str) -> str:
        address = self.coordinator.assignment.owner(SPEC.operator, partition_of(key, P))
        return next(n for n, s in self.shards.items() if s.address == address)


def reads(r: RouterProcess) -> dict[str, float]:
    """A router's key lookups so far: in-process (its node's) and over the hop."""
    return {path: metric(r.url, READS, path=path) for path in ("local", "remote")}


def _local_now(r: RouterProcess, key: str) -> bool:
    before = reads(r)["local"]
    httpx.get(f"{r.url}/v1/state/{SPEC.job}/{SPEC.operator}/views/{key}", timeout=5)
    return reads(r)["local"] > before


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    tmp = tmp_path_factory.mktemp("cluster-map")
    storage = Storage(str(tmp / "storage"))
    save_spec(storage, SPEC)
    shards = {n: ShardProcess.make(f"shard-{n}", tmp / "data", storage.uri, tmp / "logs",
                                   env={**os.environ, "QSTATE_NODE": n}) for n in NODES}
    routers: dict[str, RouterProcess] = {}
    try:
        for s in shards.values():
            s.start()
        for s in shards.values():
            wait_for_port(s.host, s.port, 30, s.proc)
        coord = Coordinator(storage, SPEC.job, [s.address for s in shards.values()])
        coord.register(SPEC)
        for batch in range(BATCHES):
            commit_batch(storage, coord, batch)
        coord.stop()
        for n in NODES:
            routers[n] = RouterProcess.make(storage.uri, tmp / "logs", f"router-{n}",
                                            {**os.environ, "QSTATE_NODE": n})
            routers[n].start_and_wait()
        h = Hosts(storage, coord, shards, routers)
        for n, r in routers.items():
            mine = next(k for k in KEYS if h.node_of(k) == n)
            wait_until(partial(_local_now, r, mine), 30,
                       f"the router of {n} reading its node's shard in-process")
        yield h
    finally:
        for r in routers.values():
            r.stop()
        for s in shards.values():
            s.stop()


def truth(key: str) -> int:
    return views(key, LAST)


def test_the_map_names_each_partitions_owner_and_the_router_on_its_node(hosts: Hosts) -> None:
    """Per partition: the owner the assignment names, ready, with the router of its node
    (the router registered itself in storage: its URL and gRPC port); the job's epoch."""
    a = hosts.coordinator.assignment
    for asked in hosts.routers.values():
        r = httpx.get(f"{asked.url}/v1/cluster/{SPEC.job}", timeout=10)
        assert r.status_code == 200, r.text
        m = ClusterMap.model_validate_json(r.content)
        assert (m.job, m.epoch) == (SPEC.job, a.epoch)
        [op] = m.operators
        assert (op.operator, op.partitions) == (SPEC.operator, P)
        assert [p.partition for p in op.owners] == list(range(P))
        for p in op.owners:
            assert p.owner is not None
            assert p.owner.server == a.owner_id(SPEC.operator, p.partition)
            at = next(n for n, s in hosts.shards.items() if s.address ==
                      a.owner(SPEC.operator, p.partition))
            assert p.owner.ready
            assert [(x.url, x.grpc) for x in p.owner.read_at] == [
                (hosts.routers[at].url, f"127.0.0.1:{hosts.routers[at].grpc_port}")]
    nope = httpx.get(f"{hosts.routers['node-a'].url}/v1/cluster/nope", timeout=10)
    assert nope.status_code == 404 and "nope" in nope.json()["message"], nope.text


def test_an_answer_names_the_owner_of_its_keys(hosts: Hosts) -> None:
    """A point read (and a batch of one owner's keys) says who owns it and where that is
    read, whichever router answered; a batch of two owners' keys names none."""
    a = hosts.coordinator.assignment
    ra = hosts.routers["node-a"]
    by_node = {n: [k for k in KEYS[:60] if hosts.node_of(k) == n] for n in NODES}
    for n, keys in by_node.items():
        owner = a.owner_id(SPEC.operator, partition_of(keys[0], P))
        r = httpx.get(f"{ra.url}/v1/state/{SPEC.job}/{SPEC.operator}/views/{keys[0]}",
                      timeout=10)
        assert r.status_code == 200, r.text
        assert (r.headers.get("qstate-owner"), r.headers.get("qstate-owner-url")) == (
            owner, hosts.routers[n].url)
        b = httpx.post(f"{ra.url}/v1/state/{SPEC.job}/{SPEC.operator}/views:batchGet",
                       json={"keys": keys}, timeout=10)
        assert b.status_code == 200 and b.headers.get("qstate-owner") == owner, b.headers
    mixed = httpx.post(f"{ra.url}/v1/state/{SPEC.job}/{SPEC.operator}/views:batchGet",
                       json={"keys": by_node["node-a"][:3] + by_node["node-b"][:3]}, timeout=10)
    assert mixed.status_code == 200 and "qstate-owner" not in mixed.headers, mixed.headers


def _moved(before: dict[str, dict[str, float]], hosts: Hosts) -> dict[str, dict[str, float]]:
    return {n: {p: v - before[n][p] for p, v in reads(r).items()}
            for n, r in hosts.routers.items()}


@pytest.mark.parametrize("kind", ["client", "async-client"])
def test_a_direct_client_reads_every_key_where_it_is_held(hosts: Hosts, kind: str) -> None:
    """Point reads and batches (split by owner) of a direct client asked at node a's router:
    every answer exact, each key read in-process by the router of its node and none over
    the hop; the same reads by a plain client cross it for node b's keys."""
    keys = KEYS[:120]
    owned_b = sum(hosts.node_of(k) == "node-b" for k in keys)
    assert 0 < owned_b < len(keys)
    url = hosts.routers["node-a"].url

    def read_all(direct: bool) -> tuple[list[StateAnswer], list[StateAnswer]]:
        if kind == "client":
            with Client(url, direct=direct) as c:
                return ([c.get(SPEC.job, SPEC.operator, "views", k) for k in keys],
                        c.multi_get(SPEC.job, SPEC.operator, "views", keys))

        async def go() -> tuple[list[StateAnswer], list[StateAnswer]]:
            async with AsyncClient(url, direct=direct) as c:
                points = [await c.get(SPEC.job, SPEC.operator, "views", k) for k in keys]
                return points, await c.multi_get(SPEC.job, SPEC.operator, "views", keys)

        return asyncio.run(go())

    for direct in (True, False):
        before = {n: reads(r) for n, r in hosts.routers.items()}
        points, batch = read_all(direct)
        moved = _moved(before, hosts)
        for answers in (points, batch):
            assert [(a.key, a.latest.value if a.latest else None) for a in answers] == [
                (k, truth(k)) for k in keys]
        if direct:
            assert moved["node-a"]["remote"] == 0 and moved["node-b"]["remote"] == 0, moved
            assert moved["node-b"]["local"] >= 2 * owned_b, moved
        else:
            assert moved["node-a"]["remote"] >= 2 * owned_b, moved
            assert moved["node-b"] == {"local": 0, "remote": 0}, moved


def test_a_router_of_the_map_that_is_gone_costs_a_fallback_never_a_wrong_answer(
        hosts: Hosts) -> None:
    """Node b's router killed outright (its record stays in storage, on the map): a direct
    client's keys of node b find it gone and are asked at the client's router, which
    forwards them over the hop: every answer exact, then node b's router back."""
    ra, rb = hosts.routers["node-a"], hosts.routers["node-b"]
    keys = [k for k in KEYS if hosts.node_of(k) == "node-b"][:20]
    with Client(ra.url, direct=True) as c:
        c.get(SPEC.job, SPEC.operator, "views", keys[0])  # the map, naming rb, cached
        rb.kill()
        try:
            before = reads(ra)
            got = c.multi_get(SPEC.job, SPEC.operator, "views", keys)
            points = [c.get(SPEC.job, SPEC.operator, "views", k) for k in keys]
            for answers in (got, points):
                assert [(a.key, a.latest.value if a.latest else None) for a in answers] == [
                    (k, truth(k)) for k in keys]
            assert reads(ra)["remote"] - before["remote"] >= 2 * len(keys)
        finally:
            rb.start_and_wait()
            wait_until(lambda: _local_now(rb, keys[0]), 30, "node b's router back")


def test_a_grpc_answer_names_the_owner_in_its_trailing_metadata(hosts: Hosts) -> None:
    """gRPC's Get and MultiGet of one owner's keys (the engine's port) carry the owner as the
    HTTP answer does, in trailing metadata."""
    a = hosts.coordinator.assignment
    ra = hosts.routers["node-a"]
    key = next(k for k in KEYS if hosts.node_of(k) == "node-b")
    owner = a.owner_id(SPEC.operator, partition_of(key, P))
    with grpc.insecure_channel(f"127.0.0.1:{ra.grpc_port}") as ch:
        stub = pb_grpc.QueryableStateStub(ch)
        got, call = stub.Get.with_call(pb.GetRequest(job=SPEC.job, operator=SPEC.operator,
                                                     state="views", key=key), timeout=10)
        assert got.key == key
        trailers = dict(call.trailing_metadata() or ())
        assert (trailers.get("qstate-owner"), trailers.get("qstate-owner-url")) == (
            owner, hosts.routers["node-b"].url)
        _, call = stub.MultiGet.with_call(pb.MultiGetRequest(
            job=SPEC.job, operator=SPEC.operator, state="views", keys=[key]), timeout=10)
        assert dict(call.trailing_metadata() or ()).get("qstate-owner") == owner


@pytest.mark.parametrize("direct", [True, False])
def test_the_feast_store_with_direct_reads_every_key_where_it_is_held(
        hosts: Hosts, tmp_path: Path, direct: bool) -> None:
    """Feast's online store over node a's router (docs/feast.md, ``direct``): one call's
    keys split by owner, every feature exact, none read over the hop; without ``direct`` node
    b's keys cross it."""
    from tests.feast.test_store import features, repo  # Feast: imported by this test only

    keys = KEYS[:120]
    owned_b = sum(hosts.node_of(k) == "node-b" for k in keys)
    store = repo(tmp_path, hosts.routers["node-a"].url,
                 swap={"batch_keys: 1000": f"batch_keys: 1000\n  direct: {str(direct).lower()}"})
    before = {n: reads(r) for n, r in hosts.routers.items()}
    got = features(store, keys, ["page_latest:views"])
    moved = _moved(before, hosts)
    assert got["views"] == [truth(k) for k in keys]
    if direct:
        assert moved["node-a"]["remote"] == 0 and moved["node-b"]["remote"] == 0, moved
        assert moved["node-b"]["local"] >= owned_b, moved
    else:
        assert moved["node-a"]["remote"] >= owned_b, moved
        assert moved["node-b"] == {"local": 0, "remote": 0}, moved


def test_the_grpc_map_is_the_http_one(hosts: Hosts) -> None:
    """DescribeClusterMap answers what GET /v1/cluster/{job} does, field by field; an
    unknown job is NOT_FOUND naming it."""
    ra = hosts.routers["node-a"]
    http = httpx.get(f"{ra.url}/v1/cluster/{SPEC.job}", timeout=10).json()
    with grpc.insecure_channel(f"127.0.0.1:{ra.grpc_port}") as ch:
        stub = pb_grpc.QueryableStateStub(ch)
        got = stub.DescribeClusterMap(pb.DescribeJobRequest(job=SPEC.job), timeout=10)
        with pytest.raises(grpc.RpcError) as e:
            stub.DescribeClusterMap(pb.DescribeJobRequest(job="nope"), timeout=10)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND and "nope" in (e.value.details() or "")
    as_json = MessageToDict(got, preserving_proto_field_name=True,
                            always_print_fields_with_no_presence=True)
    as_json["epoch"] = int(as_json["epoch"])  # int64 in proto JSON is a string
    assert as_json == http
    assert got.operators[0].owners[0].owner.read_at[0].grpc  # read from the proto's fields


@pytest.mark.parametrize("direct", [True, False])
def test_the_node_client_with_direct_reads_every_key_where_it_is_held(
        hosts: Hosts, node: str, direct: bool) -> None:  # noqa: F811  (node: the fixture)
    """`node query.mjs multiget --direct` at node a's gRPC port: the keys split by the map's
    owners (xxhash64 in JavaScript, as the job hashes them), every answer exact, none read
    over the hop; a get of node b's key too; without --direct node b's keys cross it."""
    keys = KEYS[:60]
    owned_b = [k for k in keys if hosts.node_of(k) == "node-b"]
    addr = f"127.0.0.1:{hosts.routers['node-a'].grpc_port}"
    flag = ["--direct"] if direct else []
    before = {n: reads(r) for n, r in hosts.routers.items()}
    got = node_json(node, addr, "multiget", SPEC.job, SPEC.operator, "views", *keys, *flag)
    one = node_json(node, addr, "get", SPEC.job, SPEC.operator, "views", owned_b[0], *flag)
    moved = _moved(before, hosts)
    assert [(r["key"], int(r["windows"][-1]["int_value"])) for r in got["results"]] == [
        (k, truth(k)) for k in keys]
    assert (one["key"], int(one["windows"][-1]["int_value"])) == (owned_b[0],
                                                                  truth(owned_b[0]))
    if direct:
        assert moved["node-a"]["remote"] == 0 and moved["node-b"]["remote"] == 0, moved
        assert moved["node-b"]["local"] >= len(owned_b) + 1, moved
    else:
        assert moved["node-a"]["remote"] >= len(owned_b) + 1, moved
        assert moved["node-b"] == {"local": 0, "remote": 0}, moved


def test_a_stale_map_costs_one_hop_then_the_client_reads_it_again(hosts: Hosts) -> None:
    """A direct client whose map is stale (as after a move: node b's partitions placed on
    node a's server and router): its read of a node b key goes to node a's router, which
    answers it exactly over the hop and names the real owner; the client drops the map, and
    its next read of that key goes where it is held, with no hop."""
    ra = hosts.routers["node-a"]
    key = next(k for k in KEYS if hosts.node_of(k) == "node-b")
    real = ClusterMap.model_validate_json(
        httpx.get(f"{ra.url}/v1/cluster/{SPEC.job}", timeout=10).content)
    a_holder = next(p.owner for p in real.operators[0].owners
                    if p.owner is not None and p.owner.read_at[0].url == ra.url)
    stale = real.model_copy(deep=True)
    for p in stale.operators[0].owners:
        p.owner = a_holder  # every partition on node a, as a map from before a move says
    with Client(ra.url, direct=True) as c:
        c.get(SPEC.job, SPEC.operator, "views", key)  # the map fetched
        assert c._owners is not None
        c._owners.put(SPEC.job, stale)
        for hop in (True, False):
            before = {n: reads(r) for n, r in hosts.routers.items()}
            got = c.get(SPEC.job, SPEC.operator, "views", key)
            moved = _moved(before, hosts)
            assert got.latest is not None and got.latest.value == truth(key)
            if hop:
                assert moved["node-a"]["remote"] == 1 and moved["node-b"]["local"] == 0, moved
                assert c._owners.wants(SPEC.job)  # the answer named another owner: forgotten
            else:
                assert moved["node-a"]["remote"] == 0 and moved["node-b"]["local"] == 1, moved
