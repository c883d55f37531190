"""The OpenAPI document states what the router serves: every answer of every route, success
and error alike, validates against the schema documented for its status code, and no route
answers a status it does not document."""

from __future__ import annotations

from typing import Any

import httpx
import jsonschema
import pytest

from tests.shop import KEYS, ROUTES, Shop

STATE = "/v1/state/{job}/{operator}/{state}/{key}"
BATCH = "/v1/state/{job}/{operator}/{state}:batchGet"
STATES = "/v1/state/{job}/{operator}:batchGet"
JOBS = "/v1/jobs"
JOB = "/v1/jobs/{job}"
CLUSTER = "/v1/cluster"


@pytest.fixture(scope="module")
def doc(shop: Shop) -> dict[str, Any]:
    r = httpx.get(f"{shop.routers['local'].url}/openapi.json")
    assert r.status_code == 200
    return dict(r.json())


def documented(doc: dict[str, Any], template: str, method: str, status: int) -> dict[str, Any]:
    responses = doc["paths"][template][method]["responses"]
    assert str(status) in responses, f"{method.upper()} {template} answers {status}, " \
                                     f"documents only {sorted(responses)}"
    return dict(responses[str(status)])


def check(doc: dict[str, Any], template: str, method: str, r: httpx.Response) -> None:
    spec = documented(doc, template, method, r.status_code)
    schema = spec["content"]["application/json"]["schema"]
    jsonschema.validate(r.json(), {**schema, "components": doc["components"]})
    for header in spec.get("headers", {}):
        assert header.lower() in r.headers, f"{header} documented, not sent"


def test_no_422_is_documented(doc: dict[str, Any]) -> None:
    for ops in doc["paths"].values():
        for op in ops.values():
            assert "422" not in op["responses"]


@pytest.mark.parametrize("route", ROUTES)  # local reads on and off
def test_every_answer_matches_its_documented_schema(shop: Shop, doc: dict[str, Any],
                                                    route: str) -> None:
    url = shop.routers[route].url
    state = f"{url}/v1/state/shop/views_1m/views"
    with httpx.Client(timeout=10) as c:
        for r in (c.get(f"{state}/{KEYS[0]}"),  # 200
                  c.get(f"{state}/{KEYS[0]}", params={"from": "0", "to": "999999999"}),
                  c.get(f"{state}/never-written"),  # 404 with the batch
                  c.get(f"{url}/v1/state/sh%20op/views_1m/views/k"),  # 400
                  c.get(f"{state}/k", params={"from": "soon"})):
            check(doc, STATE, "get", r)
        for body in ({"keys": [KEYS[0], "nope"]}, {"keys": 5}, {"nokeys": 1}, ["k"]):
            check(doc, BATCH, "post", c.post(f"{state}:batchGet", json=body))
        check(doc, BATCH, "post", c.post(f"{state}:batchGet", content=b"{not json",
                                         headers={"content-type": "application/json"}))
        for body in ({"keys": [KEYS[0], "nope"], "states": ["views", "avg_ms"]},
                     {"keys": [KEYS[0]], "states": []}, {"keys": [KEYS[0]], "states": ["no"]},
                     {"keys": [KEYS[0]]}):
            check(doc, STATES, "post", c.post(f"{url}/v1/state/shop/views_1m:batchGet",
                                              json=body))
        check(doc, JOBS, "get", c.get(f"{url}/v1/jobs"))
        check(doc, JOB, "get", c.get(f"{url}/v1/jobs/shop"))
        check(doc, JOB, "get", c.get(f"{url}/v1/jobs/nope"))
        check(doc, JOB, "get", c.get(f"{url}/v1/jobs/bad%20name"))
        check(doc, CLUSTER, "get", c.get(f"{url}{CLUSTER}"))


def test_503_matches_its_documented_schema_and_header(shop: Shop, doc: dict[str, Any]) -> None:
    with shop.shard_down(shop.shards[1]) as key:
        for router in shop.routers.values():  # local reads on and off
            url = f"{router.url}/v1/state/shop/views_1m/views"
            r = httpx.get(f"{url}/{key}", timeout=10)
            assert r.status_code == 503
            check(doc, STATE, "get", r)
            b = httpx.post(f"{url}:batchGet", json={"keys": [key]}, timeout=10)
            assert b.status_code == 503
            check(doc, BATCH, "post", b)
            several = httpx.post(f"{router.url}/v1/state/shop/views_1m:batchGet",
                                 json={"keys": [key], "states": ["views", "avg_ms"]}, timeout=10)
            assert several.status_code == 503
            check(doc, STATES, "post", several)
