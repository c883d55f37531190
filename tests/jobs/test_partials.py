"""``qstate.jobs.runtime.partials.aggregate`` on the executors (no JVM): a long sum that leaves
int64 within one task's rows is saturated at the bound it crossed, as the shard would keep it
(``qstate.partition.codec``), never Arrow's wrapped value (issue 25)."""

from __future__ import annotations

import pyarrow as pa

from qstate.core.records.operator import Aggregate, OperatorSpec, WindowSpec
from qstate.jobs.runtime.partials import INPUT, KEY, PART, TIME, Plan, aggregate

SPEC = OperatorSpec("j", "o", "k", {"s": Aggregate("sum", "long"),
                                    "d": Aggregate("sum", "double")},
                    partitions=1, window=WindowSpec("tumbling", 1000))
MAX, MIN = 2**63 - 1, -(2**63)


def sums(rows: list[tuple[str, int | None]]) -> dict[str, tuple[int | None, float | None]]:
    table = pa.table({
        PART: pa.array([0] * len(rows), pa.int32()), KEY: [k for k, _ in rows],
        TIME: pa.array([10] * len(rows), pa.int64()),
        INPUT(0): pa.array([v for _, v in rows], pa.int64()),
        INPUT(1): pa.array([None if v is None else float(v) for _, v in rows], pa.float64())})
    out = aggregate(table, Plan(SPEC, -1, 0))
    return {r["key"]: (r["s"], r["d"]) for r in out.to_pylist()}


def test_a_long_sum_past_int64_in_one_batch_is_saturated_not_wrapped() -> None:
    got = sums([("up", 2**62), ("up", 2**62), ("up", 5), ("down", MIN + 1), ("down", -2),
                ("fine", 2**62), ("fine", -(2**62)), ("fine", 7), ("none", None)])
    assert got["up"][0] == MAX and got["down"][0] == MIN  # Arrow alone gives MIN+5, MAX
    assert got["fine"][0] == 7 and got["none"][0] is None
    assert got["up"][1] == float(2**63 + 5)  # a double sum is only rounded
