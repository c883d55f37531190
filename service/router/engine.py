"""The read engine (``qstate._engine``, Rust) as one router process holds it, and what Python
pushes to it (docs/architecture.md §5, the seam): the bounds the router answers under, the
routing table (each operator's spec, each partition's owner and followers) whenever it
changes, how to reach shard servers (the cluster token, TLS), and the client tokens whenever
the tokens file changes. The co-located servers and their ready partitions go through
``qstate.router.local``.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from qstate._engine import Engine
from qstate.core.config import Settings
from qstate.core.transport.security import cluster_token
from qstate.core.transport.tokens import TokenBook, WatchedTokens
from qstate.router.routing import RoutingTable

__all__ = ["ENGINE_THREADS", "EngineLink"]

# the native front's threads: a point GET is a few µs of work in Rust, so a core or two hold
# tens of thousands a second, beside the router's Python and the shards' commits
ENGINE_THREADS = max(1, min(4, os.cpu_count() or 1))

Callers = tuple[str | None, bytes | None, str | None, float, int]


class EngineLink:
    """The engine of one router process, and what was pushed to it last (pushed again only
    when it changed)."""

    def __init__(self, scratch: Path, cfg: Settings) -> None:
        self.cfg = cfg
        self.engine = Engine(str(scratch), cfg.router_cache_mb << 20)
        self.engine.set_settings(cfg.max_batch_keys, cfg.max_windows, cfg.max_request_windows,
                                 cfg.min_batch_wait_s, cfg.retry_after_s, cfg.max_body_bytes,
                                 cfg.max_concurrent_requests, cfg.metrics_public)
        if cfg.router_follow_ms:
            self.engine.start_follower(cfg.router_follow_ms / 1000)
        self._callers: Callers | None = None
        self._book: TokenBook | None = None

    def push_table(self, routing: RoutingTable) -> None:
        """The routing table as the engine reads it (an operator it does not know, or a
        partition without an owner, it hands to Python), and how to reach its servers."""
        ops = []
        for (job, op), spec in routing.specs.items():
            a = routing.assignments.get(job)
            owners = [a.owner(op, p) if a is not None else None for p in range(spec.partitions)]
            followers = [a.follower_addresses(op, p) if a is not None else []
                         for p in range(spec.partitions)]
            ops.append((spec.to_json(), owners, followers))
        self.engine.set_table(ops)
        self.push_callers()

    def push_callers(self) -> None:
        """How the engine reaches shard servers for partitions elsewhere, as the router's own
        callers do (``qstate.core.transport.security``): the cluster token (read each time:
        the host's is made by the first shard on loopback), TLS to the shards."""
        cfg = self.cfg
        ca = Path(cfg.tls_ca).read_bytes() if cfg.tls_ca else None
        callers = (cluster_token(cfg) or None, ca, cfg.tls_server_name or None,
                   cfg.shard_timeout_s, cfg.max_shard_queue)
        if callers != self._callers:
            self.engine.set_callers(*callers)
            self._callers = callers

    async def push_tokens(self, book: WatchedTokens) -> None:
        """The tokens the engine checks, pushed when the file changes: the same book (read,
        checked and re-read by ``WatchedTokens`` at most once a ``every_s``), so a token
        removed from the file is refused by both paths within a second or so."""
        while True:
            current = book.book()
            if current is not self._book:
                self.engine.set_tokens(current.entries())
                self._book = current
            await asyncio.sleep(book.every_s)
