"""The owner's reader: the read engine (``qstate._engine``, Rust) inside the shard server's
process, answering other hosts' routers' ``MultiGet`` of the partitions this server holds on
a port of its own, without Python on the read (docs/architecture.md §5, cluster reads).

The engine reads the partitions as a co-located router does (RocksDB secondaries of this
server's primaries, caught up at each commit's marker); what it may answer is pushed from
here the moment it changes: the operators' specs, the partitions held and ready, those
restoring (a ``Ready`` event of ``qstate.shard.held`` calls ``changed`` as it is set or
cleared, and an assignment change calls it once adopted). A partition dropped is refused at
once without a push: its marker is removed first (``PartitionStore.retire``).

The server's own Python ``MultiGet`` stays on its own port for savepoint reads (a savepoint's
files are built from storage by ``qstate.shard.savepoints``) and for routers older than the
reader (they ignore the registration's ``reader``).
"""

from __future__ import annotations

import os
import threading

from qstate._engine import Engine
from qstate.core.address import PartitionId
from qstate.core.config import Settings, engine_settings
from qstate.core.cpus import usable_cpus
from qstate.core.records.operator import OperatorSpec
from qstate.shard.metrics import ReaderCounts
from qstate.shard.partitions import Partitions

__all__ = ["READER_THREADS", "ShardReader"]

# the reader's threads: a key read is a few µs in Rust, a call tens; beside them the server's
# commits (docs/architecture.md §5, cluster reads)
READER_THREADS = max(1, min(2, usable_cpus() // 2))

def _triples(pids: list[PartitionId]) -> list[tuple[str, str, int]]:
    return [(p.job, p.operator, p.partition) for p in pids]


class ShardReader:
    """The engine's reader of one shard server's partitions, and what it was told."""

    def __init__(self, partitions: Partitions, cfg: Settings) -> None:
        self.partitions = partitions
        # a dot: not a job's folder (the shard's metrics scan skips it)
        self.engine = Engine(str(partitions.server_dir / ".reader"),
                             cfg.shard_reader_cache_mb << 20, engine_settings(cfg))
        if cfg.router_follow_ms:
            self.engine.start_follower(cfg.router_follow_ms / 1000)
        self.address = ""  # the shard server's own, once it has one (``serve``)
        self._lock = threading.Lock()  # one push at a time: the last one pushed is current
        self._specs: dict[tuple[str, str], OperatorSpec] = {}

    def serve(self, address: str, host: str, port: int, cfg: Settings,
              token: str | None) -> int:
        """Answer on ``host:port`` for the server at ``address`` (its registration's); the
        port bound."""
        self.address = address
        self.engine.set_servers([(address, str(self.partitions.server_dir), os.getpid())])
        tls = (cfg.tls_cert, cfg.tls_key) if cfg.tls_cert and cfg.tls_key else (None, None)
        bound = self.engine.serve_reader(address, READER_THREADS, host, port, tls[0], tls[1],
                                         token)
        self.changed()
        return bound

    def changed(self) -> None:
        """What the server holds changed: push it (from whichever thread changed it)."""
        if not self.address:
            return
        with self._lock:
            held = self.partitions.held_now()
            # the specs as the server applies them (read again at a new run or a rescale)
            specs = {(p.job, p.operator): self.partitions.spec(p.job, p.operator) for p in held}
            if specs != self._specs:
                unowned: list[str | None] = [None]  # the reader asks no owner: it is one
                none: list[str] = []
                ops = [(spec.to_json(), unowned * spec.partitions,
                        [list(none) for _ in range(spec.partitions)])
                       for spec in specs.values()]
                self.engine.set_table(ops, "", False)
                self._specs = specs
            ready = [p for p, h in held.items() if h.ready.is_set()]
            restoring = [p for p, h in held.items() if not h.ready.is_set()]
            # restoring first: a partition that stops being ready is refused before it is
            # no longer read as ready
            self.engine.set_restoring(_triples(restoring))
            self.engine.set_ready(self.address, _triples(ready))

    def counts(self) -> ReaderCounts:
        """What the reader answered so far: keys by status, calls, panics (read at each scrape:
        ``qstate.shard.metrics.READER``)."""
        return self.engine.reader_counts()

    def close(self) -> None:
        self.engine.close()
