"""Batch manifests: what each batch of an operator wrote, for replay and restore
(docs/architecture.md §4).

The driver writes batch N's manifest after the executors wrote the batch's delta files and
before it commits the batch on the shards. A shard that must catch up (it was down, the
partition moved to it, its disk was lost) replays manifests in order: a partition listed
has a delta file for that batch, one not listed had no rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from qstate.core.errors import DeltaMismatch
from qstate.core.records import paths
from qstate.core.records.catalog import manifest_batches
from qstate.core.records.storage import Storage

__all__ = ["BatchManifest", "Fragments", "Offsets", "delete_manifests_through",
           "offsets_json", "offsets_of", "read_manifest", "strict_int", "write_manifest"]


Fragments = dict[int, int]  # fragment -> rows in it
# topic -> Kafka partition -> the offset the batch read up to, exclusive (Spark's offset log):
# the batch counted every record of the partition below it that the batch before did not
Offsets = dict[str, dict[int, int]]


@dataclass(frozen=True)
class BatchManifest:
    batch: int
    watermark_ms: int
    deltas: dict[int, Fragments]  # partition -> its delta fragments
    offsets: Offsets = field(default_factory=dict)  # where the batch ended in its source


def write_manifest(storage: Storage, job: str, operator: str, m: BatchManifest) -> None:
    data = orjson.dumps({"batch": m.batch, "watermark_ms": m.watermark_ms,
                         "deltas": {str(p): {str(f): n for f, n in sorted(fs.items())}
                                    for p, fs in sorted(m.deltas.items())},
                         "offsets": offsets_json(m.offsets)})
    storage.write_bytes(paths.manifest(job, operator, m.batch), data)


def read_manifest(storage: Storage, job: str, operator: str, batch: int) -> BatchManifest:
    """Manifest ``batch``; DeltaMismatch naming it if it is not what ``write_manifest`` writes
    (storage is outside this process: a crafted one names no file, only numbers)."""
    path = paths.manifest(job, operator, batch)
    raw = orjson.loads(storage.read_bytes(path))
    try:
        m = BatchManifest(strict_int(raw["batch"]), strict_int(raw["watermark_ms"]),
                          {strict_int(int(p)): {strict_int(int(f)): strict_int(n)
                                                for f, n in fs.items()}
                           for p, fs in raw["deltas"].items()},
                          offsets_of(raw.get("offsets", {})))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise DeltaMismatch(f"manifest {path} is not a batch manifest: {exc!r}") from None
    if m.batch != batch:
        raise DeltaMismatch(f"manifest {path} names batch {m.batch}")
    return m


def offsets_json(offsets: Offsets) -> dict[str, dict[str, int]]:
    """``offsets`` as JSON writes them: topic -> partition (a string) -> offset."""
    return {t: {str(p): o for p, o in sorted(ps.items())} for t, ps in sorted(offsets.items())}


def offsets_of(raw: Any) -> Offsets:
    """What ``offsets_json`` wrote, read back from storage (not trusted): TypeError or
    ValueError naming the first field that is not what it writes."""
    return {_str(t): {strict_int(int(p)): strict_int(o) for p, o in ps.items()}
            for t, ps in raw.items()}


def _str(v: object) -> str:
    if type(v) is not str:
        raise TypeError(f"{v!r} is not a string")
    return v


def strict_int(v: object) -> int:
    """``v`` if it is an int (not a bool, a float or a string); else TypeError."""
    if type(v) is not int:
        raise TypeError(f"{v!r} is not an integer")
    return v


def delete_manifests_through(storage: Storage, job: str, operator: str, batch: int) -> int:
    old = [b for b in manifest_batches(storage, job, operator) if b <= batch]
    for b in old:
        storage.delete(paths.manifest(job, operator, b))
    return len(old)
