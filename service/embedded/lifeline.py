"""Children that die with their parent, and ports an earlier run still holds.

A process qstate starts (a broker, a shard, a router, a job, a generator) gets SIGKILL from
the kernel when the process that started it dies, however it dies: ``kill -9``, the OOM
killer, a closed session (``PR_SET_PDEATHSIG``, Linux). A job's Spark JVM then sees its stdin
close and exits, and Spark's Python daemon follows its JVM the same way, so nothing of a run
outlives it (docs/architecture.md §6). Elsewhere than Linux, children are stopped only by a
parent that lives to stop them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import psutil

__all__ = ["Holder", "adopt_descendants", "die_with_parent", "holders"]

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
# loaded here, in the parent: the child between fork and exec only calls it
_prctl: Callable[..., int] | None = None
if sys.platform.startswith("linux"):
    try:
        _prctl = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):  # no libc to call: children are stopped by the parent
        log.warning("prctl is not available: children will not die with a killed parent")


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child gets SIGKILL when the thread that
    starts it exits (so start children from a thread that lives as long as the parent: the
    main thread), and exits at once if the parent is already gone. None off Linux."""
    prctl = _prctl
    if prctl is None:
        return None
    parent = os.getpid()

    def child() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the line above
            os._exit(1)

    return child


def adopt_descendants(on_parent_death: int) -> bool:
    """This process adopts its descendants whose parent dies (a child subreaper: they are
    re-parented here, not to init) and gets signal ``on_parent_death`` when its own parent
    dies (for ``qstate.embedded.guard``, which then stops them). False off Linux, or when
    the parent is gone already."""
    prctl = _prctl
    if prctl is None:
        return False
    parent = os.getppid()
    if prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) or prctl(
            _PR_SET_PDEATHSIG, on_parent_death, 0, 0, 0):
        return False
    return os.getppid() == parent and parent != 1


@dataclass(frozen=True)
class Holder:
    """A process listening on a port someone else needs."""

    port: int
    pid: int | None  # None: a process this user cannot see
    command: str

    def __str__(self) -> str:
        if self.pid is None:
            return f"port {self.port} is held by a process this user cannot see"
        return f"port {self.port} is held by pid {self.pid} ({self.command}): kill {self.pid}"


def holders(ports: Iterable[int]) -> list[Holder]:
    """Who listens on each of ``ports`` (TCP, any address), for a message that says what to
    stop instead of a child that exits with 'address already in use'."""
    wanted = set(ports)
    found: dict[int, Holder] = {}
    try:
        conns = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:  # macOS without root: the children say it themselves
        log.info("cannot list the sockets of other processes: ports not checked")
        return []
    for conn in conns:
        if conn.status != psutil.CONN_LISTEN or not conn.laddr or conn.laddr.port not in wanted:
            continue
        command = ""
        if conn.pid is not None:
            try:
                command = " ".join(psutil.Process(conn.pid).cmdline())[:160]
            except psutil.Error:
                command = "?"
        found.setdefault(conn.laddr.port, Holder(conn.laddr.port, conn.pid, command))
    return [found[p] for p in sorted(found)]
