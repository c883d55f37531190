"""Delta files: the rows one batch changed in one partition of one operator (DESIGN §3.3).

Arrow IPC, columns ``key, start, end`` (epoch ms; null for non-windowed state) and one
column per state. Written by Spark executors, read by shard servers.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.ipc as ipc

from service.operator import OperatorSpec
from service.storage import Storage

_ARROW_TYPES = {"long": pa.int64(), "double": pa.float64()}


def delta_schema(spec: OperatorSpec) -> pa.Schema:
    return pa.schema(
        [pa.field("key", pa.string(), nullable=False),
         pa.field("start", pa.int64()), pa.field("end", pa.int64())]
        + [pa.field(name, _ARROW_TYPES[kind]) for name, kind in spec.states.items()]
    )


def delta_dir(storage: Storage, job: str, operator: str, partition: int) -> str:
    return storage.path("jobs", job, operator, "deltas", f"{partition:05d}")


def delta_name(batch: int) -> str:
    return f"{batch:020d}.arrow"


def batch_of(name: str) -> int:
    return int(name.split(".", 1)[0])


def write_delta(storage: Storage, spec: OperatorSpec, partition: int, batch: int,
                table: pa.Table) -> None:
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    path = f"{delta_dir(storage, spec.job, spec.operator, partition)}/{delta_name(batch)}"
    storage.write_bytes(path, sink.getvalue().to_pybytes())


def read_delta(storage: Storage, job: str, operator: str, partition: int, batch: int) -> pa.Table:
    path = f"{delta_dir(storage, job, operator, partition)}/{delta_name(batch)}"
    with storage.fs.open_input_file(path) as f:
        return ipc.open_file(f).read_all()


def delta_batches(storage: Storage, job: str, operator: str, partition: int) -> list[int]:
    return [batch_of(n) for n in storage.list_names(delta_dir(storage, job, operator, partition))
            if n.endswith(".arrow")]
