"""A shard server's files on its local disk, read by the shard and by same-host routers.

    {data_dir}/{server_id}/{job}/{operator}/p{partition:05d}/   one RocksDB per partition
    .../p{partition:05d}/QSTATE_COMMITTED                       "{incarnation} {last batch}"

The marker is rewritten (atomically) after every commit. A router reading the partition
in-process as a RocksDB secondary compares it to decide whether to catch up with the WAL
(the batch changed) or reopen (a new incarnation: the directory was restored). A partition
that moved away has no marker: same-host readers must stop reading it at once.
"""

from __future__ import annotations

import os
from pathlib import Path

from qstate.core.address import PartitionId

__all__ = ["MARKER", "Marker", "file_signature", "partition_dir", "read_marker",
           "remove_marker", "write_marker"]

MARKER = "QSTATE_COMMITTED"
Marker = tuple[str, int]  # incarnation token, last batch


def partition_dir(server_dir: Path, pid: PartitionId) -> Path:
    return server_dir / pid.job / pid.operator / f"p{pid.partition:05d}"


def write_marker(path: Path, token: str, batch: int) -> None:
    tmp = path / f".{MARKER}.tmp"
    tmp.write_text(f"{token} {batch}")
    os.replace(tmp, path / MARKER)


def file_signature(file: str) -> tuple[int, int, int]:
    """What changes whenever a marker ``file`` is rewritten (a new file each time: its inode,
    mtime, size), for one ``stat`` instead of a read; FileNotFoundError like
    ``read_marker``."""
    st = os.stat(file)
    return st.st_ino, st.st_mtime_ns, st.st_size


def read_marker(path: Path) -> Marker:
    """Raises FileNotFoundError when the partition is not (or no longer) served from here."""
    token, batch = (path / MARKER).read_text().rsplit(" ", 1)
    return token, int(batch)


def remove_marker(path: Path) -> None:
    (path / MARKER).unlink(missing_ok=True)
