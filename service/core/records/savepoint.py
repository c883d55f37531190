"""Savepoints: a whole job at one committed batch, kept in checkpoint storage for as long as
the user wants (docs/architecture.md §4, savepoints).

A savepoint at batch N copies no state. Checkpoint storage already holds each partition as
of N: its newest snapshot at or before N (``S``) and the delta files of the batches after
it, up to N, listed by their manifests. A savepoint records, per partition of every
operator of the job, that ``S``, plus the source offsets that end batch N and each
operator's watermark; retention (the shards' snapshot pruning, the job's manifest
collection) keeps whatever a savepoint names. So making one costs a listing and a small
file whatever the state's size, the running job never pauses, and the files are shared
with the snapshots.

Whole or absent: the record is first written as ``{name}.pending.json`` (from then on
retention keeps what it names), every file it needs is checked to be still there, and only
then is ``{name}.json`` written and the pending one deleted. A process killed in between
leaves a pending record, which ``list_savepoints`` shows as incomplete and ``delete``
removes; it is never read as a savepoint.

Records come from storage, which is not trusted (docs/architecture.md §7): every field is
checked before use, and a record that fails is refused naming it. Retention keeps
everything of an operator while one of its savepoint records cannot be read: losing data a
savepoint needs cannot be undone, a file kept too long can.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import orjson

from qstate.core.address import PartitionId, check_name
from qstate.core.errors import CorruptState, InvalidRequest, NotFound, Unavailable
from qstate.core.process import faults
from qstate.core.records import paths
from qstate.core.records.catalog import delta_batches, manifest_batches, snapshot_batches
from qstate.core.records.manifest import (
    Offsets,
    offsets_json,
    offsets_of,
    read_manifest,
    strict_int,
)
from qstate.core.records.operator import OperatorSpec, load_spec
from qstate.core.records.storage import Storage

__all__ = ["Cut", "Pins", "Savepoint", "create", "delete", "list_savepoints", "pins",
           "read_savepoint"]

log = logging.getLogger(__name__)

NO_SNAPSHOT = -1  # the partition is rebuilt from its first batch
_ATTEMPTS = 3  # retention may prune a snapshot between the choice of N and the pending record


@dataclass(frozen=True)
class Cut:
    """One operator at the savepoint's batch."""

    spec: OperatorSpec  # as stored then: what its state means
    watermark_ms: int
    snapshots: dict[int, int]  # partition -> the snapshot it starts from, NO_SNAPSHOT: none

    @property
    def partitions(self) -> int:
        return self.spec.partitions


@dataclass(frozen=True)
class Savepoint:
    job: str
    name: str
    batch: int
    created_ms: int
    offsets: Offsets  # where batch N ended in the job's source: a fork starts there
    operators: dict[str, Cut]
    complete: bool = True  # False: its making was interrupted; it is not a savepoint

    @property
    def watermark_ms(self) -> int:
        """The job's watermark at the savepoint's batch: its operators' newest (one
        stream's, so the same for each)."""
        return max((c.watermark_ms for c in self.operators.values()), default=0)


def _name(name: str) -> str:
    check_name("savepoint name", name)
    if name.endswith(".pending"):
        raise InvalidRequest(f"invalid savepoint name {name!r}: a name may not end in "
                             ".pending")
    return name


def _encode(sp: Savepoint) -> bytes:
    return orjson.dumps({
        "job": sp.job, "name": sp.name, "batch": sp.batch, "created_ms": sp.created_ms,
        "offsets": offsets_json(sp.offsets),
        "operators": {op: {"spec": orjson.loads(c.spec.to_json()),
                           "watermark_ms": c.watermark_ms,
                           "snapshots": {str(p): s for p, s in sorted(c.snapshots.items())}}
                      for op, c in sorted(sp.operators.items())}})


def _spec(job: str, operator: str, raw: object) -> OperatorSpec:
    spec = OperatorSpec.from_json(orjson.dumps(raw))
    if (spec.job, spec.operator) != (job, operator):
        raise ValueError(f"the spec of {operator} names {spec.job}/{spec.operator}")
    return spec


def _decode(raw: bytes, path: str, complete: bool) -> Savepoint:
    try:
        d = orjson.loads(raw)
        ops = {check_name("operator", op): Cut(
            _spec(d["job"], op, c["spec"]), strict_int(c["watermark_ms"]),
            {strict_int(int(p)): strict_int(s) for p, s in c["snapshots"].items()})
            for op, c in d["operators"].items()}
        return Savepoint(check_name("job", d["job"]), check_name("savepoint name", d["name"]),
                         strict_int(d["batch"]), strict_int(d["created_ms"]),
                         offsets_of(d["offsets"]), ops, complete)
    except (KeyError, TypeError, ValueError, AttributeError, orjson.JSONDecodeError,
            InvalidRequest) as exc:
        raise CorruptState(f"savepoint {path} is not a savepoint record: {exc}") from None


def read_savepoint(storage: Storage, job: str, name: str) -> Savepoint:
    """The complete savepoint ``name`` of ``job``; NotFound (naming those there are) if
    there is none, Unavailable if its making was interrupted."""
    path = paths.savepoint(job, _name(name))
    if not storage.exists(path):
        if storage.exists(paths.savepoint_pending(job, name)):
            raise Unavailable(f"savepoint {job}@{name} is incomplete: its making was "
                              "interrupted (qstate savepoint delete removes it)")
        have = [s.name for s in list_savepoints(storage, job) if s.complete]
        raise NotFound(f"no savepoint {name!r} of job {job!r}; it has "
                       + (", ".join(repr(n) for n in have) if have else "none"))
    sp = _decode(storage.read_bytes(path), path, True)
    if (sp.job, sp.name) != (job, name):
        raise CorruptState(f"savepoint {path} names {sp.job}@{sp.name}")
    return sp


def list_savepoints(storage: Storage, job: str) -> list[Savepoint]:
    """Every savepoint record of ``job``, incomplete ones too, oldest batch first. A record
    that cannot be read raises CorruptState naming it."""
    out = []
    d = paths.savepoints_dir(job)
    for n in storage.list_names(d):
        pending = n.endswith(paths.PENDING)
        if not n.endswith(paths.JSON):
            continue
        path = f"{d}/{n}"
        out.append(_decode(storage.read_bytes(path), path, not pending))
    return sorted(out, key=lambda s: (s.batch, s.name, s.complete))


def _operators(storage: Storage, job: str) -> dict[str, OperatorSpec]:
    specs = {op: spec for op in storage.list_dirs(f"{paths.jobs_dir()}/{job}")
             if (spec := load_spec(storage, job, op)) is not None}
    if not specs:
        raise NotFound(f"job {job!r} has no operator in checkpoint storage at {storage.root}")
    return specs


def _cut(storage: Storage, job: str, ops: dict[str, OperatorSpec]
         ) -> tuple[int, dict[str, Cut], Offsets]:
    """The newest batch every operator has a manifest for, and each partition's snapshot."""
    newest = {op: manifest_batches(storage, job, op) for op in ops}
    if not all(newest.values()):
        raise Unavailable(f"job {job!r} has no batch committed for every operator yet")
    batch = min(bs[-1] for bs in newest.values())
    cuts: dict[str, Cut] = {}
    offsets: Offsets = {}
    for op, spec in ops.items():
        m = read_manifest(storage, job, op, batch)
        offsets = offsets or m.offsets
        snaps = {}
        for p in range(spec.partitions):
            have = [b for b in snapshot_batches(storage, PartitionId(job, op, p)) if b <= batch]
            snaps[p] = have[-1] if have else NO_SNAPSHOT
        cuts[op] = Cut(spec, m.watermark_ms, snaps)
    return batch, cuts, offsets


def _missing(storage: Storage, sp: Savepoint) -> str | None:
    """What the savepoint names that storage no longer holds (None: all there)."""
    for op, cut in sp.operators.items():
        first = min(cut.snapshots.values(), default=NO_SNAPSHOT) + 1
        have = set(manifest_batches(storage, sp.job, op))
        if first > 0 and not all(b in have for b in range(first, sp.batch + 1)):
            return f"a manifest of {op} between batches {first} and {sp.batch}"
        written = {b: read_manifest(storage, sp.job, op, b).deltas.keys()
                   for b in sorted(have) if first <= b <= sp.batch}
        for p, snap in cut.snapshots.items():
            pid = PartitionId(sp.job, op, p)
            if snap != NO_SNAPSHOT and not storage.exists(paths.snapshot(pid, snap)):
                return f"snapshot {snap} of {pid}"
            deltas = set(delta_batches(storage, pid))
            for b, parts in written.items():
                if b > snap and p in parts and b not in deltas:
                    return f"the delta of batch {b} of {pid}"
    return None


def create(storage: Storage, job: str, name: str | None = None,
           now_ms: int | None = None) -> Savepoint:
    """A savepoint of ``job`` at its newest batch committed for every operator (see the
    module's docstring); ``name`` defaults to the time, UTC (``20261126T101500Z``)."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    name = _name(time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now_ms / 1000))
                 if name is None else name)
    ops = _operators(storage, job)
    final, pending = paths.savepoint(job, name), paths.savepoint_pending(job, name)
    if storage.exists(final) or storage.exists(pending):
        raise InvalidRequest(f"job {job!r} already has a savepoint {name!r}: choose another "
                             "name or delete it first (qstate savepoint delete)")
    why = ""
    for _ in range(_ATTEMPTS):
        batch, cuts, offsets = _cut(storage, job, ops)
        sp = Savepoint(job, name, batch, now_ms, offsets, cuts)
        if not storage.create(pending, _encode(sp)):
            raise InvalidRequest(f"job {job!r} already has a savepoint {name!r} being made")
        faults.hit("savepoint.after-pending", batch, "")
        # Retention honours the pending record from here on; what a pruning that read the
        # records before it deleted is found missing here. One still deleting after this
        # check would need to prune the newest snapshot at N, which it keeps until two more
        # are taken (QSTATE_SNAPSHOTS_KEPT, every QSTATE_SNAPSHOT_EVERY batches)
        gone = _missing(storage, sp)
        if gone is None:
            storage.write_bytes(final, _encode(sp))
            storage.delete(pending)
            log.info("savepoint %s@%s at batch %d", job, name, batch)
            return sp
        storage.delete(pending)  # retention pruned it meanwhile: cut again, newer
        why = gone
    raise Unavailable(f"savepoint {job}@{name}: {why} was pruned while it was made, "
                      f"{_ATTEMPTS} times; try again")


def delete(storage: Storage, job: str, name: str) -> bool:
    """Delete the savepoint (or its interrupted making); False if there was neither. What it
    kept goes at the next pruning that no other savepoint stops."""
    found = False
    for path in (paths.savepoint(job, _name(name)), paths.savepoint_pending(job, name)):
        if storage.exists(path):
            storage.delete(path)
            found = True
    return found


@dataclass(frozen=True)
class Pins:
    """What the savepoints of one operator keep from retention."""

    ranges: dict[int, list[tuple[int, int]]]  # partition -> (snapshot, batch) of each
    unreadable: str = ""  # a record that could not be read: keep everything

    def keeps_snapshot(self, partition: int, batch: int) -> bool:
        return bool(self.unreadable) or any(
            s == batch for s, _ in self.ranges.get(partition, ()))

    def keeps_batch(self, partition: int, batch: int) -> bool:
        """The partition's delta (and manifest) of ``batch`` is needed by a savepoint."""
        return bool(self.unreadable) or any(
            s < batch <= n for s, n in self.ranges.get(partition, ()))

    def oldest_batch(self) -> int | None:
        """The newest batch through which no savepoint needs a manifest (each replays the
        batches after its partitions' snapshots): None, no savepoint; -1, keep them all."""
        if self.unreadable:
            return NO_SNAPSHOT
        return min((s for rs in self.ranges.values() for s, n in rs if s < n), default=None)


def pins(storage: Storage, job: str, operator: str) -> Pins:
    """What the savepoints of ``job`` (complete or being made) keep of ``operator``."""
    try:
        records = list_savepoints(storage, job)
    except (CorruptState, OSError) as exc:
        log.warning("keeping every snapshot and delta of %s/%s: %s", job, operator, exc)
        return Pins({}, str(exc))
    ranges: dict[int, list[tuple[int, int]]] = {}
    for sp in records:
        cut = sp.operators.get(operator)
        if cut is not None:
            for p, s in cut.snapshots.items():
                ranges.setdefault(p, []).append((s, sp.batch))
    return Pins(ranges)
