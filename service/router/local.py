"""In-process reads of partitions whose shard server runs on this host
(docs/architecture.md §5).

A unary Python gRPC hop costs ~280 µs of CPU a side; a RocksDB read ~2 µs. For a shard on
the same host the router opens each partition as a RocksDB *secondary* instance and reads
it directly. Freshness: the shard rewrites a small marker file ("incarnation batch") after
every commit; a read compares it (one small file read) and catches the secondary up with
the WAL only when it changed, or reopens it after a restore. Safety: only partitions the
owner reports ready (Describe, every ``ping_s``) and only while the owner's process is
alive; anything else goes over gRPC, which gives the right 503.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rocksdict import AccessType, Options, Rdict

from qstate.core.address import PartitionId
from qstate.core.assignment import ServerInfo
from qstate.core.config import DEFAULTS
from qstate.core.operator import OperatorSpec
from qstate.partition.codec import Codec
from qstate.partition.files import MARKER, Marker, file_signature, partition_dir, read_marker
from qstate.partition.meta import Meta, read_meta
from qstate.partition.reader import WindowValue, read_many

__all__ = ["LocalReader"]

log = logging.getLogger(__name__)
Key = tuple[str, PartitionId]  # owner's address, partition


# A read stats the marker (one syscall) and reads it only when its signature changed, or
# when it was last read this long ago: an inode reused within the file system's timestamp
# tick could hide a rewrite, for at most this long (docs/architecture.md §5).
MARKER_RECHECK_S = 0.1


@dataclass
class _Secondary:
    db: Rdict
    marker: Marker
    # the batch it holds: a secondary changes only when this reader catches it up (on the
    # event loop's thread, as every read), so reads between two catch-ups need no snapshot
    meta: Meta
    signature: tuple[int, int, int] = (0, 0, 0)
    read_at: float = float("-inf")  # monotonic time the marker was last read


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class LocalReader:
    def __init__(self, scratch: Path) -> None:
        self.hostname = socket.gethostname()
        self.scratch = scratch
        self.servers: dict[str, ServerInfo] = {}  # address -> co-located server
        self.ready: dict[str, set[PartitionId]] = {}
        self._dbs: dict[Key, _Secondary] = {}
        self._codecs: dict[tuple[str, str], Codec] = {}
        # a partition's directory under its owner's, and its marker file's path
        self._paths: dict[Key, tuple[Path, str]] = {}

    def set_servers(self, infos: list[ServerInfo]) -> None:
        local = {i.address: i for i in infos
                 if i.hostname == self.hostname and i.data_dir and Path(i.data_dir).is_dir()}
        for k in [k for k in self._dbs if k[0] not in local
                  or local[k[0]].pid != self.servers.get(k[0], local[k[0]]).pid]:
            self._close(k)
        self._paths = {k: p for k, p in self._paths.items()
                       if k[0] in local and local[k[0]] == self.servers.get(k[0])}
        self.servers = local

    def set_ready(self, address: str, partitions: set[PartitionId]) -> None:
        self.ready[address] = partitions
        for k in [k for k in self._dbs if k[0] == address and k[1] not in partitions]:
            self._close(k)

    def _close(self, k: Key) -> None:
        sec = self._dbs.pop(k, None)
        if sec is not None:
            sec.db.close()

    def close(self) -> None:
        for k in list(self._dbs):
            self._close(k)
        shutil.rmtree(self.scratch, ignore_errors=True)

    def _open(self, k: Key, path: Path, marker: Marker) -> _Secondary:
        self._close(k)
        opts = Options(raw_mode=True)
        opts.set_max_open_files(-1)  # required by secondary instances
        address, pid = k
        secondary = partition_dir(self.scratch / address.replace(":", "_"), pid)
        secondary.mkdir(parents=True, exist_ok=True)
        db = Rdict(str(path), opts, access_type=AccessType.secondary(str(secondary)))
        sec = _Secondary(db, marker, read_meta(db))
        self._dbs[k] = sec
        return sec

    def _follow(self, k: Key, path: Path, sec: _Secondary | None) -> _Secondary:
        """The secondary of ``path`` as of its marker: opened on a first read or a new
        incarnation, caught up with the WAL when the batch moved."""
        marker = read_marker(path)
        if sec is None or sec.marker[0] != marker[0]:
            return self._open(k, path, marker)  # first read, or a new incarnation
        if sec.marker != marker:
            sec.db.try_catch_up_with_primary()
            sec.marker, sec.meta = marker, read_meta(sec.db)
            if sec.meta.last_batch < marker[1]:
                # seen after a flush+checkpoint on a restored primary: the WAL tail
                # was not followed; a fresh secondary sees everything
                return self._open(k, path, marker)
        return sec

    def _codec(self, spec: OperatorSpec) -> Codec:
        codec = self._codecs.get((spec.job, spec.operator))
        if codec is None or (codec.spec is not spec and codec.spec != spec):
            codec = self._codecs[(spec.job, spec.operator)] = Codec(spec)
        return codec

    def _secondary(self, address: str, pid: PartitionId) -> _Secondary | None:
        """The partition's secondary, caught up as of its marker, when its owner runs on
        this host and reports it ready; else None (ask the owner over gRPC). Raises when
        the files move under it (a restore, a drop)."""
        info = self.servers.get(address)
        if info is None or pid not in self.ready.get(address, ()):
            return None
        if not _pid_alive(info.pid):
            return None
        k = (address, pid)
        paths = self._paths.get(k)
        if paths is None:
            path = partition_dir(Path(info.data_dir), pid)
            paths = self._paths[k] = (path, str(path / MARKER))
        path, marker_file = paths
        signature = file_signature(marker_file)  # gone: not served from here (any more)
        sec = self._dbs.get(k)
        now = time.monotonic()
        if sec is None or sec.signature != signature or now - sec.read_at > MARKER_RECHECK_S:
            sec = self._follow(k, path, sec)
            sec.signature, sec.read_at = signature, now
        return sec

    def read_many(self, address: str, spec: OperatorSpec, pid: PartitionId,
                  keys: Sequence[str], rng: tuple[int, int] | None,
                  limit: int = DEFAULTS.max_windows
                  ) -> tuple[Meta, list[list[WindowValue]]] | None:
        """The answers of keys of one partition from the owner's files, as of one batch (the
        owner, the marker and the secondary are checked once for them all), or None: ask
        the owner over gRPC."""
        try:
            sec = self._secondary(address, pid)
            if sec is None:
                return None
            return read_many(sec.db, self._codec(spec), keys, rng, limit, sec.meta)
        except Exception as exc:  # files moving under us (restore, drop): use gRPC
            log.debug("local read of %s at %s failed: %s", pid, address, exc)
            self._close((address, pid))
            return None
