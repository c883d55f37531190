"""Deterministic fault injection: a process kills itself with SIGKILL at a named step of one
batch, so a chaos test knows exactly what was in flight when it died.

    QSTATE_FAULT=shard.after-write@12                  # the first Commit(12) it writes
    QSTATE_FAULT=shard.after-write@12:per_tweet_1h     # only that operator's Commit(12)
    QSTATE_FAULT=driver.after-commit@7:per_tweet_1h

The setting (``qstate.core.config``, ``fault``) is read once when ``qstate shard`` or
``qstate job`` starts (``arm``): a typo fails there, not at batch N. Off (the default), every
fault point costs one function call and a ``None`` check. Only the process that arms it can
die: Spark's Python workers never do (the driver steps run in the driver process).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
from dataclasses import dataclass
from typing import Final, NoReturn

from qstate.core.address import check_name
from qstate.core.errors import InvalidRequest

__all__ = ["POINTS", "Fault", "arm", "armed", "at", "die", "hit", "parse"]

log = logging.getLogger(__name__)

# point -> what has happened to batch N when the process dies there
POINTS: Final[dict[str, str]] = {
    "shard.received": "a shard received Commit(N) and wrote nothing",
    "shard.after-write": "a shard wrote N to RocksDB (every partition of the call) and has "
                         "not replied",
    "shard.after-ack": "a shard's reply to Commit(N) went out (the RPC is done)",
    "driver.after-deltas": "the driver has N's delta files, no manifest (N-1 acknowledged)",
    "driver.after-record": "the driver wrote N's manifest and sent no Commit(N)",
    "driver.after-commit": "every shard acknowledged N; foreachBatch(N) has not returned, so "
                           "Spark has not committed N",
    "savepoint.after-pending": "`qstate savepoint create` wrote the pending record of a "
                               "savepoint at batch N and has not checked its files",
    # the router's read engine: a panic, caught, instead of a kill (docs/architecture.md §5)
    "router.read-panic": "a router's read of a partition at batch N panics in the read "
                         "engine: the request is answered 500 (EngineFailed) and the router "
                         "goes on answering",
    "router.accept-panic": "the router's native front panics handing out its Nth connection "
                           "(N counts connections, not batches): that connection is closed, "
                           "the front goes on accepting",
}

_FORMAT = re.compile(r"(?P<point>[a-z.-]+)@(?P<batch>\d+)(?::(?P<operator>.+))?")


@dataclass(frozen=True)
class Fault:
    point: str
    batch: int
    operator: str | None = None  # None: any operator

    def matches(self, point: str, batch: int, operator: str) -> bool:
        return (self.point == point and self.batch == batch
                and (self.operator is None or self.operator == operator))

    def __str__(self) -> str:
        return f"{self.point}@{self.batch}" + (f":{self.operator}" if self.operator else "")


def parse(text: str) -> Fault | None:
    """``POINT@BATCH[:OPERATOR]``, or None for an empty setting; raises ``InvalidRequest``
    naming what is wrong."""
    text = text.strip()
    if not text:
        return None
    usage = f"expected POINT@BATCH[:OPERATOR] with POINT one of {', '.join(POINTS)}"
    m = _FORMAT.fullmatch(text)
    if m is None:
        raise InvalidRequest(f"QSTATE_FAULT={text!r}: {usage}")
    if m["point"] not in POINTS:
        raise InvalidRequest(f"QSTATE_FAULT={text!r}: unknown point {m['point']!r}; {usage}")
    operator = m["operator"]
    if operator is not None:
        try:
            check_name("operator", operator)
        except InvalidRequest as exc:
            raise InvalidRequest(f"QSTATE_FAULT={text!r}: {exc.message}") from None
    return Fault(m["point"], int(m["batch"]), operator)


_armed: Fault | None = None


def arm(text: str) -> Fault | None:
    """Parse the setting and make it this process's fault (None: off)."""
    global _armed
    _armed = parse(text)
    if _armed is not None:
        log.warning("fault armed: this process kills itself at %s (%s)", _armed,
                    POINTS[_armed.point])
    return _armed


def armed() -> Fault | None:
    return _armed


def at(point: str, batch: int, operator: str) -> bool:
    """Whether this process's fault is this step of this batch (for a step that must first
    finish something, e.g. wait for acknowledgements, and then ``die``)."""
    return _armed is not None and _armed.matches(point, batch, operator)


def hit(point: str, batch: int, operator: str) -> None:
    """A fault point: dies here when the armed fault names it."""
    if _armed is not None and _armed.matches(point, batch, operator):
        die()


def die() -> NoReturn:
    """One log line, then SIGKILL to this process: no clean-up, as in a crash."""
    log.warning("fault %s: killing this process (pid %d) with SIGKILL", _armed, os.getpid())
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable: SIGKILL was sent")  # pragma: no cover
