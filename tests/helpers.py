"""Test helpers that read served state straight from the shard servers."""

from __future__ import annotations

from proto import shard_pb2 as pb
from service.assignment import load_assignment
from service.keys import partition_of
from service.shard.client import ShardClients
from service.storage import Storage


def read_all_windows(storage_uri: str, job: str, operator: str, state: str, keys: list[str],
                     partitions: int) -> tuple[dict[tuple[str, int], int | float], set[int]]:
    """(key, window start) -> value for every window of every key, plus the batches seen."""
    a = load_assignment(Storage(storage_uri))
    clients = ShardClients()
    by_addr: dict[str, list[pb.KeyQuery]] = {}
    for k in keys:
        p = partition_of(k, partitions)
        addr = a.owner(job, operator, p)
        assert addr is not None, f"partition {p} has no owner"
        by_addr.setdefault(addr, []).append(pb.KeyQuery(key=k, partition=p))
    out: dict[tuple[str, int], int | float] = {}
    batches: set[int] = set()
    for addr, kqs in by_addr.items():
        for i in range(0, len(kqs), 5000):
            rep = clients.stub(addr).MultiGet(pb.LookupRequest(
                job=job, operator=operator, state=state, keys=kqs[i:i + 5000], range=True,
                from_ms=-(1 << 62), to_ms=1 << 62), timeout=60)
            for r in rep.results:
                assert r.status in (pb.FOUND, pb.ABSENT), (r.key, r.status)
                batches.add(r.batch)
                for w in r.windows:
                    out[(r.key, w.start_ms)] = w.int_value if w.HasField("int_value") \
                        else w.double_value
    clients.close()
    return out, batches
