"""One shard server's RocksDB memory, under one budget (``QSTATE_SHARD_MEMORY_MB``).

A server holds many partitions, each its own RocksDB instance. Left to themselves, each
instance has its own block cache and its own memtables, so the server's memory grows with
the partitions it holds and with time (docs/architecture.md §4, memory). Here every
partition of the process shares one LRU block cache (data, index and filter blocks) and one
write-buffer manager whose memtables are charged to that cache: blocks and memtables together
stay near ``budget`` bytes, whatever the partitions. Past the memtables' share, a partition
written switches its memtable and flushes it; past the budget, the least recently used
blocks are evicted.

Beside the budget, the C allocator: glibc gives each thread that allocates at once an arena of
its own, up to 8 per core, and each keeps what it once held. A shard server's threads (commits
on a pool, RocksDB's flushes and compactions, gRPC) all allocate, so it held ~50 MiB more than
with two arenas, at the same CPU per row (docs/architecture.md §4, memory):
``limit_malloc_arenas`` caps them unless ``MALLOC_ARENA_MAX`` says otherwise.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from dataclasses import dataclass

from rocksdict import BlockBasedOptions, Cache, Options, WriteBufferManager

from qstate.core.config import DEFAULTS

__all__ = ["MALLOC_ARENAS", "MemoryBudget", "limit_malloc_arenas", "process_budget"]

log = logging.getLogger(__name__)

MB = 1 << 20
# Memtables take at most this share of the budget; the rest is for blocks read.
MEMTABLE_SHARE = 0.5
# A memtable allocates its arena in blocks (RocksDB: write_buffer_size / 8 = 1 MiB here): a
# server holding hundreds of partitions, each written every batch, would hold one such block
# per partition before any is full. Small blocks keep an idle partition's memtable small.
ARENA_BLOCK = 64 << 10
# glibc's malloc arenas a shard server keeps (``limit_malloc_arenas``)
MALLOC_ARENAS = 2
_M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)


@dataclass(frozen=True, eq=False)
class MemoryBudget:
    """The block cache and write-buffer manager every partition of one process shares."""

    budget: int  # bytes
    cache: Cache
    writes: WriteBufferManager

    @classmethod
    def of(cls, megabytes: int) -> MemoryBudget:
        budget = megabytes * MB
        cache = Cache(budget)
        writes = WriteBufferManager.new_write_buffer_manager_with_cache(
            int(budget * MEMTABLE_SHARE), False, cache)  # flush, never stall commits
        return cls(budget, cache, writes)

    def configure(self, opts: Options, table: BlockBasedOptions) -> None:
        """Make ``opts`` (one partition's) draw on this budget."""
        table.set_block_cache(self.cache)
        # index and filter blocks in the cache, so they count against the budget too
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        opts.set_write_buffer_manager(self.writes)
        opts.set_arena_block_size(ARENA_BLOCK)

    def usage(self) -> dict[str, int]:
        """Bytes in use: ``cache`` (blocks and the memtables charged to it), ``memtables``
        (their part of it) and ``pinned`` (blocks in use by a read or pinned L0 blocks)."""
        return {"cache": self.cache.get_usage(), "memtables": self.writes.get_usage(),
                "pinned": self.cache.get_pinned_usage()}


_lock = threading.Lock()
_process: MemoryBudget | None = None


def process_budget() -> MemoryBudget:
    """The budget of the stores given none (tests, an offline rescale): made once, of
    ``QSTATE_SHARD_MEMORY_MB``'s default. A shard server makes its own from its settings."""
    global _process
    with _lock:
        if _process is None:
            _process = MemoryBudget.of(DEFAULTS.shard_memory_mb)
        return _process


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas for the threads started from now on (call it before the
    process starts its threads); False where it does not apply: another C library, or
    ``MALLOC_ARENA_MAX`` set in the environment (glibc read it already: the operator's
    choice stands)."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:  # the C library this process already runs on: no search, no ldconfig child
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    if not mallopt(_M_ARENA_MAX, arenas):
        log.warning("malloc arenas not limited to %d: mallopt refused", arenas)
        return False
    return True
