"""Delta files: the rows one batch changed in one partition of one operator (DESIGN §3.3).

Arrow IPC, columns ``key, start, end`` (epoch ms; null for non-windowed state) and one
column per state. Written by Spark executors, read by shard servers.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.ipc as ipc

from service.core import paths
from service.core.address import PartitionId
from service.core.errors import DeltaMismatch
from service.core.operator import OperatorSpec
from service.core.storage import Storage

__all__ = ["delta_schema", "read_delta", "write_delta"]

_ARROW_TYPES = {"long": pa.int64(), "double": pa.float64()}


def delta_schema(spec: OperatorSpec) -> pa.Schema:
    return pa.schema(
        [pa.field("key", pa.string(), nullable=False),
         pa.field("start", pa.int64()), pa.field("end", pa.int64())]
        + [pa.field(name, _ARROW_TYPES[kind]) for name, kind in spec.states.items()]
    )


def write_delta(storage: Storage, pid: PartitionId, batch: int, table: pa.Table) -> None:
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    storage.write_bytes(paths.delta(pid, batch), sink.getvalue().to_pybytes())


def read_delta(storage: Storage, pid: PartitionId, batch: int) -> pa.Table:
    """The delta of ``batch`` for ``pid``; DeltaMismatch naming the file if it is missing or
    cannot be decoded."""
    path = paths.delta(pid, batch)
    try:
        with storage.open_file(path) as f:
            return ipc.open_file(f).read_all()
    except FileNotFoundError:
        raise DeltaMismatch(f"delta file {path} of batch {batch} is missing from storage"
                            ) from None
    except (pa.ArrowInvalid, OSError) as exc:
        raise DeltaMismatch(f"delta file {path} of batch {batch} is unreadable: {exc}") from None
