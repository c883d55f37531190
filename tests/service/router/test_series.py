"""What dashboards read (Grafana's Infinity datasource): a key's windows as flat points
``[{"time", "value"}]`` from ``/v1/series``, and time ranges relative to now (``now-1h``) or
in epoch ms (Grafana's ``${__from}``/``${__to}``), against a real router over the shop
deployment (tests/shop.py)."""

from __future__ import annotations

import httpx
import jsonschema
import pytest

from qstate._engine import parse_time
from qstate.core.errors import InvalidRequest
from tests.shop import BATCHES, BIG, KEYS, WINDOW, Shop, avg_ms, views, window

NOW = 1_767_225_600_000
FAR = 1 << 62  # an open end of a range: every time is clamped within it
SERIES = "/v1/series/{job}/{operator}/{state}/{key}"


@pytest.mark.parametrize(("text", "expected"), [
    ("now", NOW), ("now-1h", NOW - 3_600_000), ("now-30m", NOW - 1_800_000),
    ("now-15s", NOW - 15_000), ("now-250ms", NOW - 250), ("now-2d", NOW - 2 * 86_400_000),
    ("now-1w", NOW - 7 * 86_400_000), ("now+5m", NOW + 300_000),
    ("now 5m", NOW + 300_000),  # "+" not percent-encoded arrives as a space
    (" now-1h ", NOW - 3_600_000), ("1767225600000", NOW), ("2026-01-01T00:00:00Z", NOW),
])
def test_relative_epoch_and_iso_times(text: str, expected: int) -> None:
    assert parse_time("from", text, now_ms=NOW) == expected


@pytest.mark.parametrize("text", ["now-1", "now-h", "now-1y", "now/d", "yesterday", "now-1h-"])
def test_a_time_it_does_not_know_is_refused_naming_the_forms(text: str) -> None:
    with pytest.raises(InvalidRequest, match="now-1h"):
        parse_time("from", text, now_ms=NOW)


@pytest.mark.parametrize("text", ["now-999999999999w", "now+999999999999w",
                                  "-" + "9" * 19, "9" * 19])
def test_times_beyond_any_window_are_open_ends_not_overflows(text: str) -> None:
    assert -FAR <= parse_time("from", text, now_ms=NOW) <= FAR


@pytest.mark.parametrize("text", ["now-9999999999999w", "9" * 20, "-" + "9" * 40])
def test_times_longer_than_the_documented_pattern_are_a_clear_400(text: str) -> None:
    with pytest.raises(InvalidRequest, match="at most 19 digits"):
        parse_time("from", text, now_ms=NOW)


@pytest.mark.parametrize("route", ["local", "grpc"])
@pytest.mark.parametrize(("text", "words"), [
    ("²", "'limit' must be a whole number of windows"), ("٣", "must be a whole number"),
    ("1.5", "must be a whole number"), ("-1", "must be a whole number"),
    ("9" * 10, "must be a whole number"), ("0", "ask for 1 to 10000 windows"),
    ("10001", "ask for 1 to 10000 windows")])
def test_a_limit_that_is_not_one_is_a_clear_400(shop: Shop, route: str, text: str,
                                                words: str) -> None:
    path = SERIES.format(job="shop", operator="views_1m", state="views", key=KEYS[0])
    r = httpx.get(f"{shop.routers[route].url}{path}", params={"from": "0", "limit": text})
    assert r.status_code == 400 and words in r.json()["message"], r.text


def schema_of(doc: dict, template: str, status: int) -> dict:
    spec = doc["paths"][template]["get"]["responses"][str(status)]
    return {**spec["content"]["application/json"]["schema"], "components": doc["components"]}


def test_series_is_the_key_windows_as_points_and_matches_its_openapi_schema(shop: Shop) -> None:
    url = shop.routers["grpc"].url
    doc = httpx.get(f"{url}/openapi.json").json()
    with httpx.Client(base_url=url, timeout=10) as c:
        for key in (KEYS[0], BIG, "ünï/cødé key"):
            r = c.get(f"/v1/series/shop/views_1m/views/{key}",
                      params={"from": "0", "to": str(BATCHES * WINDOW)})
            assert r.status_code == 200, r.text
            jsonschema.validate(r.json(), schema_of(doc, SERIES, 200))
            assert r.json() == [{"time": window(b)[0], "value": views(key, b)}
                                for b in range(BATCHES)]
        # no range: the latest window alone, what a stat panel shows
        latest = c.get(f"/v1/series/shop/views_1m/avg_ms/{KEYS[1]}").json()
        assert latest == [{"time": window(BATCHES - 1)[0], "value": avg_ms(BATCHES - 1)}]
        # a key with no data is an empty series (a panel shows "no data", not an error)
        assert c.get("/v1/series/shop/views_1m/views/never-written").json() == []
        for bad in ("/v1/series/shop/nope/views/k", "/v1/series/sh%20op/views_1m/views/k"):
            r = c.get(bad)
            assert r.status_code in (400, 404)
            jsonschema.validate(r.json(), schema_of(doc, SERIES, r.status_code))


def test_grafana_time_ranges_relative_and_epoch_ms(shop: Shop) -> None:
    """The shop's windows lie in the first minutes of 1970: a range back from now that far
    holds all of them, the last hour none; Grafana's ${__from}/${__to} are epoch ms."""
    url = shop.routers["local"].url
    key = KEYS[2]
    every = [{"time": window(b)[0], "value": views(key, b)} for b in range(BATCHES)]
    with httpx.Client(base_url=url, timeout=10) as c:
        def series(**params: str) -> object:
            r = c.get(f"/v1/series/shop/views_1m/views/{key}", params=params)
            assert r.status_code == 200, r.text
            return r.json()

        assert series(**{"from": "now-30000w", "to": "now"}) == every
        assert series(**{"from": "now-1h", "to": "now"}) == []
        assert series(**{"from": "0", "to": str(2 * WINDOW)}) == every[:2]  # ${__from}/${__to}
        # the state and batchGet routes (and the fast path) take the same forms
        r = c.get(f"/v1/state/shop/views_1m/views/{key}", params={"from": "now-30000w"})
        assert [w["value"] for w in r.json()["windows"]] == [p["value"] for p in every]
        r = c.post("/v1/state/shop/views_1m/views:batchGet", json={"keys": [key]},
                   params={"from": "now-1h"})
        assert r.json()["results"][0]["windows"] == []
        r = c.get(f"/v1/series/shop/views_1m/views/{key}", params={"from": "now-1y"})
        assert r.status_code == 400 and "now-1h" in r.json()["message"]
