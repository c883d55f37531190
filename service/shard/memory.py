"""One shard server's RocksDB memory, under one budget (``QSTATE_SHARD_MEMORY_MB``).

A server holds many partitions, each its own RocksDB instance. Left to themselves, each
instance has its own block cache and its own memtables, so the server's memory grows with
the partitions it holds and with time (docs/architecture.md §4, memory). Here every
partition of the process shares one LRU block cache (data, index and filter blocks) and one
write-buffer manager whose memtables are charged to that cache: blocks and memtables together
stay near ``budget`` bytes, whatever the partitions. Past the memtables' share, a partition
written switches its memtable and flushes it; past the budget, the least recently used
blocks are evicted.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from rocksdict import BlockBasedOptions, Cache, Options, WriteBufferManager

from qstate.core.config import DEFAULTS

__all__ = ["MemoryBudget", "process_budget"]

MB = 1 << 20
# Memtables take at most this share of the budget; the rest is for blocks read.
MEMTABLE_SHARE = 0.5
# A memtable allocates its arena in blocks (RocksDB: write_buffer_size / 8 = 1 MiB here): a
# server holding hundreds of partitions, each written every batch, would hold one such block
# per partition before any is full. Small blocks keep an idle partition's memtable small.
ARENA_BLOCK = 64 << 10


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
