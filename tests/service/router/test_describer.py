"""The router's one Describe poller (``qstate.router.describer``): callers that ask at once
share one call per server, an answer young enough is shared, an older one is asked again, a
server that does not answer is None. A fake shard stub counts the calls (one module's unit
test: the real servers are exercised by test_cluster, test_watch and the read path)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from qstate.proto import shard_pb2 as pb
from qstate.router.describer import Describer


class _Down(grpc.aio.AioRpcError):
    def __init__(self) -> None:
        super().__init__(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata())


class FakeCaller:
    timeout_s = 1.0

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.gate = asyncio.Event()
        self.down: set[str] = set()

    def stub(self, address: str) -> Any:
        caller = self

        class Stub:
            async def Describe(self, req: pb.DescribeRequest, timeout: float) -> Any:
                caller.calls.append(address)
                await caller.gate.wait()
                if address in caller.down:
                    raise _Down()
                return pb.DescribeReply(partitions=[pb.PartitionInfo(
                    job="j", operator="o", partition=len(caller.calls))])

        return Stub()


def test_callers_share_one_call_and_young_answers() -> None:
    async def run() -> None:
        caller = FakeCaller()
        d = Describer(caller)  # type: ignore[arg-type]
        first = [asyncio.ensure_future(d.describe(["a", "b"], 0.0)) for _ in range(5)]
        while len(caller.calls) < 2:  # the calls under way (each waits at the gate)
            await asyncio.sleep(0)
        for _ in range(10):  # the other callers had their turns: no call of their own
            await asyncio.sleep(0)
        assert sorted(caller.calls) == ["a", "b"]  # five callers, one call a server
        caller.gate.set()
        answers = await asyncio.gather(*first)
        assert all(a == answers[0] for a in answers)
        assert await d.describe(["a"], 60.0) == {"a": answers[0]["a"]}  # young: no call
        assert len(caller.calls) == 2
        caller.down.add("b")
        again = await d.describe(["a", "b"], 0.0)  # too old for 0 s: asked again
        assert len(caller.calls) == 4 and again["b"] is None and again["a"] != answers[0]["a"]

    asyncio.run(asyncio.wait_for(run(), 10))
