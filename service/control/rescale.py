"""`qstate state rescale JOB --partitions N`: change a job's partition count while the job
is stopped; its state stays queryable throughout.

Why it can be done offline, partition by partition: N is a multiple of the current count P,
and pmod(h, N) mod P = pmod(h, P), so each key of old partition p lands in one of the new
partitions p, p + P, ..., p + (N/P - 1)P. Steps:

1. The job is down: its driver's lease in storage (``paths.driver_lease``) has not changed
   for ``lease_s``, as the standby judges it.
2. For each operator and old partition p: bring a scratch copy up to the newest recorded
   batch B (snapshot + deltas, as a new shard server would), copy the keys that move to
   p + jP into fresh stores and snapshot each to checkpoint storage as partition p + jP at
   batch B. Partition p itself is left as it is: it holds its own keys, and those that moved
   are never asked of it again (they expire with the window retention).
3. A new epoch of the assignment, signed ``rescale:``, gives the new partitions owners among
   the live shard servers; they restore them from those snapshots while routers still
   route by P (the spec is unchanged), so no read notices.
4. Once every new partition serves, and the job has not run meanwhile (no batch recorded
   since the split, no epoch written since ours), the spec says N: routers route by N from
   their next refresh, and every key finds its partition ready. A shard asked by a router
   that still routes by P answers from the old partition, which still holds the key.

The job then restarts from its checkpoint with ``--partitions N``; batches after B are
partitioned by N, and a batch the job runs again is skipped by every partition as before.
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
from rocksdict import WriteBatch

from qstate.control.placement import balance, servers_named
from qstate.core.address import PartitionId, partition_of
from qstate.core.errors import Fenced, InvalidRequest, Unavailable
from qstate.core.records import paths
from qstate.core.records.assignment import (
    Assignment,
    list_servers,
    load_assignment,
    save_assignment,
)
from qstate.core.records.catalog import manifest_batches
from qstate.core.records.operator import OperatorSpec, list_specs, save_spec
from qstate.core.records.storage import Storage
from qstate.core.transport.shard_client import ShardClients
from qstate.partition.files import partition_dir
from qstate.partition.layout import (
    DATA,
    INDEX,
    META,
    RANK,
    data_key_of_index,
    key_of_rank,
    parse_data_key,
)
from qstate.partition.meta import encode_meta
from qstate.shard.held import Held
from qstate.shard.recovery import Recovery
from qstate.shard.snapshot import Snapshotter
from qstate.shard.store import PartitionStore

__all__ = ["RESCALE", "Rescale", "job_is_down", "rescale"]

log = logging.getLogger(__name__)

RESCALE = "rescale:"  # the writer of the epoch it writes
_FLUSH = 50_000  # keys per RocksDB write batch while copying


def job_is_down(storage: Storage, job: str, lease_s: float,
                wait: Callable[[float], None] = time.sleep) -> bool:
    """Whether the job's driver beats no lease: it did not change for ``lease_s``."""
    def lease() -> bytes | None:
        try:
            return storage.read_bytes(paths.driver_lease(job))
        except FileNotFoundError:
            return None

    before = lease()
    wait(lease_s)
    return lease() == before


@dataclass
class Rescale:
    """One job's rescale; ``step`` reports progress (what, done, of)."""

    storage: Storage
    job: str
    partitions: int
    step: Callable[[str, int, int], None] = lambda what, done, total: None
    ready_timeout_s: float = 300.0

    def specs(self) -> list[OperatorSpec]:
        specs = [s for s in list_specs(self.storage) if s.job == self.job]
        if not specs:
            raise InvalidRequest(f"job {self.job!r} has no operators in storage")
        for s in specs:
            if self.partitions % s.partitions or self.partitions <= s.partitions:
                raise InvalidRequest(
                    f"{s.job}/{s.operator} has {s.partitions} partitions: --partitions must be "
                    f"a larger multiple of it ({2 * s.partitions}, {3 * s.partitions}, ...)")
            if self.partitions > 4096:
                raise InvalidRequest("partitions must be at most 4096")
        return specs

    def split(self, spec: OperatorSpec, scratch: Path) -> int:
        """Snapshot the new partitions of ``spec``'s operator; returns the batch (-1: none
        recorded yet, nothing to split)."""
        batches = manifest_batches(self.storage, spec.job, spec.operator)
        if not batches:
            return -1
        newest = batches[-1]
        epoch = load_assignment(self.storage, spec.job).epoch  # what the batches applied at
        recovery = Recovery(self.storage, scratch / "old", lambda j, o: spec, lambda j: epoch,
                            1.0)
        with ThreadPoolExecutor(1) as pool:
            snapshots = Snapshotter(self.storage, scratch / "snap", 1, 1 << 30, pool)
            for p in range(spec.partitions):
                self.step(f"{spec.operator}: splitting", p, spec.partitions)
                old = PartitionId(spec.job, spec.operator, p)
                held = Held(PartitionStore(partition_dir(scratch / "old", old), spec))
                recovery.catch_up(old, held, newest, batches)
                targets = range(p + spec.partitions, self.partitions, spec.partitions)
                new = {q: PartitionStore(partition_dir(
                    scratch / "new", PartitionId(spec.job, spec.operator, q)), spec)
                    for q in targets}
                self._copy(held.store, new)
                for q, store in new.items():
                    snapshots.take(store, PartitionId(spec.job, spec.operator, q))
                    store.close()
                held.store.close()
        self.step(f"{spec.operator}: splitting", spec.partitions, spec.partitions)
        return newest

    def _copy(self, old: PartitionStore, new: dict[int, PartitionStore]) -> None:
        """The keys of ``old`` whose partition is now one of ``new``'s, with its meta."""
        writes = {q: WriteBatch(raw_mode=True) for q in new}
        pending = 0
        items: Iterator[tuple[bytes, bytes]] = old.db.items()  # type: ignore[assignment]  # raw mode
        for k, v in items:
            if k[:1] == DATA:
                key = parse_data_key(k).key
            elif k[:1] == INDEX:
                key = parse_data_key(data_key_of_index(k)).key
            elif k[:1] == RANK:
                key = key_of_rank(k)
            else:
                continue
            q = partition_of(key, self.partitions)
            if q in writes:
                writes[q].put(k, v)
                pending += 1
            if pending >= _FLUSH:
                for q2, wb in writes.items():
                    new[q2].db.write(wb)
                writes = {q2: WriteBatch(raw_mode=True) for q2 in new}
                pending = 0
        meta = encode_meta(old.meta)
        for q, wb in writes.items():
            wb.put(META, meta)
            new[q].db.write(wb)
            new[q].meta = old.meta  # frozen: shared safely

    def assign(self, specs: list[OperatorSpec]) -> Assignment:
        """The next epoch: owners for every new partition among the servers that answer."""
        a = load_assignment(self.storage, self.job)
        clients = ShardClients()
        live: dict[str, str] = {}
        try:
            for info in list_servers(self.storage):
                try:
                    d = clients.describe(info.address, timeout=5.0)
                except grpc.RpcError:
                    continue
                live[d.server_id] = d.address
        finally:
            clients.close()
        if not live:
            raise Unavailable("no shard server answers: start them before rescaling")
        owners = {op: list(ids) for op, ids in a.owners.items()}
        for s in specs:
            current = [sid if sid in live else "" for sid in a.owners.get(s.operator, [])]
            owners[s.operator] = balance(current, self.partitions, list(live))
            # the old partitions stay where they are, served all along
            for p, sid in enumerate(a.owners.get(s.operator, [])):
                if sid in live:
                    owners[s.operator][p] = sid
        # copies of the old partitions stay (a coordinator adds the new ones' when it runs)
        followers = {op: [[f for f in fs if f in live] for fs in per] +
                     [[] for _ in range(len(owners[op]) - len(per))]
                     for op, per in a.followers.items()}
        incoming = {op: [sid if sid in live else "" for sid in per] +
                    [""] * (len(owners[op]) - len(per)) for op, per in a.incoming.items()}
        new = Assignment(self.job, a.epoch + 1, servers_named(owners, followers, live), owners,
                         f"{RESCALE}{socket.gethostname()}-{os.getpid()}", followers, incoming)
        if not save_assignment(self.storage, new):
            raise Fenced(f"another coordinator of {self.job} wrote epoch {new.epoch} "
                         "meanwhile: is the job (or `qstate coordinator`) running? Run again "
                         "once it is stopped")
        return new

    def wait_ready(self, a: Assignment, specs: list[OperatorSpec]) -> None:
        """Until every new partition is served (its owner's Describe says so)."""
        wanted = {(s.operator, p) for s in specs
                  for p in range(s.partitions, self.partitions)}
        deadline = time.monotonic() + self.ready_timeout_s
        clients = ShardClients()
        try:
            while True:
                ready: set[tuple[str, int]] = set()
                for address in set(a.servers.values()):
                    try:
                        d = clients.describe(address, timeout=5.0)
                    except grpc.RpcError:
                        continue
                    ready |= {(i.operator, i.partition) for i in d.partitions
                              if i.job == self.job and not i.restoring
                              and a.owner_id(i.operator, i.partition) == d.server_id}
                self.step("new partitions serving", len(wanted & ready), len(wanted))
                if wanted <= ready:
                    return
                if time.monotonic() > deadline:
                    raise Unavailable(f"{len(wanted - ready)} new partitions not serving "
                                      f"after {self.ready_timeout_s:g}s, e.g. "
                                      f"{sorted(wanted - ready)[:3]}; the spec still says the "
                                      "old count, so nothing is lost: run again")
                time.sleep(0.2)
        finally:
            clients.close()

    def run(self) -> list[OperatorSpec]:
        specs = self.specs()
        split: dict[str, int] = {}
        with tempfile.TemporaryDirectory(prefix="qstate-rescale-") as tmp:
            for s in specs:
                split[s.operator] = self.split(s, Path(tmp) / s.operator)
                log.warning("%s/%s: new partitions snapshotted at batch %d", s.job,
                            s.operator, split[s.operator])
        a = self.assign(specs)
        self.wait_ready(a, specs)
        # the job must not have run meanwhile: a batch recorded since the split, or an epoch
        # a coordinator wrote since ours, and the new partitions would miss it
        since = {s.operator: (manifest_batches(self.storage, self.job, s.operator) or [-1])[-1]
                 for s in specs}
        if since != split or load_assignment(self.storage, self.job).epoch != a.epoch:
            raise Fenced(f"{self.job} ran while it was rescaled (batches {split} then "
                         f"{since}); its spec still says the old count: stop it and run again")
        rescaled = [OperatorSpec(s.job, s.operator, s.key, s.states, self.partitions,
                                 s.window, s.retention_ms, s.replicas) for s in specs]
        for s in rescaled:
            save_spec(self.storage, s, rescale=True)
        return rescaled


def rescale(storage: Storage, job: str, partitions: int,
            step: Callable[[str, int, int], None] | None = None) -> list[OperatorSpec]:
    r = Rescale(storage, job, partitions)
    if step is not None:
        r.step = step
    return r.run()
