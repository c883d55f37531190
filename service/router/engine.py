"""The read engine (``qstate._engine``, Rust) as one router process holds it, and what Python
pushes to it (docs/architecture.md §5, the seam): the settings the router runs with (the
engine has no defaults of its own), the routing table (each operator's spec, each partition's
owner and followers) whenever it changes, how to reach shard servers (the cluster token, TLS),
the client tokens whenever the tokens file changes; and the control plane's half of a refresh
the read core asks for (an operator it does not know, a partition without an owner or one
that moved). The co-located servers and their ready partitions go through
``qstate.router.local``.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from qstate._engine import Engine
from qstate.core.config import Settings, engine_settings
from qstate.core.cpus import usable_cpus
from qstate.core.transport.security import cluster_token
from qstate.core.transport.tokens import TokenBook, WatchedTokens
from qstate.router.metrics import add_engine_counts
from qstate.router.routing import RoutingTable

__all__ = ["ENGINE_THREADS", "EngineLink"]

log = logging.getLogger(__name__)

# the native front's threads: a point GET is a few µs of work in Rust, so a core or two hold
# tens of thousands a second, beside the router's Python and the shards' commits; never more
# than the cores the process may use (more only add wake-ups between them: qstate.core.cpus)
ENGINE_THREADS = min(4, usable_cpus())

Callers = tuple[str | None, bytes | None, str | None]
SYNC_S = 0.5  # how often the engine's counts reach /metrics

class EngineLink:
    """The engine of one router process, and what was pushed to it last (pushed again only
    when it changed)."""

    def __init__(self, scratch: Path, cfg: Settings) -> None:
        self.cfg = cfg
        self.engine = Engine(str(scratch), cfg.router_cache_mb << 20, engine_settings(cfg))
        if cfg.router_follow_ms:
            self.engine.start_follower(cfg.router_follow_ms / 1000)
        self._callers: Callers | None = None
        self._book: TokenBook | None = None
        self._refreshing: set[asyncio.Task[None]] = set()

    def follow(self, routing: RoutingTable) -> None:
        """Keep the engine's table as ``routing``'s (pushed now and at each change), and answer
        the refreshes the engine asks for (from its threads) on this loop."""
        routing.on_change = lambda: self.push_table(routing)
        self.push_table(routing)
        loop = asyncio.get_running_loop()

        async def refresh(force: bool) -> None:
            try:
                await routing.refresh(force=force)
            finally:
                self.engine.refreshed()

        def asked(force: bool) -> None:
            task = loop.create_task(refresh(force))
            self._refreshing.add(task)  # held until done: a task nobody holds may vanish
            task.add_done_callback(self._refreshing.discard)

        self.engine.set_refresher(lambda force: loop.call_soon_threadsafe(asked, force))

    def push_table(self, routing: RoutingTable) -> None:
        """The routing table as the engine reads it, and how to reach its servers."""
        ops = []
        # each partition's owner as answers name it (qstate-owner): its id and a router on
        # its node (§5, cluster map)
        named: list[tuple[str, str, list[tuple[str, str] | None]]] = []
        read_at = routing.read_at()
        for (job, op), spec in routing.specs.items():
            a = routing.assignments.get(job)
            owners = [a.owner(op, p) if a is not None else None for p in range(spec.partitions)]
            followers = [a.follower_addresses(op, p) if a is not None else []
                         for p in range(spec.partitions)]
            ops.append((spec.to_json(), owners, followers))
            ids = [a.owner_id(op, p) if a is not None else None for p in range(spec.partitions)]
            named.append((job, op, [
                None if sid is None else (sid, read_at[sid][0].url if read_at.get(sid) else "")
                for sid in ids]))
        # a server's live reads go to its reader when it registered one (§5, cluster reads)
        readers = [(i.address, i.reader) for i in routing.servers if i.reader]
        self.engine.set_table(ops, str(routing.storage.root), routing.disclose_jobs, readers,
                              named)
        self.push_callers()

    def push_callers(self) -> None:
        """How the engine reaches shard servers, as the router's own callers do
        (``qstate.core.transport.security``): the cluster token (read each time: the host's is
        made by the first shard on loopback), TLS to the shards."""
        cfg = self.cfg
        ca = Path(cfg.tls_ca).read_bytes() if cfg.tls_ca else None
        callers = (cluster_token(cfg) or None, ca, cfg.tls_server_name or None)
        if callers != self._callers:
            self.engine.set_callers(*callers)
            self._callers = callers

    def counted(self, app: Any) -> Any:
        """``app``, whose /metrics first takes what the engine counted (an answer's series
        are then up to date when it is scraped right after)."""
        async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] == "http" and scope["path"] == "/metrics":
                self.take_counts()
            await app(scope, receive, send)

        return asgi

    def take_counts(self) -> None:
        """What the engine counted since, added to the router's series."""
        add_engine_counts(self.engine.take_metrics())

    async def sync_counts(self) -> None:
        """The engine's counts added every ``SYNC_S`` (for the other ``--workers``' scrapes)."""
        while True:
            await asyncio.sleep(SYNC_S)
            self.take_counts()

    async def push_tokens(self, book: WatchedTokens) -> None:
        """The tokens the engine checks, pushed when the file changes: the book ``WatchedTokens``
        reads, checks and re-reads at most once a ``every_s``, so a token removed from the file
        is refused within a second or so."""
        while True:
            current = book.book()
            if current is not self._book:
                self.engine.set_tokens(current.entries())
                self._book = current
            await asyncio.sleep(book.every_s)
