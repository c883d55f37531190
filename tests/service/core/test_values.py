"""A window's value keeps its declared type on every path: typed once by the aggregate
(``Aggregate.typed``), carried unchanged by both protos (``qstate.core.transport.values``)."""

from __future__ import annotations

import pytest

from qstate.core.records.operator import Aggregate
from qstate.core.transport.values import set_value, value_of
from qstate.proto import qstate_pb2, shard_pb2


@pytest.mark.parametrize("kind,declared,raw,want", [
    ("sum", "long", 7.0, 7), ("avg", "double", 3, 3.0), ("avg", "long", 2.5, 2),
    ("max", "double", None, None), ("count", "long", 2**62, 2**62),
])
def test_declared_type_decides(kind: str, declared: str, raw, want) -> None:
    got = Aggregate(kind, declared).typed(raw)  # type: ignore[arg-type]
    assert got == want and type(got) is type(want)


@pytest.mark.parametrize("msg", [shard_pb2.Window, qstate_pb2.Window])
@pytest.mark.parametrize("value", [0, -(2**63), 2**63 - 1, 0.0, -1.5, 1e300, None])
def test_both_protos_carry_the_value_and_its_type(msg, value) -> None:
    w = msg()
    set_value(w, value)
    back = value_of(msg.FromString(w.SerializeToString()))
    assert back == value and type(back) is type(value)
