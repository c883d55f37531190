"""The shard servers as this router sees them: one Describe poller per router
(docs/architecture.md §5). Whoever needs to know how servers stand asks here, naming how old
an answer may be: the read path (which co-located partitions are ready, every
``local_ready_poll_s``), the watch hub (which partitions moved on, every ``watch_poll_s``
while anything is watched), a job's description and the cluster page. An answer young enough
is shared; otherwise one Describe per server is made, and callers that ask meanwhile wait for
that same call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

import grpc

from qstate.core.transport.shard_client import Held, held_partitions
from qstate.proto import shard_pb2 as pb
from qstate.router.shards import ShardStubs

__all__ = ["Describer"]


class Describer:
    def __init__(self, caller: ShardStubs) -> None:
        self.caller = caller
        # address -> (monotonic time asked, what it said: None when it did not answer)
        self._said: dict[str, tuple[float, Held | None]] = {}
        self._asking: dict[str, asyncio.Future[Held | None]] = {}

    async def describe(self, addresses: Iterable[str], max_age_s: float
                       ) -> dict[str, Held | None]:
        """What each server holds, as it said at most ``max_age_s`` ago (None: it did not
        answer in ``shard_timeout_s``)."""
        now = time.monotonic()
        wanted = set(addresses)
        out: dict[str, Held | None] = {}
        waits: dict[str, asyncio.Future[Held | None]] = {}
        for a in wanted:
            said = self._said.get(a)
            if said is not None and now - said[0] <= max_age_s:
                out[a] = said[1]
                continue
            fut = self._asking.get(a)
            if fut is None:
                fut = self._asking[a] = asyncio.ensure_future(self._ask(a))
            waits[a] = fut
        for a, fut in waits.items():
            out[a] = await asyncio.shield(fut)
        return out

    async def _ask(self, address: str) -> Held | None:
        asked = time.monotonic()
        try:
            d = await self.caller.stub(address).Describe(pb.DescribeRequest(),
                                                         timeout=self.caller.timeout_s)
            held: Held | None = held_partitions(d)
        except grpc.aio.AioRpcError:
            held = None
        finally:
            self._asking.pop(address, None)
        self._said[address] = (asked, held)
        return held

    def forget(self, keep: Iterable[str]) -> None:
        """Drop what servers no longer in the routing table said."""
        keep = set(keep)
        for a in [a for a in self._said if a not in keep]:
            del self._said[a]
