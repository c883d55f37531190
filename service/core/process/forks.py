"""How qstate processes fork: only to exec a child (``subprocess``), never to go on running
Python in the copy. gRPC's fork handlers exist for the other kind; for fork + exec they only
add a risk: a handler that runs in the child between the two can abort it (routers the test
session started died with SIGABRT in CI: ``Check failed: next_worker->state == KICKED``,
after ``Other threads are currently calling into gRPC, skipping fork() handlers``). gRPC's
own advice for processes that always exec after fork is ``GRPC_ENABLE_FORK_SUPPORT=false``
(grpc/grpc, doc/fork_support.md).

gRPC reads it when ``grpc`` is first imported, and ``qstate.core.errors`` imports it, so
importing this module sets it (a value the environment already sets is kept): ``qstate.cli``
and the test session import it before anything else of qstate. Children inherit it."""

from __future__ import annotations

import os

__all__ = ["FORK_SUPPORT"]

FORK_SUPPORT = "GRPC_ENABLE_FORK_SUPPORT"

os.environ.setdefault(FORK_SUPPORT, "false")
