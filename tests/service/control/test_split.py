"""A partition split by `qstate state rescale` (``Rescale._copy``), then both halves go on
taking batches: each key's windows and the leaderboards of every partition are what one
partition would have held, with a window that spans the rescale (the keys that moved are
still in the old partition, as they were then, and must not count twice)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pyarrow as pa

from qstate.core.address import partition_of
from qstate.core.records.delta import delta_schema
from qstate.core.records.operator import Aggregate, OperatorSpec, WindowSpec
from qstate.core.records.storage import Storage
from qstate.partition import rank
from qstate.shard.store import PartitionStore
from tests.service.shard.sim import scratch

P, P2 = 2, 4
HOUR = 3_600_000
KEYS = [f"tw-{i}" for i in range(200)]
SPEC = OperatorSpec("j", "op", "k", {"n": Aggregate("count", "long")}, partitions=P,
                    window=WindowSpec("tumbling", HOUR))
SPLIT = OperatorSpec("j", "op", "k", {"n": Aggregate("count", "long")}, partitions=P2,
                     window=WindowSpec("tumbling", HOUR))


def owned_by(q: int, key: str) -> bool:
    return partition_of(key, P2) == q


def delta(spec: OperatorSpec, counts: dict[str, int]) -> pa.Table:
    keys = list(counts)
    return pa.table({"key": keys, "start": [0] * len(keys), "end": [HOUR] * len(keys),
                     "tag": pa.nulls(len(keys), pa.int64()),
                     "n": [counts[k] for k in keys]}).cast(delta_schema(spec))


def test_a_window_that_spans_the_split_ranks_each_key_once(tmp_path: Path) -> None:
    from qstate.control.rescale import Rescale

    before = {k: 1 + i % 7 for i, k in enumerate(KEYS)}
    # half the keys count again after the split: the others' values are only in the files
    after = {k: 1 + (i * 3) % 5 for i, k in enumerate(KEYS) if i % 2}
    truth = {k: before[k] + after.get(k, 0) for k in KEYS}
    with scratch() as d:
        root = Path(d)
        stores: dict[int, PartitionStore] = {}
        try:
            for p in range(P):  # batch 0 at P partitions
                stores[p] = PartitionStore(root / f"old-{p}", SPEC)
                mine = {k: c for k, c in before.items() if partition_of(k, P) == p}
                assert stores[p].apply(0, 1000, 1, delta(SPEC, mine), None)
            r = Rescale(Storage(str(tmp_path)), "j", P2)
            for p in range(P):  # the split: p keeps its files, p + P gets its moved keys
                stores[p + P] = PartitionStore(root / f"new-{p + P}", SPLIT)
                r._copy(stores[p], {p + P: stores[p + P]})
            for q in range(P2):  # batch 1 at 2P partitions, in the same hour
                stores[q].spec = SPLIT
                mine = {k: c for k, c in after.items() if partition_of(k, P2) == q}
                assert stores[q].apply(1, 2000, 1, delta(SPLIT, mine), None)
            board = sorted(
                (e for q in range(P2) for e in rank.read_top(
                    stores[q].db, stores[q].codec, 0, 0, len(KEYS), True, 1000,
                    partial(owned_by, q))[2]),
                key=lambda e: (-e.value, e.key))  # the router merges the same way
            want = sorted(truth.items(), key=lambda kv: (-kv[1], kv[0]))
            assert [(e.key, e.value) for e in board] == want
            for k in KEYS:  # and each key reads its truth from its partition by 2P
                _, windows = stores[partition_of(k, P2)].read(k)
                assert windows[0].values == [truth[k]], k
        finally:
            for s in stores.values():
                s.close()
