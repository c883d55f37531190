"""Pushed changes: the router's watch hub (docs/architecture.md §5, watch).

One hub per router. While anything is watched it asks the shard servers that own the
watched operators' partitions for their batches (one ``Describe`` per server every
``watch_poll_s``). A partition at a new batch has its watched keys read again (one batch
read of every key watched on this router, however many watchers share it), and each key
whose value changed goes to its watchers; a board (top-N) is read again when any partition of
its operator moved on, and goes to its watchers when its window or entries changed.

The same polling keeps the boards GETs ask for (``WatchHub.top``): a board asked for is
kept, re-read once per batch, for ``BOARD_KEPT_S`` after the last ask.

A watcher holds at most one pending change per key (a board: one), so a consumer slower than
the changes gets the latest values, flagged ``coalesced``, and costs no more memory than what
it watches; the hub never waits for a watcher. Every event carries a ``batch``: every change
up to it was sent, so a client resumes with ``from_batch`` set to it. A value of a later batch
may come in an event that says an earlier one (partitions commit one after another); once every
partition of the watcher's keys is read at that batch, an event says so, without changes if
none came since (``Watcher.complete``), as a board read mid-commit is pushed again whole. The
hub knows, for each key it tracks, since which batch it has watched it and the batch of its
last change: a resume from a batch it watched through sends only the keys changed after it,
else every value (``snapshot``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from qstate._engine import answer
from qstate.core.address import partition_of
from qstate.core.config import Settings
from qstate.core.errors import Overloaded, QStateError
from qstate.core.records.operator import OperatorSpec
from qstate.partition.ranking import check_top
from qstate.router.hits import Hit, Row
from qstate.router.metrics import (
    BOARD_ANSWERS,
    WATCH_COALESCED,
    WATCH_DELAY,
    WATCH_EVENTS,
    WATCH_FAILURES,
    WATCHERS,
)
from qstate.router.query import QueryService
from qstate.router.request import TopQuery, WatchQuery
from qstate.router.top import TopResult

__all__ = ["Push", "WatchClosed", "WatchHub", "Watcher"]

log = logging.getLogger(__name__)

READ_CHUNK = 1000  # keys per batch read of a feed's keys (a shard takes at most 10,000)
# A board asked for by GET (no watcher) is kept current this long after the last ask, and at
# most this many of them: a board many dashboards poll costs one read per batch, not one per
# poll (docs/architecture.md §5, watch)
BOARD_KEPT_S = 30.0
BOARDS_KEPT = 64


class WatchClosed(Exception):
    """The router is stopping: the stream ends (a client resumes elsewhere)."""


@dataclass(frozen=True, slots=True)
class Push:
    """What a watcher is sent: the keys that changed (keys form) or the board (top form)."""

    spec: OperatorSpec
    state: str
    batch: int  # every key (the board) is as of this batch or later; all changes up to it sent
    watermark_ms: int
    committed_ms: int  # when the shard applied the oldest batch whose change this carries
    coalesced: bool  # a value in between was replaced before this watcher took it
    snapshot: bool  # every watched key (the whole board): replace, do not merge
    changes: list[tuple[str, Hit]] = field(default_factory=list)
    top: TopResult | None = None
    descending: bool = True


@dataclass(slots=True)
class _Tracked:
    """One key watched on this router: its last value read, and since when it is known."""

    partition: int
    hit: Hit | None = None  # None: not read yet
    since: int = -1  # the batch of its first read: changes after it are all known
    changed_at: int = -1  # the batch at which it was last seen to change
    watchers: set[Watcher] = field(default_factory=set)


class _KeyFeed:
    """Every key of one state watched on this router."""

    def __init__(self, spec: OperatorSpec, state: str) -> None:
        self.spec = spec
        self.state = state
        self.tracked: dict[str, _Tracked] = {}
        self.read_at: dict[int, int] = {}  # partition -> the batch its keys were read at

    def respec(self, spec: OperatorSpec) -> None:
        """The operator was rescaled: its keys live in other partitions now."""
        self.spec = spec
        self.read_at.clear()
        for k, tr in self.tracked.items():
            tr.partition = partition_of(k, spec.partitions)

    def track(self, keys: Iterable[str], w: Watcher) -> None:
        for k in keys:
            tr = self.tracked.get(k)
            if tr is None:
                tr = self.tracked[k] = _Tracked(partition_of(k, self.spec.partitions))
            tr.watchers.add(w)

    def untrack(self, keys: Iterable[str], w: Watcher) -> None:
        for k in keys:
            tr = self.tracked.get(k)
            if tr is None:
                continue
            tr.watchers.discard(w)
            if not tr.watchers:
                del self.tracked[k]

    def update(self, key: str, h: Hit, committed_ms: int) -> None:
        tr = self.tracked.get(key)
        if tr is None:  # no longer watched
            return
        old = tr.hit
        if old is not None and h.batch < old.batch:  # a read older than one already applied
            return
        tr.hit = h
        if old is None:
            tr.since = tr.changed_at = h.batch
        elif old.found != h.found or old.windows != h.windows:
            tr.changed_at = h.batch
            for w in tr.watchers:
                w.offer(key, committed_ms)


class _TopFeed:
    """One board watched on this router."""

    def __init__(self, spec: OperatorSpec, q: TopQuery) -> None:
        self.spec = spec
        self.query = q
        self.board: TopResult | None = None
        self.seen: dict[int, int] = {}  # partition -> batch the board was read after
        self.watchers: set[Watcher] = set()
        self.asked_until = 0.0  # monotonic: kept for GETs until then (no watcher needed)
        # the last read after a partition moved succeeded: GETs may answer this board (while
        # the next read runs, it is one batch behind at most)
        self.current = False

    def update(self, r: TopResult, committed_ms: int) -> None:
        old = self.board
        if old is not None and r.batch < old.batch:
            return
        self.board = r
        self.current = True
        # pushed when it changed, and when a board read mid-commit (some partitions a batch
        # behind) is read again whole: its watchers then learn the batch it is complete at
        if old is None or (old.start, old.entries) != (r.start, r.entries) or (
                old.partial and r.batch > old.batch):
            for w in self.watchers:
                w.offer(None, committed_ms)


class Watcher:
    """One client's watch: what changed since it last took, coalesced. ``next()`` waits
    for the next event; the front end sends it."""

    def __init__(self, hub: WatchHub, q: WatchQuery, protocol: str) -> None:
        self.hub = hub
        self.q = q
        self.form = "top" if q.top is not None else "keys"
        self.protocol = protocol
        self.feed: _KeyFeed | _TopFeed | None = None
        self._pending: dict[str | None, int] = {}  # key (None: the board) -> committed ms
        self._snapshot = True
        self._coalesced = False
        self._ready = asyncio.Event()
        self._closed = False
        self.counted = False  # in the watchers gauge (open succeeded)
        # keys form: the batch its last event said, and the latest batch of a value that event
        # carried; greater: an event saying it is owed once every key is read there (complete)
        self.sent = -1
        self.owed = -1

    def offer(self, key: str | None, committed_ms: int) -> None:
        """A change of ``key`` (None: the board) applied at ``committed_ms``: the value is
        the feed's, taken when the watcher next takes."""
        if key in self._pending:
            self._coalesced = True
        self._pending[key] = committed_ms
        self._ready.set()

    def complete(self) -> None:
        """Keys form, some of its keys read again: when its last event carried a value of a
        batch later than the one it said, and every key is read at that batch now, an event
        says so (no change, unless one comes first): the watcher learns the batch its values
        are complete at, and resumes after it (docs/architecture.md §5, watch)."""
        feed = self.feed
        if self.owed <= self.sent or self._pending or not isinstance(feed, _KeyFeed):
            return  # nothing owed, or an event is coming anyway
        hits = [feed.tracked[k].hit for k in self.q.keys]
        if min((-1 if h is None else h.batch for h in hits), default=-1) >= self.owed:
            self.offer(None, 0)

    def _first(self, keys: list[str | None], snapshot: bool = True) -> None:
        """The first event: ``keys`` (None: the board), every one watched (``snapshot``) or
        those changed since a resumed batch."""
        self._pending = dict.fromkeys(keys, 0)
        self._snapshot = snapshot
        self._ready.set()

    def end(self) -> None:
        self._closed = True
        self._ready.set()

    async def next(self) -> Push:
        """The next event; raises WatchClosed when the router stops."""
        await self._ready.wait()
        if self._closed:
            raise WatchClosed
        self._ready.clear()
        pending, self._pending = self._pending, {}
        coalesced, self._coalesced = self._coalesced, False
        snapshot, self._snapshot = self._snapshot, False
        committed = min((c for c in pending.values() if c), default=0)
        feed = self.feed
        if isinstance(feed, _TopFeed):
            assert feed.board is not None
            b = feed.board
            ev = Push(feed.spec, feed.query.state, b.batch, b.watermark_ms, committed,
                      coalesced, True, top=b, descending=feed.query.descending)
        else:
            assert feed is not None
            tracked = [feed.tracked[k] for k in self.q.keys]
            hits = [t.hit for t in tracked if t.hit is not None]
            ev = Push(feed.spec, feed.state, min((h.batch for h in hits), default=-1),
                      min((h.watermark_ms for h in hits), default=0), committed, coalesced,
                      snapshot, [(k, h) for k in pending if k is not None
                                 and (h := feed.tracked[k].hit) is not None])
            self.sent = ev.batch
            self.owed = max((h.batch for _, h in ev.changes), default=-1)
        WATCH_EVENTS.labels(self.form).inc()
        if coalesced:
            WATCH_COALESCED.labels(self.form).inc()
        if committed:
            WATCH_DELAY.labels(self.form).observe(max(0.0, time.time() - committed / 1000))
        return ev

    def close(self) -> None:
        self.hub.close(self)


class WatchHub:
    def __init__(self, query: QueryService, poll_s: float, max_watchers: int,
                 max_keys: int, ping_s: float = 15.0) -> None:
        self.query = query
        self.poll_s = poll_s
        self.ping_s = ping_s  # how often an SSE front end pings a quiet stream
        self.max_watchers = max_watchers
        self.max_keys = max_keys
        self._keys: dict[tuple[str, str, str], _KeyFeed] = {}
        self._tops: dict[TopQuery, _TopFeed] = {}
        self._watchers: set[Watcher] = set()
        self._loop: asyncio.Task[None] | None = None
        self._stopping = False

    @classmethod
    def of(cls, query: QueryService, cfg: Settings) -> WatchHub:
        """A hub under ``cfg``'s bounds (QSTATE_WATCH_POLL_S, QSTATE_MAX_WATCHERS,
        QSTATE_MAX_WATCH_KEYS, QSTATE_WATCH_PING_S)."""
        return cls(query, cfg.watch_poll_s, cfg.max_watchers, cfg.max_watch_keys,
                   cfg.watch_ping_s)

    def watch_query(self, job: str, operator: str, state: str, keys: Iterable[str] = (),
                    top_n: int | None = None, descending: bool = True,
                    from_batch: int | None = None) -> WatchQuery:
        """The subscription under this router's bounds (QSTATE_MAX_WATCH_KEYS,
        QSTATE_MAX_TOP_N)."""
        return WatchQuery.of(job, operator, state, tuple(keys), top_n, descending, from_batch,
                             max_keys=self.max_keys, max_n=self.query.max_top_n)

    async def open(self, q: WatchQuery, protocol: str) -> Watcher:
        """A watcher whose first event (every key's value, or what changed after
        ``from_batch``; or the board) is ready at once. Raises Overloaded beyond
        ``max_watchers`` or once the router is stopping, the read's error when the first
        read fails."""
        if self._stopping:
            # a client whose watch just ended must not resume here, on the history of a
            # router about to go: its resume is answered by the next one (docs/architecture.md
            # §5, watch: a router that starts cannot tell what changed, so a snapshot)
            raise Overloaded("this router is stopping: resume the watch on another router, "
                             "or on this one once it is back",
                             retry_after_s=self.query.retry_after_s)
        if len(self._watchers) >= self.max_watchers:
            raise Overloaded(f"this router has {self.max_watchers} watches open "
                             "(QSTATE_MAX_WATCHERS); retry later or ask another router",
                             retry_after_s=self.query.retry_after_s)
        w = Watcher(self, q, protocol)
        self._watchers.add(w)
        try:
            spec = await self.query.spec(q.job, q.operator, q.state)
            if q.top is not None:
                await self._open_top(w, spec, q.top)
            else:
                await self._open_keys(w, spec, q)
        except BaseException:
            self.close(w)
            raise
        WATCHERS.labels(w.form, protocol).inc()
        w.counted = True
        self._start()
        return w

    async def _open_keys(self, w: Watcher, spec: OperatorSpec, q: WatchQuery) -> None:
        feed = self._keys.get((q.job, q.operator, q.state))
        if feed is None:
            feed = self._keys[(q.job, q.operator, q.state)] = _KeyFeed(spec, q.state)
        w.feed = feed
        feed.track(q.keys, w)
        unread = [k for k in q.keys if feed.tracked[k].hit is None]
        if unread:
            await self._read(feed, unread, {})
        tracked = [feed.tracked[k] for k in q.keys]
        b = q.from_batch
        now = min((t.hit.batch for t in tracked if t.hit is not None), default=-1)
        if b is None or b > now or any(t.since > b for t in tracked):
            w._first(list(q.keys))  # every value: this router cannot tell what changed
        else:
            w._first([k for k, t in zip(q.keys, tracked, strict=True) if t.changed_at > b],
                     snapshot=False)

    async def _open_top(self, w: Watcher, spec: OperatorSpec, q: TopQuery) -> None:
        check_top(spec, q.state)  # a 400 now, not a stream that never answers
        feed = self._tops.get(q)
        if feed is None:
            feed = self._tops[q] = _TopFeed(spec, q)
        w.feed = feed
        feed.watchers.add(w)
        if feed.board is None:
            feed.update(await self.query.top(q), 0)
        w._first([None])

    async def top(self, q: TopQuery) -> TopResult:
        """A GET's board: from the one kept current by the polling (at most one poll and one
        read behind the newest commit, as of the batch it says), or read now: a ``min_batch``
        or a window named, a board not kept yet (then kept ``BOARD_KEPT_S``), or one whose
        last refresh failed (the answer is then that failure, never an old board)."""
        if q.start_ms is not None or q.savepoint is not None:  # not kept: read as asked
            return await self.query.top(q)
        if q.min_batch is not None:
            r = await self.query.top(q)
            kept = self._tops.get(replace(q, min_batch=None))
            if kept is not None and kept.board is not None and r.batch > kept.board.batch:
                kept.update(r, 0)  # a later GET never answers a board older than this one
            return r
        feed = self._tops.get(q)
        if feed is not None and feed.board is not None and feed.current:
            feed.asked_until = time.monotonic() + BOARD_KEPT_S
            BOARD_ANSWERS.labels("kept").inc()
            return feed.board
        r = await self.query.top(q)
        BOARD_ANSWERS.labels("read").inc()
        if feed is None and sum(not f.watchers for f in self._tops.values()) < BOARDS_KEPT:
            spec = await self.query.spec(q.job, q.operator, q.state)
            feed = self._tops[q] = _TopFeed(spec, q)
            self._start()
        if feed is not None:
            feed.asked_until = time.monotonic() + BOARD_KEPT_S
            if feed.board is None or r.batch >= feed.board.batch:
                feed.update(r, 0)
        return r

    def _start(self) -> None:
        if self._loop is None or self._loop.done():
            self._loop = asyncio.create_task(self._run())

    def close(self, w: Watcher) -> None:
        if w not in self._watchers:
            return
        self._watchers.discard(w)
        if w.counted:
            WATCHERS.labels(w.form, w.protocol).dec()
        feed = w.feed
        if isinstance(feed, _KeyFeed):
            feed.untrack(w.q.keys, w)
            if not feed.tracked:
                self._keys.pop((feed.spec.job, feed.spec.operator, feed.state), None)
        elif isinstance(feed, _TopFeed):
            feed.watchers.discard(w)
            if not feed.watchers and feed.asked_until < time.monotonic():
                self._tops.pop(feed.query, None)
        w.end()

    async def stop(self) -> None:
        """Ends every watch (the router is stopping) and the polling; refuses new ones."""
        self._stopping = True
        for w in list(self._watchers):
            w.end()
        if self._loop is not None:
            self._loop.cancel()

    # ---- the loop ---------------------------------------------------------------------
    async def _run(self) -> None:
        while self._keys or self._tops:
            t0 = time.monotonic()
            try:
                await self._tick()
            except asyncio.CancelledError:
                raise
            except Exception:  # never the end of every watch: the next tick tries again
                log.exception("watch tick failed")
                WATCH_FAILURES.labels("tick").inc()
            await asyncio.sleep(max(0.0, self.poll_s - (time.monotonic() - t0)))

    async def _batches(self, ops: set[tuple[str, str]]
                       ) -> dict[tuple[str, str], dict[int, tuple[int, int]]]:
        """Each watched operator's partitions: (batch, applied ms) as their owners say."""
        return {op: {p: (i.last_batch, i.applied_ms) for p, i in infos.items()}
                for op, infos in (await self.query.serving(ops, self.poll_s)).items()}

    async def _tick(self) -> None:
        now_s = time.monotonic()
        for q, f in list(self._tops.items()):  # boards no one watches or asks for any more
            if not f.watchers and f.asked_until < now_s:
                del self._tops[q]
        ops = {(s.job, s.operator) for s in
               [f.spec for f in self._keys.values()] + [f.spec for f in self._tops.values()]}
        batches = await self._batches(ops)
        work = []
        specs = self.query.routing.specs
        for feed in list(self._keys.values()):
            spec = specs.get((feed.spec.job, feed.spec.operator))
            if spec is not None and spec.partitions != feed.spec.partitions:
                feed.respec(spec)
            now = batches.get((feed.spec.job, feed.spec.operator), {})  # {}: opened since
            moved = {p for p, (b, _) in now.items() if b > feed.read_at.get(p, -1)}
            keys = [k for k, t in feed.tracked.items() if t.partition in moved]
            if keys:
                work.append(self._read(feed, keys, now))
        for top in list(self._tops.values()):
            now = batches.get((top.spec.job, top.spec.operator), {})
            if len(now) < top.spec.partitions:
                # an owner did not answer, or a partition restores: GETs read for themselves
                # (and get its 503, or a follower's answer if they allow one), as point reads do
                top.current = False
                continue
            if not top.seen and top.board is not None:  # kept from a GET: read as of this
                top.seen = dict.fromkeys(now, top.board.batch)
            if not top.current or any(b > top.seen.get(p, -1) for p, (b, _) in now.items()):
                work.append(self._read_top(top, now))
        for failed in await asyncio.gather(*work, return_exceptions=True):
            if isinstance(failed, QStateError):  # a 503 of a partition: the next tick
                log.debug("watch read failed: %s", failed)
                WATCH_FAILURES.labels("read").inc()
            elif isinstance(failed, BaseException):
                raise failed

    async def _read(self, feed: _KeyFeed, keys: list[str],
                    now: dict[int, tuple[int, int]]) -> None:
        """Read ``keys`` again and pass on the changes; ``now``: the partitions' batches and
        apply times as their owners said."""
        spec = feed.spec
        engine = self.query.engine
        step = min(READ_CHUNK, self.query.max_batch_keys)  # what one batch read may ask
        for i in range(0, len(keys), step):
            chunk = keys[i:i + step]
            # from the owners, not co-located secondaries: a batch moves every partition,
            # and catching each secondary up held the loop 100-450 ms (§5, watch)
            def ask(loop: Any, fut: Any, chunk: list[str] = chunk) -> Any:
                return engine.read(spec.job, spec.operator, feed.state, chunk, False, loop, fut)

            got = await answer(ask)
            hits = [(k, Hit(f, b, w, [Row(*r) for r in rows], n))
                    for k, (f, b, w, rows, n) in zip(chunk, got, strict=True)]
            read: dict[int, int] = {}
            for k, h in hits:
                tr = feed.tracked.get(k)
                if tr is None:
                    continue
                feed.update(k, h, now.get(tr.partition, (0, 0))[1])
                read[tr.partition] = min(read.get(tr.partition, h.batch), h.batch)
            feed.read_at.update(read)
            for w in {w for k, _ in hits if (tr := feed.tracked.get(k)) for w in tr.watchers}:
                w.complete()

    async def _read_top(self, top: _TopFeed, now: dict[int, tuple[int, int]]) -> None:
        moved = [a for p, (b, a) in now.items() if b > top.seen.get(p, -1) and a]
        try:
            r = await self.query.top(top.query)
        except QStateError:
            top.current = False  # until a read succeeds again, GETs read for themselves
            raise
        top.seen = {p: b for p, (b, _) in now.items()}
        top.update(r, min(moved, default=0))
