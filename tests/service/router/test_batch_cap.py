"""A batch's key cap is the one the router runs with (QSTATE_MAX_BATCH_KEYS), over HTTP and
gRPC alike, and its OpenAPI document states it: a router given a cap above the default takes
that many keys and refuses one more, in the same words on both protocols."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest

from qstate.core.config import DEFAULTS
from qstate.embedded.procs import RouterProcess
from qstate.proto import qstate_pb2 as qpb
from qstate.proto import qstate_pb2_grpc as qpb_grpc
from tests.shop import KEYS, Shop

CAP = DEFAULTS.max_batch_keys + 500  # not the default: the default hid the bug


@pytest.fixture(scope="module")
def capped(shop: Shop, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProcess]:
    with shop.router_with(tmp_path_factory.mktemp("capped"), "capped",
                          QSTATE_MAX_BATCH_KEYS=str(CAP)) as r:
        yield r


def keys(n: int) -> list[str]:
    return [KEYS[i % len(KEYS)] if i < len(KEYS) else f"absent-{i}" for i in range(n)]


def test_http_takes_the_configured_cap_and_refuses_one_more(capped: RouterProcess) -> None:
    url = f"{capped.url}/v1/state/shop/views_1m/views:batchGet"
    full = httpx.post(url, json={"keys": keys(CAP)}, timeout=30)
    assert full.status_code == 200, full.text[:300]
    assert len(full.json()["results"]) == CAP
    over = httpx.post(url, json={"keys": keys(CAP + 1)}, timeout=30)
    assert over.status_code == 400 and over.json()["error"] == "InvalidRequest"
    assert f"{CAP + 1} keys: at most {CAP} per request" in over.json()["message"]
    doc = httpx.get(f"{capped.url}/openapi.json").json()
    spec = doc["components"]["schemas"]["BatchGetIn"]["properties"]["keys"]
    assert spec["maxItems"] == CAP and f"At most {CAP} keys" in spec["description"]


def test_grpc_takes_the_configured_cap_and_refuses_one_more(capped: RouterProcess) -> None:
    with grpc.insecure_channel(capped.grpc_address) as ch:
        stub = qpb_grpc.QueryableStateStub(ch)
        op: dict[str, Any] = {"job": "shop", "operator": "views_1m", "state": "views"}
        full = stub.MultiGet(qpb.MultiGetRequest(**op, keys=keys(CAP)), timeout=30)
        assert len(full.results) == CAP
        with pytest.raises(grpc.RpcError) as over:
            stub.MultiGet(qpb.MultiGetRequest(**op, keys=keys(CAP + 1)), timeout=30)
    assert over.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert f"{CAP + 1} keys: at most {CAP} per request" in over.value.details()  # type: ignore[attr-defined]
