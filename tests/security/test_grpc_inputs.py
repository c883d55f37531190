"""Malformed requests to the router's public gRPC API get INVALID_ARGUMENT with a message
that says what to fix, and nothing generated gets an internal error: a real router (the
shop's, reading shards over gRPC) over a real channel."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qstate.proto import qstate_pb2 as qpb
from qstate.proto import qstate_pb2_grpc as qpb_grpc
from tests.shop import KEYS, SPEC, Shop

pytestmark = pytest.mark.security

OP: dict[str, Any] = {"job": SPEC.job, "operator": SPEC.operator, "state": "views"}
INVALID = grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture(scope="module")
def stub(shop: Shop) -> Iterator[qpb_grpc.QueryableStateStub]:
    with grpc.insecure_channel(shop.routers["grpc"].grpc_address) as ch:
        yield qpb_grpc.QueryableStateStub(ch)


def _refusal(call: Any, request: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=10)
    return info.value


GETS = [
    ({**OP, "job": "", "key": "k"}, 'invalid job ""'),
    ({**OP, "operator": "a/b", "key": "k"}, 'invalid operator "a/b"'),
    ({**OP, "state": ".hidden", "key": "k"}, "not starting with . or -"),
    ({**OP, "key": ""}, "empty key"),
    ({**OP, "key": "k" * 1025}, "at most 1024"),
    ({**OP, "key": "é" * 513}, "1026 bytes"),
    ({**OP, "key": "k", "from_ms": 10, "to_ms": 10}, "empty time range"),
    ({**OP, "key": "k", "from_ms": 0, "limit": 0}, "1 to 10000"),
    ({**OP, "key": "k", "from_ms": 0, "limit": 10_001}, "1 to 10000"),
]


@pytest.mark.parametrize(("fields", "says"), GETS)
def test_a_malformed_get_is_invalid_argument_saying_what_to_fix(
        stub: qpb_grpc.QueryableStateStub, fields: dict[str, Any], says: str) -> None:
    err = _refusal(stub.Get, qpb.GetRequest(**fields))
    assert err.code() == INVALID  # type: ignore[attr-defined]
    assert says in err.details(), err.details()  # type: ignore[attr-defined]


def test_malformed_batches_and_job_names_are_invalid_argument(
        stub: qpb_grpc.QueryableStateStub) -> None:
    too_many = _refusal(stub.MultiGet, qpb.MultiGetRequest(**OP, keys=KEYS[:1] * 1001))
    assert too_many.code() == INVALID  # type: ignore[attr-defined]
    assert "1001 keys: at most 1000" in too_many.details()  # type: ignore[attr-defined]
    one_bad = _refusal(stub.MultiGet, qpb.MultiGetRequest(**OP, keys=[KEYS[0], "x" * 2000]))
    assert one_bad.code() == INVALID  # type: ignore[attr-defined]
    assert "2000 bytes" in one_bad.details()  # type: ignore[attr-defined]
    job = _refusal(stub.DescribeJob, qpb.DescribeJobRequest(job="../etc"))
    assert job.code() == INVALID  # type: ignore[attr-defined]


def test_a_message_over_the_body_limit_is_refused_by_size(
        stub: qpb_grpc.QueryableStateStub) -> None:
    # 1000 keys of 1.1 KB: over the router's 1 MiB (QSTATE_MAX_BODY_BYTES) before parsing
    err = _refusal(stub.MultiGet, qpb.MultiGetRequest(
        **OP, keys=[f"{i:04d}" + "k" * 1100 for i in range(1000)]))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]


NAMES = st.sampled_from([SPEC.job, SPEC.operator, "views", "", "x" * 65, "a b", "..", "ok"]) | \
    st.text(max_size=70)
TIMES = st.none() | st.integers(-(2**63), 2**63 - 1)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(job=NAMES, operator=NAMES, state=NAMES,
       key=st.sampled_from(KEYS[:3]) | st.text(max_size=1100), lo=TIMES, hi=TIMES,
       limit=st.none() | st.integers(0, 2**32 - 1))
def test_any_get_is_answered_or_refused_for_a_reason(
        stub: qpb_grpc.QueryableStateStub, job: str, operator: str, state: str, key: str,
        lo: int | None, hi: int | None, limit: int | None) -> None:
    req = qpb.GetRequest(job=job, operator=operator, state=state, key=key)
    for name, value in (("from_ms", lo), ("to_ms", hi), ("limit", limit)):
        if value is not None:
            setattr(req, name, value)
    try:
        stub.Get(req, timeout=10)
    except grpc.RpcError as err:
        code = err.code()  # type: ignore[attr-defined]
        assert code in (INVALID, grpc.StatusCode.NOT_FOUND), (code, err.details())  # type: ignore[attr-defined]
        assert err.details()  # type: ignore[attr-defined]
