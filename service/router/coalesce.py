"""Coalesce concurrent key lookups for one shard into one MultiGet call.

A unary Python gRPC call costs ~280 µs of CPU a side, a key inside a MultiGet ~5 µs, so a
per-request hop caps a router at a few thousand requests/s. Lookups that arrive while
``max_inflight`` calls to the same shard are outstanding wait and leave together in the
next call: at low load every lookup goes at once, under load batches grow by themselves.
The wait is bounded: a lookup that finds ``max_queue`` keys already waiting for the same
shard fails at once with ``Overloaded`` (429), instead of growing a queue no answer can
leave in time.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field

import grpc

from qstate.core.address import PartitionId
from qstate.core.config import DEFAULTS, Settings
from qstate.core.errors import Overloaded
from qstate.core.transport import security
from qstate.core.transport.shard_client import CHANNEL_OPTIONS
from qstate.proto import shard_pb2 as pb
from qstate.proto import shard_pb2_grpc as pb_grpc

__all__ = ["MAX_BATCH", "ShardCaller"]

# address, job, op, state, from, to, range, limit (windows per key of a range), savepoint
# ("": the live state)
Group = tuple[str, str, str, str, int, int, bool, int, str]
MAX_BATCH = 2000


@dataclass
class _Pending:
    keys: list[pb.KeyQuery] = field(default_factory=list)
    futures: list[asyncio.Future] = field(default_factory=list)
    inflight: int = 0
    scheduled: bool = False


class ShardCaller:
    def __init__(self, timeout_s: float = DEFAULTS.shard_timeout_s, max_inflight: int = 2,
                 cfg: Settings = DEFAULTS, max_queue: int = DEFAULTS.max_shard_queue,
                 retry_after_s: float = DEFAULTS.retry_after_s) -> None:
        self.cfg = cfg  # TLS and the cluster token of the shard API
        self.max_queue = max_queue
        self.retry_after_s = retry_after_s
        self.timeout_s = timeout_s
        self.max_inflight = max_inflight
        self._stubs: dict[str, pb_grpc.ShardStub] = {}
        self._channels: list[grpc.aio.Channel] = []
        self._groups: dict[Group, _Pending] = {}
        # keys waiting (not yet sent) per shard address, over all its groups: a time range
        # relative to now is a group of its own at every request, so a per-group bound
        # would bound nothing
        self._waiting: Counter[str] = Counter()

    def stub(self, address: str) -> pb_grpc.ShardStub:
        stub = self._stubs.get(address)
        if stub is None:
            ch = security.aio_channel(address, self.cfg, CHANNEL_OPTIONS)
            self._channels.append(ch)
            stub = self._stubs[address] = pb_grpc.ShardStub(ch)
        return stub

    async def close(self) -> None:
        for ch in self._channels:
            await ch.close()

    def lookup(self, address: str, pid: PartitionId, state: str, key: pb.KeyQuery,
               rng: tuple[int, int] | None, limit: int = 0,
               savepoint: str | None = None) -> asyncio.Future:
        """A future of the key's ``KeyResult``; fails with ``grpc.aio.AioRpcError``."""
        group: Group = (address, pid.job, pid.operator, state, *(rng or (0, 0)), rng is not None,
                        limit if rng is not None else 0, savepoint or "")
        if self._waiting[address] >= self.max_queue:  # before a group is made for it
            raise Overloaded(f"{self._waiting[address]} keys already wait for shard {address} "
                             f"(QSTATE_MAX_SHARD_QUEUE); retry after {self.retry_after_s:g} s",
                             retry_after_s=self.retry_after_s)
        p = self._groups.get(group)
        if p is None:
            p = self._groups[group] = _Pending()
        fut = asyncio.get_running_loop().create_future()
        p.keys.append(key)
        p.futures.append(fut)
        self._waiting[address] += 1
        if not p.scheduled and p.inflight < self.max_inflight:
            p.scheduled = True
            # after the current loop iteration: lookups of requests parsed together join
            asyncio.get_running_loop().call_soon(self._flush, group)
        return fut

    def _flush(self, group: Group) -> None:
        p = self._groups[group]
        p.scheduled = False
        if any(f.done() for f in p.futures):
            # lookups nobody waits for any more (their request failed or went away, e.g. a
            # batchGet refused part-way): not sent to the shard at all
            live = [(k, f) for k, f in zip(p.keys, p.futures, strict=True) if not f.done()]
            self._leave(group[0], len(p.keys) - len(live))
            p.keys, p.futures = [k for k, _ in live], [f for _, f in live]
            if not p.keys and not p.inflight:
                self._groups.pop(group, None)
                return
        while p.keys and p.inflight < self.max_inflight:
            keys, futures = p.keys[:MAX_BATCH], p.futures[:MAX_BATCH]
            del p.keys[:MAX_BATCH], p.futures[:MAX_BATCH]
            self._leave(group[0], len(keys))
            p.inflight += 1
            asyncio.get_running_loop().create_task(self._call(group, p, keys, futures))

    def _leave(self, address: str, n: int) -> None:
        self._waiting[address] -= n
        if self._waiting[address] <= 0:
            del self._waiting[address]

    async def _call(self, group: Group, p: _Pending, keys: list[pb.KeyQuery],
                    futures: list[asyncio.Future]) -> None:
        address, job, operator, state, lo, hi, is_range, limit, savepoint = group
        req = pb.LookupRequest(job=job, operator=operator, state=state, keys=keys,
                               range=is_range, from_ms=lo, to_ms=hi, limit=limit,
                               savepoint=savepoint)
        try:
            reply = await self.stub(address).MultiGet(req, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            for f in futures:
                if not f.done():
                    f.set_exception(exc)
        else:
            for f, r in zip(futures, reply.results, strict=True):
                if not f.done():
                    f.set_result(r)
        finally:
            p.inflight -= 1
            if p.keys and not p.scheduled:
                self._flush(group)
            elif not p.keys and not p.inflight:
                self._groups.pop(group, None)
