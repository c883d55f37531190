"""Batch manifests: what each batch of an operator wrote, for replay and restore (DESIGN §4).

The driver writes ``jobs/{job}/{operator}/batches/{N}.json`` after the executors wrote the
batch's delta files and before it commits the batch on the shards. A shard that must catch
up (it was down, the partition moved to it, its disk was lost) replays manifests in order:
a partition listed has a delta file for that batch, one not listed had no rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from service.storage import Storage


@dataclass(frozen=True)
class BatchManifest:
    batch: int
    watermark_ms: int
    deltas: dict[int, int]  # partition -> rows in its delta file


def _dir(storage: Storage, job: str, operator: str) -> str:
    return storage.path("jobs", job, operator, "batches")


def write_manifest(storage: Storage, job: str, operator: str, m: BatchManifest) -> None:
    data = orjson.dumps({"batch": m.batch, "watermark_ms": m.watermark_ms,
                         "deltas": {str(p): n for p, n in sorted(m.deltas.items())}})
    storage.write_bytes(f"{_dir(storage, job, operator)}/{m.batch:020d}.json", data)


def read_manifest(storage: Storage, job: str, operator: str, batch: int) -> BatchManifest:
    raw = orjson.loads(storage.read_bytes(f"{_dir(storage, job, operator)}/{batch:020d}.json"))
    return BatchManifest(raw["batch"], raw["watermark_ms"],
                         {int(p): n for p, n in raw["deltas"].items()})


def manifest_batches(storage: Storage, job: str, operator: str) -> list[int]:
    return [int(n.split(".", 1)[0]) for n in storage.list_names(_dir(storage, job, operator))
            if n.endswith(".json")]


def delete_manifests_through(storage: Storage, job: str, operator: str, batch: int) -> int:
    n = 0
    for b in manifest_batches(storage, job, operator):
        if b <= batch:
            storage.delete(f"{_dir(storage, job, operator)}/{b:020d}.json")
            n += 1
    return n
