"""The client's cache of cluster maps (``qstate.core.transport.cluster_map``), alone: which
router each key is asked at, batches split by it, and when the map is re-read."""

from __future__ import annotations

from qstate.core.address import partition_of
from qstate.core.answer import (
    ClusterMap,
    OperatorMap,
    PartitionHolder,
    PartitionOwners,
    ReadAddress,
)
from qstate.core.transport.cluster_map import Owners

P = 4
URLS = {0: "http://a:8000", 1: "http://b:8000"}


def a_map(owner_of: dict[int, int]) -> ClusterMap:
    """Partition p owned by server ``s{owner_of[p]}``, read at URLS[that]; p 3 unassigned."""
    return ClusterMap(job="j", epoch=3, operators=[OperatorMap(
        operator="o", partitions=P, owners=[
            PartitionOwners(partition=p, owner=None if p not in owner_of else PartitionHolder(
                server=f"s{owner_of[p]}", ready=True, read_at=[ReadAddress(
                    router=f"r{owner_of[p]}", url=URLS[owner_of[p]], grpc="x:1")]))
            for p in range(P)])])


def key_of(p: int) -> str:
    return next(k for k in (f"k{i}" for i in range(1000)) if partition_of(k, P) == p)


def test_each_key_goes_to_the_router_of_its_owner_and_batches_split_by_it() -> None:
    o = Owners(ttl_s=60)
    assert o.wants("j")
    o.put("j", a_map({0: 0, 1: 1, 2: 0}))
    assert not o.wants("j")
    assert [o.url_of("j", "o", key_of(p)) for p in range(P)] == [
        URLS[0], URLS[1], URLS[0], None]
    assert o.url_of("j", "other", key_of(0)) is None
    keys = [key_of(p) for p in (1, 0, 3, 2, 1)]
    assert o.split("j", "o", keys) == {URLS[1]: [0, 4], URLS[0]: [1, 3], None: [2]}


def test_the_map_is_re_read_when_an_answer_names_another_owner_or_a_router_is_gone() -> None:
    o = Owners(ttl_s=60)
    o.put("j", a_map({0: 0, 1: 1, 2: 0}))
    o.answered("j", "o", key_of(0), "s0")  # as the map says
    o.answered("j", "o", key_of(0), None)  # named none (a batch of two owners)
    assert not o.wants("j")
    o.answered("j", "o", key_of(0), "s1")  # moved
    assert o.wants("j")
    o.put("j", a_map({0: 1, 1: 1, 2: 0}))
    o.down("j", URLS[1], "refused")
    assert o.wants("j")
    o.put("j", a_map({0: 1, 1: 1, 2: 0}))  # re-read: still naming the router that is gone
    assert o.url_of("j", "o", key_of(0)) is None  # asked at the client's router meanwhile
    assert o.url_of("j", "o", key_of(2)) == URLS[0]


def test_a_router_without_maps_sends_everything_to_the_clients_router_until_the_ttl() -> None:
    o = Owners(ttl_s=60)
    o.put("j", None)
    assert not o.wants("j") and o.url_of("j", "o", "k") is None
    o.answered("j", "o", "k", "s0")  # an answer naming an owner: no map to be wrong
    assert not o.wants("j")
    expired = Owners(ttl_s=1e-9)
    expired.put("j", None)
    assert expired.wants("j")


def test_a_router_answer_that_is_not_a_map_leaves_every_key_at_the_clients_router() -> None:
    """What a router answered to the map's path, as both clients hand it over: a 200 of a map
    is followed; no answer, another status or a body that is not a map is none to follow
    (until ``ttl_s``), never an error of the read."""
    o = Owners(ttl_s=60)
    body = a_map({0: 0, 1: 1, 2: 0}).model_dump_json().encode()
    o.put_answer("j", 200, body)
    assert o.url_of("j", "o", key_of(1)) == URLS[1]
    for status, got in ((None, b""), (404, body), (200, b"{\"job\": 1}"), (200, b"\xff")):
        o.put_answer("j", status, got)
        assert not o.wants("j")  # fetched: not asked again at once
        assert o.split("j", "o", [key_of(0), key_of(1)]) == {None: [0, 1]}, (status, got)
