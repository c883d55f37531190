"""Where a job's batches begin: at 0 for a new job; after the state of a savepoint for a job
started from one, a fork or a rollback (docs/architecture.md §4, forks and rollbacks).

    qstate job mypkg.tweets_v2:build --name tweets_v2 --from-savepoint tweets@before-v2
    qstate job tweets --from-savepoint before-v2        # the job's own: a rollback

Spark numbers a checkpoint's batches from 0, and a job begun from a savepoint starts a new
checkpoint reading from the savepoint's source offsets. Its state, though, already holds
batches, and a shard applies a batch once, by number: so the job's batch is Spark's plus the
origin's ``base``. The state is written (``Seed``: by the shard layer) as the job's snapshot
at ``base - 1``, a batch no manifest names: a fork's is the savepoint's batch N; a
rollback's is one past every batch the job ever recorded, so every shard, whatever batch it
holds, restores it rather than replaying onto what it had, and the abandoned batches are
deleted. Spark's watermark starts again too; the savepoint's is the floor of the job's, so
data the job had already dropped as late stays dropped.

The origin is kept beside the job's Spark checkpoints (``origin.json`` in its checkpoint
folder): it numbers their batches and lives and dies with them. It is written before
anything is changed, as incomplete, and completed last: an interrupted start is taken up
again by running the same command; the job does not start without it.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import orjson

from qstate.control.coordinator import driver_beat_age_s
from qstate.core.address import PartitionId
from qstate.core.config import settings
from qstate.core.errors import InvalidRequest
from qstate.core.records.catalog import manifest_batches, snapshot_batches
from qstate.core.records.manifest import strict_int
from qstate.core.records.operator import OperatorSpec, state_changes
from qstate.core.records.savepoint import Savepoint, list_savepoints
from qstate.core.records.storage import Storage

__all__ = ["FILE", "Origin", "Seed", "begin", "read_origin", "savepoint_partitions",
           "split_savepoint"]

log = logging.getLogger(__name__)

FILE = "origin.json"
# builds the job's state as of a savepoint as its snapshot at a batch (qstate.shard.seed.seed):
# storage, savepoint, job, operators, batch, a local scratch folder
Seed = Callable[[Storage, Savepoint, str, list[OperatorSpec], int, Path], None]


@dataclass(frozen=True)
class Origin:
    base: int = 0  # the job's batch of Spark's batch 0
    watermark_ms: int = 0  # the savepoint's: the floor of Spark's, which starts again at 0
    savepoint: str = ""  # JOB@NAME it began from; "" a job begun empty
    complete: bool = True  # False: being prepared; the job does not start

    def batch(self, spark_batch: int) -> int:
        return self.base + spark_batch

    def watermark(self, spark_ms: int) -> int:
        return max(self.watermark_ms, spark_ms)


def read_origin(checkpoint: Path) -> Origin | None:
    """The origin kept in ``checkpoint`` (a job's checkpoint folder); None if there is none.
    The file is local, written by ``begin``; one that is not what it writes is refused."""
    path = checkpoint / FILE
    if not path.exists():
        return None
    try:
        raw = orjson.loads(path.read_bytes())
        return Origin(strict_int(raw["base"]), strict_int(raw["watermark_ms"]),
                      str(raw["savepoint"]), raw["complete"] is True)
    except (KeyError, TypeError, orjson.JSONDecodeError) as exc:
        raise InvalidRequest(f"{path} is not a job's origin ({exc}): restore it, or move the "
                             "checkpoint folder away to start the job again") from None


def _write(checkpoint: Path, origin: Origin) -> None:
    checkpoint.mkdir(parents=True, exist_ok=True)
    tmp = checkpoint / f".{FILE}.tmp"
    tmp.write_bytes(orjson.dumps(asdict(origin)))
    os.replace(tmp, checkpoint / FILE)


def split_savepoint(value: str, job: str) -> tuple[str, str]:
    """``JOB@NAME`` or ``NAME`` (``job``'s own) as (job, name)."""
    owner, sep, name = value.rpartition("@")
    return (owner, name) if sep else (job, value)


def savepoint_partitions(sp: Savepoint) -> int | None:
    """The partition count a job begun from ``sp`` takes when it is given none: its
    operators' (a job's operators share one count, ``JobContext.partitions``); None if they
    differ, and ``_check`` names the one that does not fit."""
    counts = {cut.partitions for cut in sp.operators.values()}
    return counts.pop() if len(counts) == 1 else None


def begin(storage: Storage, checkpoint: Path, job: str, specs: list[OperatorSpec],
          sp: Savepoint | None, seed: Seed | None, queries: list[str]) -> Origin:
    """The origin of ``job``'s batches, whose Spark checkpoints are ``queries`` under
    ``checkpoint``; with ``sp``, the job begins from that savepoint first (unless it already
    did: a restart of such a job goes on from its checkpoint)."""
    current = read_origin(checkpoint)
    name = f"{sp.job}@{sp.name}" if sp else ""
    if sp is None or (current is not None and current.complete and current.savepoint == name):
        if current is not None and not current.complete:
            raise InvalidRequest(
                f"job {job!r} was being started from savepoint {current.savepoint} when it "
                f"stopped: run it again with --from-savepoint {current.savepoint}")
        if sp is not None:
            log.warning("%s began from savepoint %s already: going on from its checkpoint",
                        job, name)
        origin = current or Origin()
        _check_numbering(storage, checkpoint, job, specs, origin, queries)
        return origin
    if current is not None and current.savepoint != name:
        what = (f"is being started from savepoint {current.savepoint}" if not current.complete
                else f"began from savepoint {current.savepoint}" if current.savepoint
                else "has a checkpoint")
        if not current.complete or sp.job != job:
            raise InvalidRequest(f"job {job!r} {what}: not starting it from {name}")
    if seed is None:
        raise InvalidRequest(f"job {job!r}: beginning from a savepoint needs the shard layer's "
                             "seed (qstate job does it)")
    _check(storage, sp, job, specs, checkpoint, queries)
    if current is not None and not current.complete:
        batch = current.base - 1  # taken up again: the batch the state is written at
    elif sp.job != job:
        batch = sp.batch  # a fork: its own history starts after the savepoint's batch
    else:  # a rollback: past every batch the job recorded or began at, so no shard
        # replays onto what it held
        batch = 1 + max([sp.batch, current.base if current else 0] + [
            b for s in specs for b in manifest_batches(storage, job, s.operator)[-1:]] + [
            b for s in specs for p in range(s.partitions)
            for b in snapshot_batches(storage, PartitionId(job, s.operator, p))[-1:]])
    origin = Origin(batch + 1, sp.watermark_ms, name, complete=False)
    _write(checkpoint, origin)  # the batch is chosen once: a rerun writes the same state
    for q in queries:  # the old checkpoints' batches are not this history's
        if (checkpoint / q).exists():
            aside = checkpoint / f"{q}.before-{name.replace('@', '.')}-{batch}"
            shutil.rmtree(aside, ignore_errors=True)
            (checkpoint / q).rename(aside)
            log.warning("%s: Spark checkpoint moved to %s", job, aside)
    seed(storage, sp, job, specs, batch, checkpoint / ".seed")
    done = replace(origin, complete=True)
    _write(checkpoint, done)
    log.warning("%s begins from savepoint %s: its state as of batch %d is batch %d here; "
                "reading from %s", job, name, sp.batch, batch, sp.offsets)
    return done


def _check_numbering(storage: Storage, checkpoint: Path, job: str, specs: list[OperatorSpec],
                     origin: Origin, queries: list[str]) -> None:
    """Refuse a checkpoint that is not the one that wrote the job's state (deleted, moved,
    another job's): its batches would be numbered at or below those the shards hold, and
    skipped as applied already. Normally the newest batch recorded is the checkpoint's last
    committed one or the next (recorded, not yet committed by Spark)."""
    newest = max((b for s in specs for b in manifest_batches(storage, job, s.operator)[-1:]),
                 default=-1)
    for q in queries:
        commits = checkpoint / q / "commits"
        done = max((int(f.name) for f in commits.iterdir() if f.name.isdigit()),
                   default=-1) if commits.is_dir() else -1
        if newest > origin.batch(done + 1):
            raise InvalidRequest(
                f"job {job!r} has state up to batch {newest} in checkpoint storage, and its "
                f"checkpoint {checkpoint / q} goes on at batch {origin.batch(done + 1)}: it "
                "is not the checkpoint that wrote the state (deleted, moved, or another "
                "job's), and the shards would skip its batches. Put the checkpoint folder "
                "back, or begin the job from a savepoint of its own (--from-savepoint NAME)")


def _check(storage: Storage, sp: Savepoint, job: str, specs: list[OperatorSpec],
           checkpoint: Path, queries: list[str]) -> None:
    """Refuse what a savepoint cannot begin, naming it."""
    fork = sp.job != job
    for spec in specs:
        cut = sp.operators.get(spec.operator)
        if cut is None:
            continue  # added: begins empty
        if cut.partitions != spec.partitions:
            raise InvalidRequest(
                f"{job}/{spec.operator} has {spec.partitions} partitions and savepoint "
                f"{sp.job}@{sp.name} {cut.partitions}: start it with --partitions "
                f"{cut.partitions} (rescale afterwards: qstate state rescale)")
        changes = state_changes(cut.spec, spec)
        if changes:
            raise InvalidRequest(
                f"{job}/{spec.operator} cannot begin from savepoint {sp.job}@{sp.name}: "
                f"{'; '.join(changes)}. Its stored values would not mean what the job "
                "declares now: give the changed operator a new name (it begins empty) "
                "(docs/upgrading.md)")
    if fork:
        recorded = [s.operator for s in specs if manifest_batches(storage, job, s.operator)]
        if recorded or any((checkpoint / q).exists() for q in queries):
            raise InvalidRequest(
                f"job {job!r} already has state ({', '.join(recorded) or 'a checkpoint'}): a "
                f"fork begins a new job: give it another --name, or roll {job} back to a "
                f"savepoint of its own (--from-savepoint {job}@NAME)")
        return
    age, lease_s = driver_beat_age_s(storage, job), settings().lease_s
    if age is not None and age < lease_s:
        raise InvalidRequest(
            f"job {job!r} is running: its driver beat {age:.0f}s ago. Stop it first: a "
            "rollback rewrites its state and its batches. A driver that was killed holds "
            f"its lease {lease_s:.0f}s after its last beat (QSTATE_LEASE_S)")
    later = [s.name for s in list_savepoints(storage, job) if s.batch > sp.batch]
    if later:
        raise InvalidRequest(
            f"job {job!r} has savepoints after {sp.name} (batch {sp.batch}): "
            f"{', '.join(later)}. A rollback deletes the batches they need: delete them first "
            f"(qstate savepoint delete {job} NAME) or fork from {sp.name} under a new name")
