"""The layout of checkpoint storage: every path qstate writes there, and how names read back.

One room for it (docs/architecture.md §3-4). Paths are relative to the storage root::

    cluster/servers/{server_id}.json                   shard servers registered
    cluster/routers/{router_id}.json                   routers registered (the cluster map
                                                       names them as read addresses)
    cluster/assignments/{job}/{E}.json                 partition owners at the job's epoch E
                                                       (each epoch its own object, created
                                                       only if absent; the newest is in force)
    cluster/drivers/{job}.json                         the job's driver beating: while it
                                                       changes, a standby coordinator waits
    jobs/{job}/{op}/operator.json                      the operator's spec
    jobs/{job}/{op}/batches/{N}.json                   batch manifests (what batch N wrote)
    jobs/{job}/{op}/deltas/{p}/{N}-{f}.arrow           fragment f of batch N's delta for
                                                       partition p (f: the Spark task)
    jobs/{job}/{op}/snapshots/{p}/{N}.json             a snapshot of p as of batch N (written
                                                       last: a snapshot is whole or absent)
    jobs/{job}/{op}/snapshots/{p}/{N}/{file}           its small mutable RocksDB files
    jobs/{job}/{op}/snapshots/{p}/sst/{sha1}.sst       SST files, content-addressed, shared
    savepoints/{job}/{name}.json                       a savepoint: the job at one batch (its
                                                       snapshots and deltas kept for it)
    savepoints/{job}/{name}.pending.json               one being made (written first: it keeps
                                                       those files while they are checked)

``{N}`` is a batch id and ``{E}`` an epoch, both zero-padded to 20 digits, ``{p}`` and ``{f}``
numbers padded to 5, so names sort as numbers do.

Storage is outside this process (docs/architecture.md §7): a name read back from it (a
snapshot's file list) is used only once ``plain_path``/``plain_name`` have checked it stays
under its folder, and ``Storage`` checks every path it is given the same way.
"""

from __future__ import annotations

from collections.abc import Iterable

from qstate.core.address import PartitionId
from qstate.core.errors import CorruptState

__all__ = [
    "ARROW", "JSON", "assignment", "assignments_dir", "batch_name", "batch_of", "batches",
    "delta", "deltas_dir", "driver_lease", "jobs_dir", "legacy_assignment", "manifest",
    "manifests_dir", "operator_dir", "plain_name", "plain_path", "router", "routers_dir",
    "savepoint", "savepoint_pending", "savepoints_dir", "server", "servers_dir",
    "snapshot", "snapshot_member",
    "snapshots_dir", "spec", "sst_member",
]

JSON = ".json"
PENDING = ".pending.json"
ARROW = ".arrow"
SPEC_FILE = "operator.json"
_BATCH_DIGITS = 20


def plain_path(path: str, what: str = "storage path") -> str:
    """``path`` if it is relative and stays under its root: no empty, ``.`` or ``..``
    component, no backslash, NUL or control character; else CorruptState naming it."""
    parts = path.split("/")
    if not path or any(p in ("", ".", "..") for p in parts) or any(
            c == "\\" or ord(c) < 32 for c in path):
        raise CorruptState(f"{what} {path[:200]!r} is not a plain relative path under its "
                           "root: refused")
    return path


def plain_name(name: str, what: str = "file name") -> str:
    """``name`` if it is one plain path component (see ``plain_path``)."""
    if "/" in name:
        raise CorruptState(f"{what} {name[:200]!r} is not a plain file name: refused")
    return plain_path(name, what)


def batch_name(batch: int, suffix: str = "") -> str:
    return f"{batch:0{_BATCH_DIGITS}d}{suffix}"


def batch_of(name: str) -> int | None:
    """The batch id in a file name written by ``batch_name`` (and ``delta``); None for any
    other name."""
    stem = name.split(".", 1)[0].split("-", 1)[0]
    ok = len(stem) == _BATCH_DIGITS and stem.isascii() and stem.isdigit()
    return int(stem) if ok else None


def batches(names: Iterable[str], suffix: str) -> list[int]:
    """Batch ids of the names ending in ``suffix``, ascending."""
    return sorted(b for n in names if n.endswith(suffix) and (b := batch_of(n)) is not None)


def servers_dir() -> str:
    return "cluster/servers"


def server(server_id: str) -> str:
    return f"{servers_dir()}/{server_id}{JSON}"


def routers_dir() -> str:
    return "cluster/routers"


def router(router_id: str) -> str:
    return f"{routers_dir()}/{router_id}{JSON}"


def jobs_dir() -> str:
    return "jobs"


def assignments_dir(job: str) -> str:
    return f"cluster/assignments/{job}"


def assignment(job: str, epoch: int) -> str:
    return f"{assignments_dir(job)}/{batch_name(epoch)}{JSON}"


def driver_lease(job: str) -> str:
    return f"cluster/drivers/{job}{JSON}"


def legacy_assignment(job: str) -> str:
    """Where qstate 0.1 kept a job's one assignment file (read when no epoch object exists)."""
    return f"cluster/assignments/{job}{JSON}"


def operator_dir(job: str, operator: str) -> str:
    return f"jobs/{job}/{operator}"


def spec(job: str, operator: str) -> str:
    return f"{operator_dir(job, operator)}/{SPEC_FILE}"


def manifests_dir(job: str, operator: str) -> str:
    return f"{operator_dir(job, operator)}/batches"


def manifest(job: str, operator: str, batch: int) -> str:
    return f"{manifests_dir(job, operator)}/{batch_name(batch, JSON)}"


def deltas_dir(pid: PartitionId) -> str:
    return f"{operator_dir(pid.job, pid.operator)}/deltas/{pid.partition:05d}"


def delta(pid: PartitionId, batch: int, fragment: int) -> str:
    return f"{deltas_dir(pid)}/{batch_name(batch)}-{fragment:05d}{ARROW}"


def snapshots_dir(pid: PartitionId) -> str:
    return f"{operator_dir(pid.job, pid.operator)}/snapshots/{pid.partition:05d}"


def snapshot(pid: PartitionId, batch: int) -> str:
    return f"{snapshots_dir(pid)}/{batch_name(batch, JSON)}"


def snapshot_member(batch: int, file_name: str) -> str:
    """A small RocksDB file of the snapshot at ``batch``, relative to ``snapshots_dir``."""
    return f"{batch_name(batch)}/{file_name}"


def sst_member(sha1: str) -> str:
    """A content-addressed SST, relative to ``snapshots_dir``."""
    return f"sst/{sha1}.sst"


def savepoints_dir(job: str) -> str:
    return f"savepoints/{job}"


def savepoint(job: str, name: str) -> str:
    return f"{savepoints_dir(job)}/{name}{JSON}"


def savepoint_pending(job: str, name: str) -> str:
    return f"{savepoints_dir(job)}/{name}{PENDING}"
