"""How qstate processes fork: only to exec a child (``subprocess``), never to go on running
Python in the copy. gRPC's fork handlers exist for the other kind; for fork + exec they only
add a risk: a handler that runs in the child between the two can abort it (a router the test
session started died with SIGABRT in CI: ``Check failed: next_worker->state == KICKED``,
after ``Other threads are currently calling into gRPC, skipping fork() handlers``). gRPC's
own advice for processes that always exec after fork is ``GRPC_ENABLE_FORK_SUPPORT=false``
(grpc/grpc, doc/fork_support.md). It is read when gRPC starts (the first channel or
server), so it is set first thing: by ``qstate.cli.main`` and the test session."""

from __future__ import annotations

import os

__all__ = ["FORK_SUPPORT", "exec_only_forks"]

FORK_SUPPORT = "GRPC_ENABLE_FORK_SUPPORT"


def exec_only_forks() -> None:
    """Tell gRPC this process forks only to exec (its children inherit it); a value the
    environment already sets is kept."""
    os.environ.setdefault(FORK_SUPPORT, "false")
