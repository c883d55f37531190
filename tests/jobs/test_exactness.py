"""Exactly-once end to end on real components: broker -> Spark -> delta files -> shards.

Every (key, window) read back from the shard servers must equal ground truth computed
with pandas from the events the generator logged as delivered.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from confluent_kafka import Producer

from jobs.examples.workloads import Ads, Tweets, events_over_span, late_events, write_mapping
from jobs.job import JobContext
from jobs.runner import start_job
from loadtest.truth import ads_campaign_views, load_events, window_counts
from service.embedded.generate import produce
from tests.helpers import Windows, grpc_windows, http_windows, latest_only, read_all_windows

pytestmark = pytest.mark.spark
P = 16
HOUR = 3_600_000
BOUNDARY = 1_767_225_600_000  # 2026-01-01T00:00Z, an hour boundary inside phase A


def as_map(df: pd.DataFrame, key: str, value: str = "count") -> Windows:
    return {(k, int(s)): int(v) for k, s, v in zip(df[key], df["start"], df[value], strict=True)}


def assert_router_answers(router, job: str, operator: str, state: str, keys: list[str],
                          want: Windows) -> None:
    """Every key via HTTP and gRPC: all windows (a time range) and the latest window."""
    assert http_windows(router.url, job, operator, state, keys) == want
    assert grpc_windows(router.grpc_address, job, operator, state, keys) == want
    latest = latest_only(want)
    assert http_windows(router.url, job, operator, state, keys, latest=True) == latest
    assert grpc_windows(router.grpc_address, job, operator, state, keys, latest=True) == latest


def test_tweets_exact_with_out_of_order_late_and_bad_events(
        spark, broker, topic, tmp_path: Path, storage_uri, shards, router):
    log = tmp_path / "events.jsonl"
    wl = Tweets(keys=1500, seed=1)
    job_name = f"tw{topic[-6:]}"
    cfg = JobContext(broker.bootstrap, storage_uri, tmp_path / "ckpt", P, "0 seconds",
                     topic=topic, job=job_name, shards=[s.address for s in shards])
    # Phase A: 60K events over 10 min across an hour boundary, up to 5 s out of order
    # (inside the 10 s watermark delay, so every one must count).
    t0 = BOUNDARY - 7 * 60_000
    produce(broker.bootstrap, topic,
            events_over_span(wl, 60_000, t0_ms=t0, span_ms=600_000, disorder_ms=5_000, seed=1),
            log_path=log, progress=False)
    job = start_job(spark, "tweets", cfg)
    try:
        job.process_all_available()
        # Phase B: 5K late events, 2-7 min behind the newest time: every window they fall in
        # (the hour before BOUNDARY, minutes before it) ended before the watermark.
        late = late_events(wl, 5_000, ref_ms=t0 + 600_000, late_by_ms=5 * 60_000,
                           spread_ms=5 * 60_000, seed=2)
        assert all(e["time"] < BOUNDARY - 60_000 for e in late)
        produce(broker.bootstrap, topic, late, log_path=tmp_path / "late.jsonl",
                progress=False)
        job.process_all_available()
        # Phase C: 40K more in-order events, with malformed records among them.
        produce(broker.bootstrap, topic,
                events_over_span(wl, 40_000, t0_ms=t0 + 600_000, span_ms=300_000,
                                 disorder_ms=5_000, seed=3),
                log_path=log, progress=False)
        bad = Producer({"bootstrap.servers": broker.bootstrap})
        for value in (b"{not json", b'{"tweet_id": "tw-1", "time": 1}',
                      b'{"tweet_id": "tw-1", "event": "impression", "time": "soon"}'):
            bad.produce(topic, value)
        assert bad.flush(10) == 0
        job.process_all_available()
    finally:
        job.stop()

    events = load_events(log)
    assert len(events) == 100_000
    keys = sorted(events["tweet_id"].unique())
    assert len(keys) >= 1000

    impressions = window_counts(events, "tweet_id", "time", HOUR,
                                where={"event": "impression"})
    clicks = window_counts(events, "tweet_id", "time", HOUR, where={"event": "url-click"})
    got_imp, batches = read_all_windows(storage_uri, job_name, "per_tweet_1h", "impressions",
                                        keys, P)
    got_clk, _ = read_all_windows(storage_uri, job_name, "per_tweet_1h", "clicks", keys, P)
    want_imp = as_map(impressions, "tweet_id")
    want_clk = as_map(clicks, "tweet_id")
    # one row per (key, hour) holds both states: zero where only the other kind happened
    assert {k: v for k, v in got_imp.items() if v} == want_imp
    assert {k: v for k, v in got_clk.items() if v} == want_clk
    assert len(batches) == 1  # every partition answered as of the same, last batch

    minute = window_counts(events, "tweet_id", "time", 60_000, 10_000,
                           where={"event": "impression"})
    got_min, _ = read_all_windows(storage_uri, job_name, "per_tweet_1m", "impressions", keys, P)
    assert got_min == as_map(minute, "tweet_id")
    assert_router_answers(router, job_name, "per_tweet_1m", "impressions", keys,
                          as_map(minute, "tweet_id"))
    assert_router_answers(router, job_name, "per_tweet_1h", "impressions", keys, got_imp)


def test_ads_exact_across_a_stop_and_restart(spark, broker, topic, tmp_path: Path,
                                             storage_uri, shards, router):
    wl = Ads(keys=100, seed=4)
    mapping = write_mapping(wl.mapping, tmp_path / "campaigns.json")
    log = tmp_path / "events.jsonl"
    job_name = f"ads{topic[-6:]}"
    cfg = JobContext(broker.bootstrap, storage_uri, tmp_path / "ckpt", P, "0 seconds",
                     max_rows_per_trigger=8_000, topic=topic, job=job_name,
                     shards=[s.address for s in shards], options={"mapping": str(mapping)})
    t0 = BOUNDARY
    produce(broker.bootstrap, topic,
            events_over_span(wl, 30_000, t0_ms=t0, span_ms=120_000, disorder_ms=4_000, seed=5),
            log_path=log, progress=False)
    job = start_job(spark, "ads", cfg)
    job.process_all_available()
    job.stop()  # between batches: processAllAvailable returned
    produce(broker.bootstrap, topic,
            events_over_span(wl, 30_000, t0_ms=t0 + 120_000, span_ms=120_000,
                             disorder_ms=4_000, seed=6),
            log_path=log, progress=False)
    job = start_job(spark, "ads", cfg)  # same checkpoint: resumes after the last committed batch
    try:
        job.process_all_available()
    finally:
        job.stop()
    truth = ads_campaign_views(load_events(log), wl.mapping)
    campaigns = sorted(set(wl.mapping.values()))
    got, _ = read_all_windows(storage_uri, job_name, "campaign_views_10s", "views", campaigns, P)
    assert got == as_map(truth, "campaign_id")
    assert_router_answers(router, job_name, "campaign_views_10s", "views", campaigns,
                          as_map(truth, "campaign_id"))
