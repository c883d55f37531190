"""Concurrent lookups for one shard leave together in one MultiGet; while calls are in
flight, new lookups queue and leave in batches of at most MAX_BATCH (the shard's stub faked:
this is a unit test of the coalescer)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from qstate.core.address import PartitionId
from qstate.proto import shard_pb2 as pb
from qstate.router.coalesce import MAX_BATCH, ShardCaller

PID = PartitionId("j", "op", 0)


class FakeStub:
    def __init__(self, fail: grpc.aio.AioRpcError | None = None) -> None:
        self.calls: list[list[str]] = []
        self.release = asyncio.Event()
        self.fail = fail

    async def MultiGet(self, req: pb.LookupRequest, timeout: float) -> pb.LookupReply:
        self.calls.append([k.key for k in req.keys])
        await self.release.wait()
        if self.fail is not None:
            raise self.fail
        return pb.LookupReply(results=[pb.KeyResult(key=k.key, status=pb.FOUND, batch=len(k.key))
                                       for k in req.keys])


def caller_with(stub: FakeStub, max_inflight: int) -> ShardCaller:
    caller = ShardCaller(timeout_s=5, max_inflight=max_inflight)
    caller._stubs["s:1"] = stub  # type: ignore[assignment]
    return caller


def ask(caller: ShardCaller, keys: list[str]) -> list[asyncio.Future]:
    return [caller.lookup("s:1", PID, "n", pb.KeyQuery(key=k, partition=0), None) for k in keys]


def test_lookups_made_together_leave_in_one_call() -> None:
    async def go() -> None:
        stub = FakeStub()
        stub.release.set()
        caller = caller_with(stub, max_inflight=2)
        futures = ask(caller, [f"k{i}" for i in range(5)])
        results = await asyncio.gather(*futures)
        assert stub.calls == [[f"k{i}" for i in range(5)]]
        assert [r.key for r in results] == [f"k{i}" for i in range(5)]  # each its own answer

    asyncio.run(go())


def test_while_calls_are_in_flight_lookups_queue_and_leave_in_bounded_batches() -> None:
    async def go() -> None:
        stub = FakeStub()
        caller = caller_with(stub, max_inflight=1)
        first = ask(caller, ["a"])
        await asyncio.sleep(0.01)  # the first call leaves
        assert stub.calls == [["a"]]
        later = ask(caller, [f"q{i}" for i in range(MAX_BATCH + 500)])
        await asyncio.sleep(0.01)
        assert len(stub.calls) == 1  # nothing else leaves while one call is out
        stub.release.set()
        results = await asyncio.gather(*first, *later)
        assert [len(c) for c in stub.calls] == [1, MAX_BATCH, 500]
        assert [r.key for r in results] == ["a"] + [f"q{i}" for i in range(MAX_BATCH + 500)]

    asyncio.run(go())


def test_a_failed_call_fails_every_lookup_in_it() -> None:
    async def go() -> None:
        err = grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(),
                                   grpc.aio.Metadata(), "shard down")
        stub = FakeStub(fail=err)
        stub.release.set()
        caller = caller_with(stub, max_inflight=2)
        futures = ask(caller, ["a", "b"])
        for f in futures:
            with pytest.raises(grpc.aio.AioRpcError):
                await f
        assert caller._groups == {}  # nothing left pending

    asyncio.run(go())


def test_the_queue_bound_is_per_shard_over_every_range_and_frees_as_keys_leave() -> None:
    """Each request with a range relative to now is a group of its own; the bound counts
    every key waiting for the shard, whatever its group, and a key that left (sent, or its
    request gone) frees its place."""
    from qstate.core.errors import Overloaded

    async def go() -> None:
        stub = FakeStub()
        caller = ShardCaller(timeout_s=5, max_inflight=1, max_queue=3)
        caller._stubs["s:1"] = stub  # type: ignore[assignment]

        def ranged(key: str, lo: int) -> asyncio.Future:
            return caller.lookup("s:1", PID, "n", pb.KeyQuery(key=key, partition=0),
                                 (lo, lo + 60_000))

        # one call in flight per group; behind each, keys wait
        first = [ranged("a", 0), ranged("b", 1)]
        await asyncio.sleep(0.01)
        assert len(stub.calls) == 2
        waiting = [ranged("c", 0), ranged("d", 1), ranged("e", 2)]  # e: a third group, sent
        await asyncio.sleep(0.01)
        assert len(stub.calls) == 3
        waiting.append(ranged("f", 2))  # 3 wait now (c, d, f), each in a different group
        with pytest.raises(Overloaded, match="3 keys already wait for shard s:1"):
            ranged("g", 3)
        waiting[0].cancel()  # c's request went away
        stub.release.set()
        results = await asyncio.gather(*first, *waiting[1:])
        assert [r.key for r in results] == ["a", "b", "d", "e", "f"]
        assert not caller._waiting and not caller._groups  # everything accounted for
        assert (await ranged("h", 4)).key == "h"

    asyncio.run(go())
