"""One request's work is bounded (issue 25): keys × limit windows of a range read at most
QSTATE_MAX_REQUEST_WINDOWS, over HTTP and gRPC alike. A batch range read without a limit gets
the most that fits (answers cut short say where to go on); one that asks for more is refused
with a 400 that names the budget and what to change. The shop's keys hold 3 windows each."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import httpx
import pytest

from qstate.embedded.procs import RouterProcess
from qstate.proto import qstate_pb2 as qpb
from qstate.proto import qstate_pb2_grpc as qpb_grpc
from tests.shop import BATCHES, KEYS, WINDOW, Shop

BUDGET = 10
FIVE = KEYS[:5]
RANGE = {"from": 0, "to": (BATCHES + 1) * WINDOW}


@pytest.fixture(scope="module")
def budgeted(shop: Shop, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProcess]:
    with shop.router_with(tmp_path_factory.mktemp("budget"), "budget",
                          QSTATE_MAX_REQUEST_WINDOWS=str(BUDGET)) as r:
        yield r


def test_http_gives_a_batch_the_windows_that_fit_and_refuses_more(budgeted: RouterProcess
                                                                   ) -> None:
    url = f"{budgeted.url}/v1/state/shop/views_1m/views:batchGet"
    fit = httpx.post(url, params=RANGE, json={"keys": FIVE}, timeout=30)
    assert fit.status_code == 200, fit.text[:300]
    results = fit.json()["results"]
    # 5 keys in a budget of 10: 2 windows each, and where the third starts
    assert [len(r["windows"]) for r in results] == [2] * 5
    assert all(r["next_from"] > r["windows"][-1]["start"] for r in results), results[0]
    assert httpx.post(url, params={**RANGE, "limit": 2}, json={"keys": FIVE},
                      timeout=30).status_code == 200
    over = httpx.post(url, params={**RANGE, "limit": 3}, json={"keys": FIVE}, timeout=30)
    assert over.status_code == 400 and over.json()["error"] == "InvalidRequest"
    assert "5 keys × limit 3 = 15 windows: one request reads at most 10 " \
        "(QSTATE_MAX_REQUEST_WINDOWS)" in over.json()["message"]
    # one key keeps its own bound (max_windows), the budget permitting
    one = httpx.get(f"{budgeted.url}/v1/state/shop/views_1m/views/{KEYS[0]}", params=RANGE)
    assert one.status_code == 200 and len(one.json()["windows"]) == BATCHES


def test_grpc_refuses_the_same_request_in_the_same_words(budgeted: RouterProcess) -> None:
    with grpc.insecure_channel(budgeted.grpc_address) as ch:
        stub = qpb_grpc.QueryableStateStub(ch)
        def ask(limit: int | None = None) -> qpb.MultiGetRequest:
            return qpb.MultiGetRequest(job="shop", operator="views_1m", state="views",
                                       keys=FIVE, from_ms=RANGE["from"], to_ms=RANGE["to"],
                                       limit=limit)

        fit = stub.MultiGet(ask(), timeout=30)
        assert [len(r.windows) for r in fit.results] == [2] * 5
        with pytest.raises(grpc.RpcError) as over:
            stub.MultiGet(ask(3), timeout=30)
    assert over.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert "= 15 windows: one request reads at most 10" in over.value.details()  # type: ignore[attr-defined]
