"""Writing a batch's rows of one operator as delta files, on the executors (DESIGN §3.3).

The rows are grouped by ``partition(key)`` (Spark's ``pmod(xxhash64(key), P)``, the function
of ``service.core.address``) and each executor task writes one Arrow file per partition it
holds. A re-run batch rewrites the same files with the same rows.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from service.core import delta as deltas
from service.core.address import PartitionId
from service.core.operator import OperatorSpec
from service.core.storage import Storage

__all__ = ["write_deltas"]


def _writer(spec: OperatorSpec, storage_uri: str, batch: int
            ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The mapInArrow function that runs on executors: one file per partition."""
    schema = deltas.delta_schema(spec)

    def write(it: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        batches = list(it)
        if not batches:
            return
        table = pa.Table.from_batches(batches)
        if table.num_rows == 0:
            return
        storage = Storage(storage_uri)
        table = table.sort_by([("_p", "ascending")])
        parts = table.column("_p").to_numpy()
        # boundaries of runs of equal partition ids in the sorted column
        cuts = [0, *((parts[1:] != parts[:-1]).nonzero()[0] + 1).tolist(), len(parts)]
        out_p, out_n = [], []
        body = table.drop_columns(["_p"]).select(schema.names).cast(schema)
        for lo, hi in itertools.pairwise(cuts):
            p = int(parts[lo])
            deltas.write_delta(storage, PartitionId(spec.job, spec.operator, p), batch,
                               body.slice(lo, hi - lo))
            out_p.append(p)
            out_n.append(hi - lo)
        yield pa.RecordBatch.from_arrays(
            [pa.array(out_p, pa.int32()), pa.array(out_n, pa.int64())], ["partition", "rows"])

    return write


def write_deltas(rows: DataFrame, spec: OperatorSpec, storage_uri: str, batch: int,
                 tasks: int) -> dict[int, int]:
    """Write ``rows`` (``key, start, end, tag`` and the aggregate columns) as batch
    ``batch``'s delta files; returns partition -> rows written."""
    p = F.pmod(F.xxhash64(F.col("key")), F.lit(spec.partitions)).cast("int")
    frame = rows.withColumn("_p", p).repartition(min(tasks, spec.partitions), "_p")
    written = frame.mapInArrow(_writer(spec, storage_uri, batch),
                               "partition int, rows long").collect()
    return {r["partition"]: r["rows"] for r in written}
