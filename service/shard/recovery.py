"""Bringing a partition up to date on this server (docs/architecture.md §4).

A partition newly assigned here, or found behind after a crash, is caught up from
checkpoint storage: the batch manifests after its last batch, in order, applying each
batch's delta file. When it is behind the newest snapshot (a new server, a lost disk, or
deltas already pruned), the snapshot is restored first. Until caught up, reads of it answer
RESTORING, never a partial state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from qstate.core.address import PartitionId
from qstate.core.errors import DeltaMismatch
from qstate.core.records import delta as deltas
from qstate.core.records.catalog import manifest_batches, snapshot_batches
from qstate.core.records.manifest import read_manifest
from qstate.core.records.operator import OperatorSpec
from qstate.core.records.storage import Storage
from qstate.partition.files import partition_dir
from qstate.shard import metrics, snapshot
from qstate.shard.held import Held
from qstate.shard.store import PartitionStore

__all__ = ["Recovery", "replay"]

log = logging.getLogger(__name__)


def replay(storage: Storage, pid: PartitionId, spec: OperatorSpec, store: PartitionStore,
           batches: range, epoch: int) -> None:
    """Apply ``batches`` to ``store`` from their manifests and delta files, in order."""
    retention = spec.retention_ms if spec.windowed else None
    for b in batches:
        m = read_manifest(storage, pid.job, pid.operator, b)
        fragments = m.deltas.get(pid.partition)
        table = deltas.read_deltas(storage, pid, b, fragments, spec) if fragments else None
        store.apply(b, m.watermark_ms, epoch, table, retention)


class Recovery:
    def __init__(self, storage: Storage, server_dir: Path,
                 spec: Callable[[str, str], OperatorSpec], epoch: Callable[[str], int],
                 retry_s: float) -> None:
        self.storage = storage
        self.server_dir = server_dir
        self.spec = spec
        self.epoch = epoch
        self.retry_s = retry_s

    def bring_up(self, pid: PartitionId, held: Held, still_mine: Callable[[], bool]) -> None:
        """Catch up to the newest batch in storage, then serve. Retried until it works or
        the partition moves away."""
        while still_mine():
            try:
                batches = manifest_batches(self.storage, pid.job, pid.operator)
                snaps = snapshot_batches(self.storage, pid)
                # a snapshot after the newest batch recorded: a job begun from a savepoint
                # (docs/architecture.md §4, forks and rollbacks), served before its first
                upto = max(batches[-1:] + snaps[-1:], default=None)
                if upto is not None:
                    self.catch_up(pid, held, upto, batches, snaps)
                held.ready.set()
                return
            except Exception:
                log.exception("bringing up %s failed; retrying", pid)
                time.sleep(self.retry_s)

    def catch_up(self, pid: PartitionId, held: Held, upto: int,
                 batches: list[int] | None = None, snaps: list[int] | None = None) -> int:
        """Apply batches ``last_batch+1 .. upto`` from storage, starting from the newest
        snapshot when behind it (``batches``, ``snaps``: the manifests and snapshots in
        storage, when the caller has just listed them). Returns how many batches were
        applied."""
        if held.store.meta.last_batch >= upto:
            return 0
        with held.catching_up:  # a commit's catch-up and a follower's never interleave
            return self._catch_up(pid, held, upto, batches, snaps)

    def _catch_up(self, pid: PartitionId, held: Held, upto: int,
                  batches: list[int] | None, snaps: list[int] | None) -> int:
        store = held.store
        if store.meta.last_batch >= upto:
            return 0
        have = set(batches if batches is not None
                   else manifest_batches(self.storage, pid.job, pid.operator))
        snaps = snaps if snaps is not None else snapshot_batches(self.storage, pid)
        needed = range(store.meta.last_batch + 1, upto + 1)
        # A partition that serves (a follower a few batches behind, a follower that just
        # became the owner) replays what it lacks whenever the batches' manifests are there:
        # it goes on answering reads (a restore answers RESTORING meanwhile: the 503s of a
        # planned move, docs/architecture.md §3); when their deltas were pruned, the OSError
        # below restores it after all. One coming up starts from the newest snapshot (one
        # download instead of many batches), and so does any other behind the oldest kept
        # snapshot, or once batches are missing.
        replayable = all(b in have for b in needed) and (
            held.ready.is_set() or not snaps or store.meta.last_batch >= snaps[0])
        coming_up = not held.ready.is_set() and bool(snaps) and \
            store.meta.last_batch < snaps[-1] <= upto
        if not replayable or coming_up:
            needed = self._from_snapshot(pid, held, upto, snaps, have)
        try:
            self._replay(pid, held, needed)
        except OSError:  # deltas pruned since it listed them: from the snapshot after all
            needed = self._from_snapshot(pid, held, upto,
                                         snapshot_batches(self.storage, pid), have)
            self._replay(pid, held, needed)
        metrics.CAUGHT_UP.labels(pid.job, pid.operator).inc(len(needed))
        return len(needed)

    def _from_snapshot(self, pid: PartitionId, held: Held, upto: int, snaps: list[int],
                       have: set[int]) -> range:
        """Restore the newest snapshot at or before ``upto``; the batches to replay after it."""
        self._restore(pid, held, max((b for b in snaps if b <= upto), default=None))
        needed = range(held.store.meta.last_batch + 1, upto + 1)
        missing = [b for b in needed if b not in have]
        if missing:
            raise DeltaMismatch(f"{pid}: batch manifests {missing[:5]} are gone from storage")
        return needed

    def _replay(self, pid: PartitionId, held: Held, needed: range) -> None:
        replay(self.storage, pid, self.spec(pid.job, pid.operator), held.store, needed,
               self.epoch(pid.job))

    def _restore(self, pid: PartitionId, held: Held, batch: int | None) -> None:
        t0 = time.perf_counter()
        store = held.store
        was_ready = held.ready.is_set()
        held.ready.clear()  # readers get RESTORING, never a half-restored partition
        with store.lock:
            store.close()
            try:
                snapshot.restore(self.storage, pid, partition_dir(self.server_dir, pid), batch)
            finally:
                store.reopen()
        if was_ready:  # in a commit: serve the restored state; bring-up sets it when done
            held.ready.set()
        held.snapshot_batch = store.meta.last_batch
        log.warning("%s restored from snapshot at batch %d in %.2fs", pid,
                    store.meta.last_batch, time.perf_counter() - t0)
