"""Delta files: the rows one batch brings to one partition of one operator
(docs/architecture.md §3).

Arrow IPC. Columns ``key, start, end`` (epoch ms; null for non-windowed state), ``tag`` (a
sliding window's pane tag, ``qstate.core.windows``; null otherwise), then per aggregate:

    count                    name            int64
    sum, min, max, value     name            int64 or double, null where no row had a value
    avg                      name__sum       double, and name__n int64
    approx_count_distinct    name            binary: an Apache DataSketches HLL sketch

In merge mode a row is a batch's partial aggregate of a (key, window) — of a (key, pane,
tag) for a sliding window, of a (key, session) for session windows; in spark-state mode it
is the new value. Written by Spark executors, read by shard servers.
"""

from __future__ import annotations

from collections.abc import Iterable

import orjson
import pyarrow as pa
import pyarrow.ipc as ipc

from qstate.core.address import PartitionId
from qstate.core.errors import DeltaMismatch
from qstate.core.records import paths
from qstate.core.records.operator import OperatorSpec
from qstate.core.records.storage import Storage

__all__ = ["STATES", "delta_fields", "delta_schema", "read_delta", "read_deltas", "write_delta"]

# The schema metadata key naming the aggregates a delta was written for (a JSON list): a
# column of an aggregate the operator declared since is read as no rows of it
STATES = b"qstate.states"


def _aggregate_fields(spec: OperatorSpec) -> list[tuple[str, list[pa.Field]]]:
    out: list[tuple[str, list[pa.Field]]] = []
    for name, a in spec.states.items():
        num = pa.int64() if a.type == "long" else pa.float64()
        if a.kind == "count":
            fields = [pa.field(name, pa.int64())]
        elif a.kind == "avg":
            fields = [pa.field(f"{name}__sum", pa.float64()), pa.field(f"{name}__n", pa.int64())]
        elif a.kind == "approx_count_distinct":
            fields = [pa.field(name, pa.binary())]
        else:  # sum, min, max, value: null where no input row had a value
            fields = [pa.field(name, num)]
        out.append((name, fields))
    return out


def delta_fields(spec: OperatorSpec) -> list[pa.Field]:
    """The per-aggregate columns of a delta file (after ``key, start, end, tag``)."""
    return [f for _, fields in _aggregate_fields(spec) for f in fields]


def delta_schema(spec: OperatorSpec) -> pa.Schema:
    return pa.schema([pa.field("key", pa.string(), nullable=False),
                      pa.field("start", pa.int64()), pa.field("end", pa.int64()),
                      pa.field("tag", pa.int64()), *delta_fields(spec)])


def write_delta(storage: Storage, pid: PartitionId, batch: int, table: pa.Table,
                fragment: int = 0, states: Iterable[str] | None = None) -> None:
    """``states``: the aggregates the operator declares as it is written (recorded in the
    file): a reader whose operator has declared more since reads their columns as no rows
    (docs/upgrading.md); a file without them is read strictly."""
    if states is not None:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                               STATES: orjson.dumps(list(states))})
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    storage.write_bytes(paths.delta(pid, batch, fragment), sink.getvalue().to_pybytes())


def read_deltas(storage: Storage, pid: PartitionId, batch: int, fragments: Iterable[int],
                spec: OperatorSpec | None = None) -> pa.Table:
    """Batch ``batch``'s delta for ``pid``: its fragments, one table (each checked against
    ``spec``'s delta schema when given)."""
    tables = [read_delta(storage, pid, batch, f, spec) for f in sorted(fragments)]
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)


def read_delta(storage: Storage, pid: PartitionId, batch: int, fragment: int = 0,
               spec: OperatorSpec | None = None) -> pa.Table:
    """One fragment of the delta of ``batch`` for ``pid``; DeltaMismatch naming the file if
    it is missing, cannot be decoded, or (given ``spec``) lacks a column of its schema.

    A file is validated in full once read: storage is outside this process, and a corrupt
    buffer that Arrow opened without complaint would otherwise be read as garbage (or out of
    bounds) when the rows are applied."""
    path = paths.delta(pid, batch, fragment)
    try:
        with storage.open_file(path) as f:
            table = ipc.open_file(f).read_all()
        table.validate(full=True)
    except FileNotFoundError:
        raise DeltaMismatch(f"delta file {path} of batch {batch} is missing from storage"
                            ) from None
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise DeltaMismatch(f"delta file {path} of batch {batch} is unreadable: {exc}") from None
    if spec is not None:
        want = delta_schema(spec)
        written = _written_for(table)
        for name, fields in _aggregate_fields(spec):
            # written before the aggregate was added to its operator (docs/upgrading.md): no
            # row had a value of it
            if written is not None and name not in written:
                for f in fields:
                    if table.schema.get_field_index(f.name) < 0:
                        table = table.append_column(f, pa.nulls(table.num_rows, f.type))
        wrong = [f"{f.name} ({f.type})" for f in want
                 if table.schema.get_field_index(f.name) < 0
                 or table.schema.field(f.name).type != f.type]
        if wrong:
            raise DeltaMismatch(f"delta file {path} of batch {batch} does not fit operator "
                                f"{spec.job}/{spec.operator}: missing or mistyped columns "
                                f"{', '.join(wrong)}")
        if table.column("key").null_count:
            raise DeltaMismatch(f"delta file {path} of batch {batch} has rows without a key")
    return table


def _written_for(table: pa.Table) -> set[str] | None:
    """The aggregates a delta file says it was written for; None (every one the reader's
    operator declares: read strictly) if it does not say."""
    raw = (table.schema.metadata or {}).get(STATES)
    try:
        names = orjson.loads(raw) if raw is not None else None
    except orjson.JSONDecodeError:
        return None
    return {n for n in names if isinstance(n, str)} if isinstance(names, list) else None
