"""The requests the router's Python answers, checked once from what a request says: a top-N
(``TopQuery``) and a watch (``WatchQuery``). A read of keys is the read core's (its ``Ask``,
``engine/core/src/read/ask.rs``); these checks word ``min_batch`` and a savepoint as it does."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from qstate.core.address import check_key, check_name
from qstate.core.errors import InvalidRequest

__all__ = ["TopQuery", "WatchQuery", "check_min_batch", "check_savepoint"]


def check_min_batch(min_batch: int | None) -> int | None:
    if min_batch is not None and not 0 <= min_batch < 2**63:
        raise InvalidRequest(f"'min_batch' is {min_batch}: a batch number, 0 or more")
    return min_batch


def check_savepoint(savepoint: str | None, min_batch: int | None) -> str | None:
    if savepoint is not None:
        check_name("savepoint name", savepoint)
        if min_batch is not None:
            raise InvalidRequest("'min_batch' and 'savepoint' together: a savepoint is as of "
                                 "its own batch; ask one or the other")
    return savepoint


@dataclass(frozen=True, slots=True)
class TopQuery:
    """The ``n`` keys of one state with the largest (``descending``) or smallest values in
    one window across every partition, ties by key."""

    job: str
    operator: str
    state: str
    n: int
    descending: bool = True
    start_ms: int | None = None  # the window starting here; None: the current one
    min_batch: int | None = None  # every partition, as in StateQuery
    savepoint: str | None = None  # as in StateQuery
    # a follower may answer a partition whose owner cannot, as of its batch (as a key read's)
    allow_stale: bool = False

    @classmethod
    def of(cls, job: str, operator: str, state: str, n: int | None, descending: bool = True,
           start_ms: int | None = None, *, max_n: int,
           min_batch: int | None = None, savepoint: str | None = None,
           allow_stale: bool = False) -> TopQuery:
        """The query, or the InvalidRequest (400) that says what to fix."""
        check_name("job", job)
        check_name("operator", operator)
        check_name("state", state)
        if n is None:
            n = min(10, max_n)
        if not 1 <= n <= max_n:
            raise InvalidRequest(f"'n' is {n}: ask for 1 to {max_n} keys (QSTATE_MAX_TOP_N)")
        return cls(job, operator, state, n, descending, start_ms, check_min_batch(min_batch),
                   check_savepoint(savepoint, min_batch), allow_stale)


@dataclass(frozen=True, slots=True)
class WatchQuery:
    """A subscription: the latest window of each of ``keys``, or the board of ``top`` (its
    current window), pushed when they change; ``from_batch`` resumes after that batch."""

    job: str
    operator: str
    state: str
    keys: tuple[str, ...] = ()
    top: TopQuery | None = None
    from_batch: int | None = None

    @classmethod
    def of(cls, job: str, operator: str, state: str, keys: Sequence[str] = (),
           top_n: int | None = None, descending: bool = True,
           from_batch: int | None = None, *, max_keys: int, max_n: int) -> WatchQuery:
        """The subscription, or the InvalidRequest (400) that says what to fix: keys or a
        top n, not both, not neither; at most ``max_keys`` distinct keys."""
        if bool(keys) == (top_n is not None):
            raise InvalidRequest("watch either keys (key=...) or a top-N board (top=N), "
                                 "one of the two")
        if from_batch is not None and not -1 <= from_batch < 2**63:
            raise InvalidRequest(f"'from_batch' is {from_batch}: a batch number, -1 or more")
        top = None
        if top_n is not None:
            top = TopQuery.of(job, operator, state, top_n, descending, max_n=max_n)
        uniq = tuple(dict.fromkeys(keys))
        if len(uniq) > max_keys:
            raise InvalidRequest(f"{len(uniq)} keys: one watch names at most {max_keys} "
                                 "(QSTATE_MAX_WATCH_KEYS); open several")
        check_name("job", job)
        check_name("operator", operator)
        check_name("state", state)
        for k in uniq:
            check_key(k)
        return cls(job, operator, state, uniq, top, from_batch)
