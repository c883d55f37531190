"""The partitions a shard server holds, and how a batch commit is applied to them."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from service import delta as deltas
from service.operator import OperatorSpec, load_spec
from service.shard.store import PartitionStore
from service.storage import Storage


class UnknownOperator(LookupError):
    pass


class DeltaMismatch(RuntimeError):
    """A delta file is missing or does not hold the rows the committer announced."""


@dataclass(frozen=True)
class PartitionCommit:
    partition: int
    has_delta: bool
    rows: int


@dataclass
class CommitResult:
    applied: list[int]
    skipped: list[int]
    caught_up: int


class Partitions:
    def __init__(self, data_dir: Path, storage: Storage, workers: int = 4) -> None:
        self.data_dir = data_dir
        self.storage = storage
        self._stores: dict[tuple[str, str, int], PartitionStore] = {}
        self._specs: dict[tuple[str, str], OperatorSpec] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="commit")
        self._open_existing()

    def _path(self, job: str, operator: str, partition: int) -> Path:
        return self.data_dir / job / operator / f"p{partition:05d}"

    def _open_existing(self) -> None:
        for p in sorted(self.data_dir.glob("*/*/p[0-9]*")):
            job, operator = p.parent.parent.name, p.parent.name
            spec = self.spec(job, operator)
            part = int(p.name[1:])
            self._stores[(job, operator, part)] = PartitionStore(p, spec.state_names)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for s in self._stores.values():
            s.close()

    def spec(self, job: str, operator: str) -> OperatorSpec:
        spec = self._specs.get((job, operator))
        if spec is None:
            spec = load_spec(self.storage, job, operator)
            if spec is None:
                raise UnknownOperator(f"operator {job}/{operator} is not known to storage")
            self._specs[(job, operator)] = spec
        return spec

    def get(self, job: str, operator: str, partition: int) -> PartitionStore | None:
        return self._stores.get((job, operator, partition))

    def held(self) -> Iterable[tuple[tuple[str, str, int], PartitionStore]]:
        return sorted(self._stores.items())

    def _open(self, job: str, operator: str, partition: int) -> PartitionStore:
        with self._lock:
            store = self._stores.get((job, operator, partition))
            if store is None:
                spec = self.spec(job, operator)
                store = PartitionStore(self._path(job, operator, partition), spec.state_names)
                self._stores[(job, operator, partition)] = store
            return store

    # ---- commit -----------------------------------------------------------------
    def commit(self, job: str, operator: str, batch: int, watermark_ms: int, epoch: int,
               parts: list[PartitionCommit]) -> CommitResult:
        spec = self.spec(job, operator)
        futures = [self._pool.submit(self._commit_one, spec, batch, watermark_ms, epoch, pc)
                   for pc in parts]
        result = CommitResult([], [], 0)
        for pc, fut in zip(parts, futures, strict=True):
            applied, caught_up = fut.result()
            (result.applied if applied else result.skipped).append(pc.partition)
            result.caught_up += caught_up
        return result

    def _commit_one(self, spec: OperatorSpec, batch: int, watermark_ms: int, epoch: int,
                    pc: PartitionCommit) -> tuple[bool, int]:
        store = self._open(spec.job, spec.operator, pc.partition)
        retention = spec.retention_ms if spec.windowed else None
        caught_up = 0
        if store.meta.last_batch < batch - 1:
            # A gap: this server was down, or the partition is new here. The deltas in
            # storage are the source of truth; replay them in order (DESIGN §4).
            caught_up = self._catch_up(spec, store, pc.partition, batch, epoch, retention)
        if store.meta.last_batch >= batch:
            return False, caught_up
        table = None
        if pc.has_delta:
            try:
                table = deltas.read_delta(self.storage, spec.job, spec.operator, pc.partition,
                                          batch)
            except FileNotFoundError as exc:
                raise DeltaMismatch(f"delta for partition {pc.partition} batch {batch} "
                                    f"is missing from storage") from exc
            if table.num_rows != pc.rows:
                raise DeltaMismatch(f"delta for partition {pc.partition} batch {batch} has "
                                    f"{table.num_rows} rows, committer announced {pc.rows}")
        return store.apply(batch, watermark_ms, epoch, table, retention), caught_up

    def _catch_up(self, spec: OperatorSpec, store: PartitionStore, partition: int, batch: int,
                  epoch: int, retention: int | None) -> int:
        n = 0
        for b in deltas.delta_batches(self.storage, spec.job, spec.operator, partition):
            if store.meta.last_batch < b < batch:
                table = deltas.read_delta(self.storage, spec.job, spec.operator, partition, b)
                store.apply(b, store.meta.watermark_ms, epoch, table, retention)
                n += 1
        return n

