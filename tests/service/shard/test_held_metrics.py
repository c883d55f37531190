"""What a shard reports it holds, computed when scraped (unit: stand-ins for the partitions,
real folders; tests/service/test_metrics.py checks the same series on real servers)."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

from prometheus_client import CollectorRegistry

from qstate.core.address import PartitionId
from qstate.shard.held import Held
from qstate.shard.metrics import HeldCollector

OP = {"job": "j", "operator": "o"}


def _folder(root: Path, partition: int, files: dict[str, int]) -> None:
    folder = root / "j" / "o" / f"p{partition:05d}"
    folder.mkdir(parents=True)
    for name, size in files.items():
        (folder / name).write_bytes(b"x" * size)


def _held(batch: int, watermark_ms: int, ready: bool) -> Held:
    event = threading.Event()
    if ready:
        event.set()
    store = SimpleNamespace(meta=SimpleNamespace(last_batch=batch, watermark_ms=watermark_ms))
    return Held(store, event)  # type: ignore[arg-type]


def test_partitions_by_state_size_of_held_ones_and_lowest_serving_batch_and_watermark(
        tmp_path: Path) -> None:
    data = {"000004.log": 100, "000007.sst": 50, "LOG": 1000, "MANIFEST-000005": 300,
            "QSTATE_COMMITTED": 9}  # only the table files and the write-ahead log count
    for p in range(4):
        _folder(tmp_path, p, data)
    (tmp_path / ".scratch" / "j" / "o" / "p00009").mkdir(parents=True)  # not a partition
    held = {PartitionId("j", "o", 0): _held(9, 5_000, ready=True),
            PartitionId("j", "o", 1): _held(8, 7_000, ready=True),
            PartitionId("j", "o", 2): _held(3, 1_000, ready=False)}  # restoring
    collector = HeldCollector(disk_every_s=0)
    registry = CollectorRegistry()
    registry.register(collector)
    assert registry.get_sample_value("qstate_shard_partitions", {**OP, "state": "serving"}) \
        is None  # nothing watched yet: no samples, and no error
    collector.watch(tmp_path, lambda: held)

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {**OP, **labels})

    assert [value("qstate_shard_partitions", state=s)
            for s in ("serving", "restoring", "retired")] == [2, 1, 1]  # p3: moved away
    assert value("qstate_shard_rocksdb_bytes") == 3 * 150
    # the lowest of the serving ones; the restoring one does not count
    assert (value("qstate_shard_last_batch"), value("qstate_shard_watermark_ms")) == (8, 5_000)

    held[PartitionId("j", "o", 2)].ready.set()  # restored: seen at the next scrape
    del held[PartitionId("j", "o", 1)]  # moved away
    assert [value("qstate_shard_partitions", state=s)
            for s in ("serving", "restoring", "retired")] == [2, 0, 2]
    assert (value("qstate_shard_last_batch"), value("qstate_shard_watermark_ms")) == (3, 1_000)
