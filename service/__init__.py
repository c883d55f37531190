"""qstate: queryable state for Spark Structured Streaming.

``from qstate import Client, AsyncClient`` reads a router (``qstate.client``); every error a
client or server raises is in ``qstate.errors``, under one root, ``QStateError``. The servers,
jobs and commands (``qstate.shard``, ``qstate.router``, ``qstate.jobs``, ``qstate.cli``) need
the ``qstate[server]`` install; the client needs only the base one (docs/architecture.md §10).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from qstate.client import AsyncClient, Client
    from qstate.core.errors import QStateError

__all__ = ["AsyncClient", "Client", "QStateError"]


def __getattr__(name: str) -> Any:
    # Loaded on first use: a shard or a Spark worker importing qstate.core.* should not pay
    # for the HTTP client
    if name in ("Client", "AsyncClient"):
        from qstate import client

        return getattr(client, name)
    if name == "QStateError":
        from qstate.core.errors import QStateError

        return QStateError
    raise AttributeError(f"module 'qstate' has no attribute {name!r}")
