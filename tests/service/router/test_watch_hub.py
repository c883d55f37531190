"""The watch hub's bookkeeping, one module alone (``qstate.router.watch``): what a watcher is
sent when its consumer is slower than the changes, and what a read that comes late does. The
end-to-end behaviour over real routers and shards is ``test_watch.py``."""

from __future__ import annotations

import asyncio

import pytest

from qstate.router.hits import Hit, Row
from qstate.router.request import WatchQuery
from qstate.router.top import Ranked, TopResult
from qstate.router.watch import Watcher, WatchHub, _KeyFeed, _TopFeed
from tests.shop import SPEC

KEYS = ("a", "b", "c")


def _hit(batch: int, value: int) -> Hit:
    return Hit(True, batch, batch * 1000, [Row(0, 60_000, value)])


@pytest.fixture
def feed() -> tuple[_KeyFeed, Watcher, Watcher]:
    hub = WatchHub(None, 0.05, 10, 10)  # type: ignore[arg-type]  # never polls here
    f = _KeyFeed(SPEC, "views")
    q = WatchQuery.of("shop", "views_1m", "views", KEYS, max_keys=10, max_n=10)
    slow, fast = Watcher(hub, q, "http"), Watcher(hub, q, "grpc")
    for w in (slow, fast):
        w.feed = f
        f.track(KEYS, w)
    for k in KEYS:
        f.update(k, _hit(1, 10), 0)
    for w in (slow, fast):
        w._first(list(KEYS))
    return f, slow, fast


def _next(w: Watcher, timeout: float = 1.0):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(w.next(), timeout))


def test_a_slow_watcher_gets_each_key_once_at_its_latest_value_flagged(feed) -> None:  # type: ignore[no-untyped-def]
    f, slow, fast = feed
    assert _next(slow).snapshot and _next(fast).snapshot
    f.update("a", _hit(2, 11), 2000)
    ev = _next(fast)  # the fast one takes batch 2 ...
    assert [(k, h.windows[0].value) for k, h in ev.changes] == [("a", 11)]
    assert not ev.coalesced and ev.committed_ms == 2000
    f.update("a", _hit(3, 12), 3000)
    f.update("b", _hit(3, 20), 3000)
    f.update("a", _hit(4, 13), 4000)
    f.update("b", _hit(4, 20), 4000)  # the same values: not changes
    f.update("c", _hit(4, 10), 4000)
    ev = _next(slow)  # ... the slow one takes them all at once
    assert {k: h.windows[0].value for k, h in ev.changes} == {"a": 13, "b": 20}
    assert ev.coalesced and not ev.snapshot and ev.batch == 4
    assert ev.committed_ms == 3000  # the oldest change it carries: b's
    ev = _next(fast)
    assert {k: h.windows[0].value for k, h in ev.changes} == {"a": 13, "b": 20}
    assert ev.coalesced  # a's 12 was replaced before it took it
    with pytest.raises(TimeoutError):  # nothing more: no change, no event
        _next(slow, 0.1)


def test_a_read_older_than_the_value_held_changes_nothing(feed) -> None:  # type: ignore[no-untyped-def]
    f, slow, _ = feed
    _next(slow)
    f.update("a", _hit(5, 50), 5000)
    f.update("a", _hit(4, 40), 4000)  # answered late (a follower a batch behind)
    ev = _next(slow)
    assert [(k, h.batch, h.windows[0].value) for k, h in ev.changes] == [("a", 5, 50)]
    assert f.tracked["a"].changed_at == 5


def test_keys_no_one_watches_are_forgotten(feed) -> None:  # type: ignore[no-untyped-def]
    f, slow, fast = feed
    f.untrack(KEYS, slow)
    assert set(f.tracked) == set(KEYS)
    f.untrack(KEYS, fast)
    assert f.tracked == {}


def _board(batch: int, newest: int, entries: list[tuple[str, int]]) -> TopResult:
    return TopResult(SPEC, "views", 60_000, 120_000, batch, batch * 1000,
                     [Ranked(k, v) for k, v in entries], newest)


def test_a_board_read_mid_commit_is_pushed_again_once_whole() -> None:
    """A board read while some partitions were a batch behind says the lower batch; read
    again whole with the same rows, its watchers are told the batch it is complete at. A
    whole board read again unchanged is not pushed."""
    hub = WatchHub(None, 0.05, 10, 10)  # type: ignore[arg-type]  # never polls here
    q = WatchQuery.of("shop", "views_1m", "views", top_n=2, max_keys=10, max_n=10)
    assert q.top is not None
    f = _TopFeed(SPEC, q.top)
    w = Watcher(hub, q, "http")
    w.feed = f
    f.watchers.add(w)
    rows = [("a", 9), ("b", 7)]
    f.update(_board(6, 7, rows), 0)  # partitions at 6 and 7
    w._first([None])
    assert _next(w).top.batch == 6
    f.update(_board(7, 7, rows), 7000)  # the same rows, every partition at 7
    assert _next(w).top.batch == 7
    f.update(_board(8, 8, rows), 8000)  # whole before, the same rows: nothing to tell
    with pytest.raises(TimeoutError):
        _next(w, 0.1)
