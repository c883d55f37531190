"""QStateOnlineStore over the session's shop (tests/shop.py: ``shop/views_1m`` committed for
three batches, known values): more keys than one batch read takes, a double state, the
closed window, writes refused, ``feast apply`` refusing a mapping by name, teardown leaving
the state, and a shard that cannot answer (docs/feast.md)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from feast import Entity, FeatureStore, FeatureView, Field, FileSource, ValueType
from feast.types import Float64, Int64, String

from qstate.client import Client
from qstate.errors import InvalidRequest, Unavailable
from tests.shop import KEYS, MANY, SPEC, WINDOW, Shop, avg_ms, views

PAGE = Entity(name="page", join_keys=["page"], value_type=ValueType.STRING)
SOURCE = FileSource(name="pages", path="data/pages.parquet", timestamp_field="event_timestamp")
LATEST = FeatureView(name="page_latest", entities=[PAGE], source=SOURCE, schema=[
    Field(name="page", dtype=String), Field(name="views", dtype=Int64),
    Field(name="avg_ms", dtype=Float64)])
CLOSED = FeatureView(name="page_closed", entities=[PAGE], source=SOURCE, schema=[
    Field(name="page", dtype=String), Field(name="views_before", dtype=Int64)])
LAST = 2  # the shop's last batch; its window is [2, 3) minutes, its watermark 2 minutes


def repo(at: Path, url: str, retries: int = 3, swap: dict[str, str] | None = None
         ) -> FeatureStore:
    """A Feast repository over the shop at ``url``, its views applied (``swap``: words of
    its yaml replaced)."""
    yaml = f"""project: shop
registry: {at}/registry.db
provider: local
online_store:
  type: qstate.feast.QStateOnlineStore
  url: {url}
  retries: {retries}
  batch_keys: 1000
  feature_views:
    page_latest: {{job: shop, operator: views_1m}}
    page_closed: {{job: shop, operator: views_1m, window: closed,
                   states: {{views_before: views}}}}
offline_store:
  type: file
entity_key_serialization_version: 3
"""
    for old, new in (swap or {}).items():
        assert old in yaml
        yaml = yaml.replace(old, new)
    at.mkdir(parents=True, exist_ok=True)
    (at / "feature_store.yaml").write_text(yaml)
    store = FeatureStore(repo_path=str(at))
    store.apply([PAGE, SOURCE, LATEST, CLOSED])
    return store


@pytest.fixture(scope="module")
def store(shop: Shop, tmp_path_factory: pytest.TempPathFactory) -> FeatureStore:
    return repo(tmp_path_factory.mktemp("feast-shop"), shop.routers["local"].url)


def features(store: FeatureStore, keys: list[str], names: list[str]) -> dict[str, Any]:
    return store.get_online_features(features=names,
                                     entity_rows=[{"page": k} for k in keys]).to_dict()


def test_more_keys_than_a_batch_read_takes_in_one_call(store: FeatureStore) -> None:
    keys = KEYS + MANY  # 6,203: the router takes 1,000 a request (QSTATE_MAX_BATCH_KEYS)
    got = features(store, keys, ["page_latest:views", "page_latest:avg_ms"])
    assert got["views"] == [views(k, LAST) for k in keys]
    assert got["avg_ms"] == [avg_ms(LAST)] * len(keys)  # a double state as Float64


def test_the_closed_window_is_the_one_before_the_watermark(store: FeatureStore) -> None:
    resp = store.get_online_features(features=["page_closed:views_before"],
                                     entity_rows=[{"page": k} for k in KEYS[:5]])
    assert resp.to_dict()["views_before"] == [views(k, LAST - 1) for k in KEYS[:5]]
    [stamps] = [[t.ToMilliseconds() for t in r.event_timestamps]
                for r in resp.proto.results[1:]]
    assert stamps == [LAST * WINDOW] * 5  # the end of batch 1's window, ≤ the watermark


def test_writes_are_refused_naming_the_job(store: FeatureStore) -> None:
    rows = pd.DataFrame({"page": ["page-0"], "views": [1], "avg_ms": [0.0],
                         "event_timestamp": [datetime.now(UTC)]})
    with pytest.raises(InvalidRequest, match="'page_latest' is served by qstate from "
                                             "shop/views_1m: the streaming job writes"):
        store.write_to_online_store("page_latest", rows)
    assert features(store, ["page-0"], ["page_latest:views"])["views"] == [views("page-0",
                                                                                  LAST)]


def test_apply_refuses_what_the_router_does_not_serve(shop: Shop, tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest) as caught:
        repo(tmp_path, shop.routers["local"].url,
             swap={"job: shop, operator: views_1m}": "job: shop, operator: views_2m}",
                   "states: {views_before: views}": "states: {views_before: likes}"})
    said = str(caught.value)
    assert "feature view 'page_latest': job 'shop' has no operator 'views_2m' (it has " \
           "['views_1m'])" in said
    assert "feature 'views_before' reads state 'likes', which shop/views_1m does not have " \
           "(it has ['avg_ms', 'views'])" in said


def test_teardown_leaves_the_jobs_state(shop: Shop, tmp_path: Path) -> None:
    repo(tmp_path, shop.routers["local"].url).teardown()
    with Client(shop.routers["local"].url) as c:
        latest = c.get(SPEC.job, SPEC.operator, "views", "page-3").latest
    assert latest is not None and latest.value == views("page-3", LAST)


def test_a_shard_that_cannot_answer_is_unavailable_never_a_zero(shop: Shop,
                                                                tmp_path: Path) -> None:
    store = repo(tmp_path, shop.routers["local"].url, retries=1)
    with shop.shard_down(shop.shards[0]) as key:
        with pytest.raises(Unavailable) as caught:
            features(store, [key, "page-1"], ["page_latest:views"])
        assert caught.value.detail.get("partition") is not None, caught.value.detail
