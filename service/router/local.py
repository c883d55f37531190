"""In-process reads of partitions whose shard server runs on this host
(docs/architecture.md §5), through the read engine (``qstate._engine``, Rust).

A unary Python gRPC hop costs ~280 µs of CPU a side; a RocksDB read ~2 µs. For a shard on
the same host the engine opens each partition as a RocksDB *secondary* instance and reads it
directly, without the GIL. Freshness: the shard rewrites a small marker file ("incarnation
batch") after every commit; a read compares it (one ``stat``) and catches a secondary up with
the WAL when it changed, or reopens it after a restore; an answer never mixes two batches
(one instance serves while the next catches up). Safety: only partitions the owner reports
ready (the router's Describe poller) and only while the owner's process is alive; anything
else goes over gRPC, which gives the right 503.

This module is the seam's Python side for local reads: which servers are co-located (from the
routing table) and which of their partitions are ready, pushed to the engine, whose read core
reads them.
"""

from __future__ import annotations

from pathlib import Path

from qstate._engine import Engine
from qstate.core.address import PartitionId
from qstate.core.records.assignment import ServerInfo

__all__ = ["LocalReader"]


class LocalReader:
    def __init__(self, engine: Engine, node: str) -> None:
        self.node = node  # shards registered with this node are read in-process
        self.engine = engine
        self.servers: dict[str, ServerInfo] = {}  # address -> co-located server

    def set_servers(self, infos: list[ServerInfo]) -> None:
        """The shard servers of the routing table that run on this host (their partitions
        close when one goes or restarts)."""
        local = {i.address: i for i in infos
                 if i.hostname == self.node and i.data_dir and Path(i.data_dir).is_dir()}
        if local != self.servers:
            self.engine.set_servers([(i.address, i.data_dir, i.pid) for i in local.values()])
            self.servers = local

    def set_ready(self, address: str, partitions: set[PartitionId]) -> None:
        """The partitions ``address`` serves now (not restoring); the others close."""
        self.engine.set_ready(address, [(p.job, p.operator, p.partition) for p in partitions])

    def close(self) -> None:
        self.engine.close()
