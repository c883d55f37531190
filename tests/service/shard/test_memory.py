"""One memory budget for every partition of a shard server (``QSTATE_SHARD_MEMORY_MB``,
``qstate.shard.memory``): many partitions written batch after batch stay near it together."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rocksdict import WriteBatch

from qstate.core.records.operator import WindowSpec
from qstate.shard.memory import MALLOC_ARENAS, MB, MemoryBudget
from qstate.shard.store import PartitionStore
from tests.service.shard.sim import make_spec

PARTITIONS = 24
BATCHES = 20
ROWS = 256  # of 1 KiB: 256 KiB a partition a batch, 5 MiB each after 20 batches


def test_partitions_share_one_budget(tmp_path: Path) -> None:
    budget = MemoryBudget.of(16)
    spec = make_spec(WindowSpec("tumbling", 10, 10))
    stores = [PartitionStore(tmp_path / f"p{i}", spec, memory=budget)
              for i in range(PARTITIONS)]
    try:
        memtables = []
        for b in range(BATCHES):
            for store in stores:  # a batch writes every partition, as a commit does
                wb = WriteBatch(raw_mode=True)
                for k in range(ROWS):
                    wb.put(f"{b:02d}{k:06d}".encode(), os.urandom(1 << 10))
                store.db.write(wb, store._sync)  # synced, as a commit is
            memtables.append(budget.usage()["memtables"])
        # each partition's memtable stays under its own size (8 MiB): left to themselves
        # they would hold all 120 MiB written. The shared limit (8 MiB) is soft: a partition
        # over it flushes at its next write, so what the others took since their last flush
        # and the flushes not done yet come on top (~25 MiB here)
        assert 0 < max(memtables) <= 3 * budget.budget, [m // MB for m in memtables]
        for store in stores:  # read back: blocks come into the one cache
            for k in range(0, ROWS, 5):
                assert store.db.get(f"03{k:06d}".encode()) is not None
        use = budget.usage()
        assert use["memtables"] <= use["cache"] <= 3 * budget.budget, use
    finally:
        for store in stores:
            store.close()


_ARENAS = """
import ctypes, sys, threading
from qstate.shard.memory import limit_malloc_arenas
limited = limit_malloc_arenas() if sys.argv[1] == "limit" else None
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
start = threading.Barrier(8)
def allocate():
    start.wait()
    for _ in range(100):
        libc.malloc(1000)  # kept: each thread's arena stays in use
threads = [threading.Thread(target=allocate) for _ in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
print(limited)
libc.malloc_stats()  # to stderr: one "Arena N:" per arena
"""


def _arenas(mode: str, **env: str) -> tuple[str, int]:
    environ = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    out = subprocess.run([sys.executable, "-c", _ARENAS, mode], capture_output=True,
                         text=True, check=True, env={**environ, **env})
    return out.stdout.strip(), sum(line.startswith("Arena ") for line in
                                   out.stderr.splitlines())


def test_malloc_arenas_are_limited() -> None:
    """Eight threads allocating at once get arenas of their own, unless a shard server
    limited them (``limit_malloc_arenas``, called before its threads start)."""
    said, arenas = _arenas("limit")
    assert said == "True" and arenas <= MALLOC_ARENAS, (said, arenas)
    _, unlimited = _arenas("none")
    assert unlimited > MALLOC_ARENAS  # what the limit prevents, on this machine
    # an operator's MALLOC_ARENA_MAX stands
    said, arenas = _arenas("limit", MALLOC_ARENA_MAX="4")
    assert said == "False" and MALLOC_ARENAS < arenas <= 4, (said, arenas)
