"""The internal gRPC API of a shard server (proto/shard.proto).

Every field is validated here; a qstate error leaves as its own gRPC code
(``qstate.core.errors``), so callers never read messages to decide what happened.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

import grpc

from qstate.core.address import PartitionId, check_key, check_name, partition_of
from qstate.core.config import DEFAULTS
from qstate.core.errors import InvalidRequest, QStateError, UnknownOperator, grpc_trailers
from qstate.core.process import faults
from qstate.core.records.operator import OperatorSpec
from qstate.core.transport.values import set_value
from qstate.partition import rank
from qstate.partition.ranking import check_top
from qstate.partition.reader import WindowValue, page
from qstate.proto import shard_pb2 as pb
from qstate.proto import shard_pb2_grpc as pb_grpc
from qstate.shard import metrics
from qstate.shard.held import Held
from qstate.shard.partitions import PartitionCommit, Partitions
from qstate.shard.savepoints import SavepointReads
from qstate.shard.store import PartitionStore

__all__ = ["ShardService"]

log = logging.getLogger(__name__)

MAX_KEYS = 10_000
MAX_TOP_N = 10_000  # a router asks at most its max_top_n of each partition
# A partition's top-N changes only with its batch: answers are kept until it moves on, so
# a leaderboard many dashboards poll costs one read per partition per batch. Bounded: at
# most this many answers, each of n <= TOP_CACHE_N keys (docs/architecture.md §5).
TOP_CACHE_SIZE = 512
TOP_CACHE_N = 1000
# A lookup reading more windows than this (keys × the windows each may return) runs on the
# read threads, not on the event loop that answers heartbeats (Describe) and commits:
# a read storm makes reads slower, never a server that looks dead (docs/architecture.md §5).
# One thread: reads are bound by the GIL, and a second one only takes more of it from the
# commits (measured: commit p50 under a storm 106 ms with one, 228 ms with two, 4.6 s inline)
INLINE_WINDOWS = 64
READ_THREADS = 1


def _window(w: WindowValue, idx: int) -> pb.Window:
    out = pb.Window(windowed=w.start is not None, start_ms=w.start or 0, end_ms=w.end or 0)
    set_value(out, w.values[idx])
    return out


def _in_partition(key: str, partition: int, partitions: int) -> bool:
    """The key's partition by ``partitions``, or by a count that divides it: a router that
    has not yet read a rescaled spec routes by the old count, and that old partition still
    holds the key (service/control/rescale.py)."""
    q = partition_of(key, partitions)
    return q == partition or any(
        q % d == partition for d in range(partition + 1, partitions) if partitions % d == 0)


def _owned(partition: int, count: int) -> rank.Owned | None:
    """Whether a key is ``partition``'s by ``count`` partitions (None: every key is)."""
    if not count:
        return None
    return lambda key: partition_of(key, count) == partition


async def _abort(context: grpc.aio.ServicerContext, exc: QStateError) -> None:
    await context.abort(exc.grpc_code, exc.message, grpc_trailers(exc))


class ShardService(pb_grpc.ShardServicer):
    def __init__(self, partitions: Partitions, server_id: str, address: str,
                 max_windows: int = DEFAULTS.max_windows,
                 max_top_scan_keys: int = DEFAULTS.max_top_scan_keys,
                 savepoints: SavepointReads | None = None) -> None:
        self.partitions = partitions
        self.savepoints = savepoints
        self.server_id = server_id
        self.address = address
        self.max_windows = max_windows
        self.max_top_scan_keys = max_top_scan_keys
        self.draining = False  # stopping: serves until its partitions have moved (main.py)
        self.coordinator_at = float("-inf")  # monotonic time of a coordinator's last beat
        # its own threads: a read storm must not take the ones commits run on either
        self.read_pool = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="reads")
        # (partition, state, start or None, n, ascending, partition count, savepoint) ->
        # ((incarnation, batch), answer); used on the read thread only
        self._top_cache: OrderedDict[tuple[PartitionId, str, int | None, int, bool, int, str],
                                     tuple[tuple[str, int], pb.PartitionTop]] = OrderedDict()

    def _spec(self, job: str, operator: str, partitions: Iterable[int] = ()) -> OperatorSpec:
        """The spec; read again when a partition is past its count (a rescale since)."""
        check_name("job", job)
        check_name("operator", operator)
        spec = self.partitions.spec(job, operator)
        if any(p >= spec.partitions for p in partitions):
            spec = self.partitions.spec(job, operator, fresh=True)
        return spec

    async def Commit(self, request: pb.CommitRequest, context: grpc.aio.ServicerContext
                     ) -> pb.CommitReply:
        t0 = time.perf_counter()
        try:
            spec = self._spec(request.job, request.operator,
                              [pd.partition for pd in request.partitions])
            if request.batch < 0:
                raise InvalidRequest("batch must be >= 0")
            for pd in request.partitions:
                if pd.partition >= spec.partitions:
                    raise InvalidRequest(f"partition {pd.partition} >= {spec.partitions}")
            parts = [PartitionCommit(pd.partition, tuple(pd.fragments) if pd.has_delta else (),
                                     pd.rows) for pd in request.partitions]
            if any(pd.has_delta and not pd.fragments for pd in request.partitions):
                raise InvalidRequest("a partition with a delta names its fragments")
            faults.hit("shard.received", request.batch, request.operator)
            res = await asyncio.to_thread(
                self.partitions.commit, request.job, request.operator, request.batch,
                request.watermark_ms, request.epoch, parts)
        except QStateError as exc:
            metrics.refused_commit(request.job, request.operator, exc, len(request.partitions))
            await _abort(context, exc)
        faults.hit("shard.after-write", request.batch, request.operator)
        if faults.at("shard.after-ack", request.batch, request.operator):
            # done: the reply (and its status) went out
            context.add_done_callback(lambda _: faults.die())
        labels = (request.job, request.operator)
        metrics.COMMIT_SECONDS.labels(*labels).observe(time.perf_counter() - t0)
        metrics.COMMITS.labels(*labels, "applied").inc(len(res.applied))
        metrics.COMMITS.labels(*labels, "skipped").inc(len(res.skipped))
        if res.skipped:
            metrics.LAST_SKIPPED.labels(*labels).set(request.batch)
        return pb.CommitReply(applied=res.applied, skipped=res.skipped,
                              caught_up_batches=res.caught_up)

    def _state_spec(self, job: str, operator: str, state: str,
                    partitions: Iterable[int]) -> OperatorSpec:
        spec = self._spec(job, operator, partitions)
        check_name("state", state)
        if state not in spec.states:
            raise UnknownOperator(f"operator {job}/{operator} has no state {state!r}")
        return spec

    def _check_lookup(self, request: pb.LookupRequest) -> OperatorSpec:
        spec = self._state_spec(request.job, request.operator, request.state,
                                [kq.partition for kq in request.keys])
        if len(request.keys) > MAX_KEYS:
            raise InvalidRequest(f"at most {MAX_KEYS} keys per call")
        for kq in request.keys:
            check_key(kq.key)
            if not _in_partition(kq.key, kq.partition, spec.partitions):
                raise InvalidRequest(f"key {kq.key[:80]!r} is not in partition {kq.partition}")
        if request.range and request.to_ms <= request.from_ms:
            raise InvalidRequest("to_ms must be greater than from_ms")
        return spec

    async def MultiGet(self, request: pb.LookupRequest, context: grpc.aio.ServicerContext
                       ) -> pb.LookupReply:
        t0 = time.perf_counter()
        try:
            spec = self._check_lookup(request)
        except QStateError as exc:
            await _abort(context, exc)
        limit = min(request.limit or self.max_windows, self.max_windows)
        if len(request.keys) * (limit if request.range else 1) <= INLINE_WINDOWS and \
                not request.savepoint:
            reply = self._lookup(request, spec, limit)
        else:  # large, or a savepoint's partition may first be built: on the read thread
            try:
                reply = await asyncio.get_running_loop().run_in_executor(
                    self.read_pool, self._lookup, request, spec, limit)
            except QStateError as exc:
                await _abort(context, exc)
        for r in reply.results:
            metrics.LOOKUPS.labels(pb.KeyStatus.Name(r.status)).inc()
        metrics.LOOKUP_SECONDS.observe(time.perf_counter() - t0)
        return reply

    def _lookup(self, request: pb.LookupRequest, spec: OperatorSpec, limit: int
                ) -> pb.LookupReply:
        idx = spec.state_names.index(request.state)
        rng = (request.from_ms, request.to_ms) if request.range else None
        results = [pb.KeyResult(key=kq.key) for kq in request.keys]
        by_partition: dict[int, list[int]] = {}
        for i, kq in enumerate(request.keys):
            by_partition.setdefault(kq.partition, []).append(i)
        for partition, at in by_partition.items():
            pid = PartitionId(request.job, request.operator, partition)
            held, store, status = self._open(pid, request.savepoint)
            if store is None:
                for i in at:
                    results[i].status = status
                continue
            # a partition's keys under one snapshot: one META decode, one iterator; one more
            # window than the page holds tells whether there is a next page (an answer this
            # server's cap cut short says where to go on, like one the caller's limit cut)
            try:
                meta, per_key = store.read_many([request.keys[i].key for i in at], rng,
                                                limit + 1)
            except Exception as exc:
                if held is None:
                    raise
                self._moved_away(pid, held, exc)
                for i in at:
                    results[i].status = pb.NOT_OWNED
                continue
            for i, found in zip(at, per_key, strict=True):
                windows, next_from = page(found, limit)
                r = results[i]
                if next_from is not None:
                    r.next_from_ms = next_from
                r.batch, r.watermark_ms = meta.last_batch, meta.watermark_ms
                r.status = pb.FOUND if windows else pb.ABSENT
                r.windows.extend(_window(w, idx) for w in windows)
        return pb.LookupReply(results=results)

    def _open(self, pid: PartitionId, savepoint: str
              ) -> tuple[Held | None, PartitionStore | None, pb.KeyStatus]:
        """What a read of ``pid`` reads: the live partition when this server serves it now,
        or (``savepoint`` set) the savepoint's, which any server opens from storage; None
        and why not (NOT_OWNED, RESTORING: being restored or opened)."""
        if savepoint:
            store = self._savepoint(pid, savepoint)
            return None, store, pb.FOUND if store is not None else pb.RESTORING
        held, status = self._serving(pid)
        return held, None if held is None else held.store, status

    def _savepoint(self, pid: PartitionId, name: str) -> PartitionStore | None:
        if self.savepoints is None:
            raise InvalidRequest("this shard server reads no savepoints")
        return self.savepoints.store(pid, name)  # the name is checked reading its record

    def _serving(self, pid: PartitionId) -> tuple[Held | None, pb.KeyStatus]:
        """The partition when this server serves it now (status FOUND, for the caller to
        refine); else None and why: NOT_OWNED, or RESTORING."""
        held = self.partitions.lookup(pid)
        if held is None:
            return None, pb.NOT_OWNED
        if not held.ready.is_set():
            return None, pb.RESTORING
        return held, pb.FOUND

    def _moved_away(self, pid: PartitionId, held: Held, exc: Exception) -> None:
        """A read of ``held`` failed: fine when the partition moved away under it (its store
        was closed: the answer is NOT_OWNED), else re-raised."""
        if self.partitions.lookup(pid) is held:
            log.exception("reading %s failed", pid)
            raise exc
        log.info("%s moved away during a read: %s", pid, exc)

    async def Top(self, request: pb.TopRequest, context: grpc.aio.ServicerContext
                  ) -> pb.TopReply:
        t0 = time.perf_counter()
        try:
            spec = self._state_spec(request.job, request.operator, request.state,
                                    request.partitions)
            state = check_top(spec, request.state)
            if not 1 <= request.n <= MAX_TOP_N:
                raise InvalidRequest(f"n is {request.n}: ask 1 to {MAX_TOP_N}")
            for p in request.partitions:
                if p >= spec.partitions:
                    raise InvalidRequest(f"partition {p} >= {spec.partitions}")
            # on the read thread: it reads n entries of each partition, or folds a sliding
            # window's keys, and must not hold up commits and heartbeats (§5)
            reply = await asyncio.get_running_loop().run_in_executor(
                self.read_pool, self._top, request, spec, state)
        except QStateError as exc:
            await _abort(context, exc)
        metrics.TOP_SECONDS.observe(time.perf_counter() - t0)
        return reply

    def _top(self, request: pb.TopRequest, spec: OperatorSpec, state: int) -> pb.TopReply:
        reply = pb.TopReply()
        start = None if request.current else request.start_ms
        for p in request.partitions:
            pid = PartitionId(request.job, request.operator, p)
            r = reply.partitions.add(partition=p)
            held, store, r.status = self._open(pid, request.savepoint)
            if store is None:
                continue
            key = (pid, request.state, start, request.n, request.ascending,
                   request.partition_count, request.savepoint)
            version = (store.token, store.meta.last_batch)
            cached = self._top_cache.get(key)
            if cached is not None and cached[0] == version:
                self._top_cache.move_to_end(key)
                r.CopyFrom(cached[1])
                metrics.TOP_PARTITIONS.labels("cached").inc()
                continue
            try:
                meta, at, ranked = rank.read_top(
                    store.db, store.codec, state, start, request.n,
                    not request.ascending, self.max_top_scan_keys,
                    _owned(p, request.partition_count))
            except QStateError:  # the answer: too large, no rank index
                raise
            except Exception as exc:
                if held is None:
                    raise
                self._moved_away(pid, held, exc)
                r.status = pb.NOT_OWNED
                continue
            r.status, r.batch, r.watermark_ms, r.start_ms = (
                pb.FOUND, meta.last_batch, meta.watermark_ms, at)
            for k, v in ranked:
                set_value(r.entries.add(key=k), v)
            metrics.TOP_PARTITIONS.labels("read").inc()
            if request.n <= TOP_CACHE_N:
                # labelled with the batch it read: a commit between the snapshot and
                # store.meta makes the two differ, and the next call reads again
                self._top_cache[key] = ((store.token, meta.last_batch), pb.PartitionTop())
                self._top_cache[key][1].CopyFrom(r)
                if len(self._top_cache) > TOP_CACHE_SIZE:
                    self._top_cache.popitem(last=False)
        return reply

    async def Describe(self, request: pb.DescribeRequest, context: grpc.aio.ServicerContext
                       ) -> pb.DescribeReply:
        if request.coordinator:
            self.coordinator_at = time.monotonic()
        reply = pb.DescribeReply(server_id=self.server_id, address=self.address,
                                 draining=self.draining)
        for pid, held in self.partitions.held():
            meta = held.store.meta
            reply.partitions.add(job=pid.job, operator=pid.operator, partition=pid.partition,
                                 last_batch=meta.last_batch, watermark_ms=meta.watermark_ms,
                                 restoring=not held.ready.is_set(),
                                 epoch=self.partitions.epochs.get(pid.job, 0),
                                 follower=not held.owner, applied_ms=held.store.applied_ms)
        return reply
