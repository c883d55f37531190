"""Exactly once end to end on real components: Kafka -> Spark -> delta files -> shards.

Every (key, window) read back (from the shard servers, and through the router over HTTP and
gRPC) must equal ground truth computed with pandas from the events the generator logged as
delivered. Merge mode is the default; the last test runs the same job in spark-state mode
over the same topic and asserts both modes give the same answer for every window.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import grpc
import httpx
import pandas as pd
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from loadtest.truth import ads_campaign_views, load_events, window_counts
from qstate.core.process.start import serve_metrics
from qstate.core.transport.kafka import client_config
from qstate.embedded.generate import produce
from qstate.jobs.examples.workloads import (
    Ads,
    Tweets,
    events_over_span,
    late_events,
    write_mapping,
)
from qstate.jobs.job import JobContext
from qstate.jobs.parse import KINDS
from qstate.jobs.runtime.launch import start_job
from qstate.proto import qstate_pb2 as qpb
from qstate.proto import qstate_pb2_grpc as qpb_grpc
from tests.helpers import (
    Windows,
    grpc_windows,
    http_windows,
    latest_only,
    read_all_windows,
    scrape,
)

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


def oldest_open(watermark: int, size: int, slide: int) -> int:
    """The start of the oldest window still open at ``watermark`` (its end after it), by
    brute force over the window starts (multiples of ``slide``) near it."""
    starts = range((watermark - size) // slide * slide - slide, watermark + slide, slide)
    return min(s for s in starts if s + size > watermark)


def assert_top_answers(router, job: str, operator: str, state: str, want: Windows,
                       size: int, slide: int, n: int = 25, every: int = 1) -> None:
    """The top ``n`` of every ``every``-th window and of the last one through the router
    (HTTP and gRPC): the keys with the most, ties by key, as ground truth ranks them; and
    ``current`` is the oldest window still open at the watermark (docs/architecture.md §5),
    of the operator's ``size`` and ``slide``."""
    url = f"{router.url}/v1/top/{job}/{operator}/{state}"
    every_start = sorted({s for _, s in want})
    starts = sorted({*every_start[::every], every_start[-1]})

    def truth(start: int) -> list[tuple[str, int | float]]:
        return sorted(((k, v) for (k, s), v in want.items() if s == start and v),
                      key=lambda kv: (-kv[1], kv[0]))[:n]

    with httpx.Client(timeout=30) as c:
        for start in starts:
            r = c.get(url, params={"n": n, "window": start})
            assert r.status_code == 200, r.text
            assert [(e["key"], e["value"]) for e in r.json()["entries"]] == truth(start), start
        now = c.get(url, params={"n": n}).json()
    current = oldest_open(now["watermark"], size, slide)
    assert now["window"] == {"start": current, "end": current + size}, now["watermark"]
    assert [(e["key"], e["value"]) for e in now["entries"]] == truth(now["window"]["start"])
    with grpc.insecure_channel(router.grpc_address) as ch:
        rpc = qpb_grpc.QueryableStateStub(ch).Top(qpb.TopRequest(
            job=job, operator=operator, state=state, n=n, window_start_ms=starts[0]),
            timeout=30)
    assert [(e.key, e.int_value) for e in rpc.entries] == truth(starts[0])


@pytest.fixture(scope="module")
def job_metrics() -> str:
    """The /metrics page of this process, where the jobs these tests start run (as
    ``qstate job`` serves it)."""
    return f"http://127.0.0.1:{serve_metrics(0, '127.0.0.1')}"


def assert_job_metrics(url: str, router, job: str, topic: str, produced: int,
                       dead: Counter[str]) -> None:
    """The job's /metrics after its run, against what the run did: one count per batch,
    every record read once, the dead letters by reason, the watermark and last batch the
    shards serve (the router says), fresh, nothing behind, no partition moved, no key."""
    m = scrape(url)
    ops = {o["name"]: o for o in httpx.get(f"{router.url}/v1/jobs/{job}", timeout=10)
           .json()["operators"]}
    assert set(ops) == {"per_tweet_1h", "per_tweet_1m"}
    last = {op: m.value("qstate_job_last_batch", job=job, operator=op) for op in ops}
    assert last == {op: o["last_batch"] for op, o in ops.items()}
    batches = m.value("qstate_job_batches_total", job=job)
    assert batches == max(last.values()) + 1  # every batch id counted once: none re-ran
    assert m.value("qstate_job_events_total", job=job) == produced
    dead_series = {(s.labels["topic"], s.labels["reason"]): s.value
                   for s in m.matching("qstate_job_dead_lettered_total", job=job)}
    assert {k: v for k, v in dead_series.items() if v} == {
        (topic, reason): n for reason, n in dead.items()}
    # every reason has its series from the job's start: 0 on a dashboard, not "No data"
    assert set(dead_series) == {(topic, reason) for reason in KINDS}
    now = time.time()
    for op, o in ops.items():
        labels = {"job": job, "operator": op}
        assert m.value("qstate_job_watermark_ms", **labels) == o["watermark"]
        behind = m.value("qstate_job_freshness_seconds", **labels, kind="watermark")
        assert now - o["watermark"] / 1000 - 60 <= behind <= now - o["watermark"] / 1000
        assert 0 <= m.value("qstate_job_freshness_seconds", **labels, kind="commit") < 3600
        assert m.value("qstate_job_stage_seconds_count", **labels, stage="commit") == batches
    assert m.value("qstate_job_batch_seconds_count", job=job) == batches
    assert m.value("qstate_job_lag_events", job=job, topic=topic) == 0
    assert m.matching("qstate_job_lag_events", job=job, topic=topic)  # present, not absent
    assert m.value("qstate_job_reassignments_total", job=job) == 0
    assert m.value("qstate_job_assignment_epoch", job=job) >= 1
    for sample in m.samples:
        if sample.name.startswith("qstate_"):
            assert not any(v.startswith("tw-") for v in sample.labels.values()), sample


def dead_letters(bootstrap: str, topic: str) -> list[tuple[bytes | None, bytes | None, dict]]:
    """Every record of ``topic`` (key, value, headers), read with the deployment's Kafka
    properties (QSTATE_KAFKA_PROPERTIES) as qstate's own clients are."""
    c = Consumer(client_config(bootstrap, None, **{"group.id": f"dlq-{topic}",
                                                    "enable.auto.commit": False}))
    try:
        md = c.list_topics(topic, timeout=10).topics[topic]
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in md.partitions}
        c.assign([TopicPartition(topic, p, 0) for p in ends])
        out: list[tuple[bytes | None, bytes | None, dict]] = []
        while len(out) < sum(ends.values()):
            for m in c.consume(num_messages=sum(ends.values()) - len(out), timeout=5):
                assert m.error() is None
                headers = {str(k): bytes(v).decode()  # type: ignore[arg-type,str-unpack]
                           for k, v in m.headers() or []}
                out.append((m.key(), m.value(), headers))  # type: ignore[arg-type]
        return out
    finally:
        c.close()


# Records that parse into a live window if a parser is lenient: each must be dead-lettered.
BAD = [
    (b"tw-1", b'{"tweet_id": "tw-1", "event": "impression", "time": "1767226000000"}',
     "wrong_type"),  # time as a string of digits
    (b"tw-2", b'{"tweet_id": "tw-2", "event": "impression", "time": 1767226000000.5}',
     "wrong_type"),  # a double time
    (b"7", b'{"tweet_id": 7, "event": "impression", "time": 1767226000000}',
     "wrong_type"),  # a key of the wrong type
    (b"", b'{"tweet_id": "", "event": "impression", "time": 1767226000000}',
     "bad_key"),  # an empty key
    (b"tw-3", b'{"tweet_id": "tw-3", "event": "impression", "time": 1767226000000',
     "invalid_json"),
    (b"tw-4", b'{"tweet_id": "tw-4", "event": "impression"}', "missing_field"),
]


def drain(spark, cfg: JobContext, job: str = "tweets") -> Counter[str]:
    """Start the job on what the topic holds, process all of it, stop between batches;
    returns the records dead-lettered, by reason. Producing only while the job is stopped
    keeps Kafka's partitions aligned in event time within each capped batch: a producer
    racing a trigger can leave one partition minutes ahead of the others, and then Spark's
    watermark (a maximum over all of them) rightly makes the others' events late."""
    running = start_job(spark, job, cfg)
    try:
        running.process_all_available()
        assert set(running.behind().values()) == {0}, running.behind()  # read to the end
    finally:
        running.stop()
    return sum((Counter(r.dead_lettered) for rs in running.reports.values()
                for r in rs.batches), Counter())


def test_tweets_exact_with_out_of_order_late_and_bad_events(
        spark, broker, topic, tmp_path: Path, storage_uri, shards, router,
        job_metrics: str) -> None:
    log = tmp_path / "events.jsonl"
    wl = Tweets(keys=1500, seed=1)
    job_name = f"tw{topic[-6:]}"
    # capped batches: the disorder crosses watermark steps many times
    cfg = JobContext(broker.bootstrap, storage_uri, tmp_path / "ckpt", P, "0 seconds",
                     max_rows_per_trigger=8_000, topic=topic, job=job_name,
                     shards=[s.address for s in shards])
    # Phase A: 60K events over 10 min across an hour boundary, up to 5 s out of order
    # (inside the 10 s watermark delay, so every one must count).
    t0 = BOUNDARY - 7 * 60_000
    produce(broker.bootstrap, topic,
            events_over_span(wl, 60_000, t0_ms=t0, span_ms=600_000, disorder_ms=5_000, seed=1),
            log_path=log, progress=False)
    dead = drain(spark, cfg)
    # A batch of on-time events: the batch after it judges lateness by the watermark phase
    # A made (Spark's rule: batch N drops by batch N-1's watermark).
    produce(broker.bootstrap, topic,
            events_over_span(wl, 300, t0_ms=t0 + 600_000, span_ms=1_000, seed=4),
            log_path=log, progress=False)
    dead += drain(spark, cfg)
    # Phase B: 5K late events, 2-7 min behind the newest time: every window they fall in
    # (the hour before BOUNDARY, minutes before it) ended before the watermark.
    late = late_events(wl, 5_000, ref_ms=t0 + 600_000, late_by_ms=5 * 60_000,
                       spread_ms=5 * 60_000, seed=2)
    assert all(e["time"] < BOUNDARY - 60_000 for e in late)
    produce(broker.bootstrap, topic, late, log_path=tmp_path / "late.jsonl", progress=False)
    dead += drain(spark, cfg)
    # Phase C: 40K more in-order events, with records among them that a lenient parser
    # would count in live windows.
    produce(broker.bootstrap, topic,
            events_over_span(wl, 40_000, t0_ms=t0 + 601_000, span_ms=300_000,
                             disorder_ms=5_000, seed=3),
            log_path=log, progress=False)
    bad = Producer({"bootstrap.servers": broker.bootstrap})
    for key, value, _ in BAD:
        bad.produce(topic, value, key)
    assert bad.flush(10) == 0
    dead += drain(spark, cfg)

    events = load_events(log)
    assert len(events) == 100_300
    keys = sorted(events["tweet_id"].unique())
    assert len(keys) >= 1000

    # the dead-letter topic holds exactly the bad records, each with its reason and source
    # coordinates (a replayed batch may repeat one: then with identical coordinates)
    letters = dead_letters(broker.bootstrap, f"{topic}.dlq")
    by_value = {v: (k, h) for k, v, h in letters}
    assert sorted(v or b"" for v in by_value) == sorted(v for _, v, _ in BAD)
    for key, value, kind in BAD:
        got_key, headers = by_value[value]
        assert (got_key or b"", headers["qstate.kind"], headers["qstate.topic"]) == (
            key, kind, topic)
    coords = {(h["qstate.partition"], h["qstate.offset"]) for _, _, h in letters}
    assert len(coords) == len(BAD)  # duplicates, if any, carry the same coordinates
    assert sum(dead.values()) >= len(BAD) and set(dead) == {k for _, _, k in BAD}

    impressions = window_counts(events, "tweet_id", "time", HOUR,
                                where={"event": "impression"})
    clicks = window_counts(events, "tweet_id", "time", HOUR, where={"event": "url-click"})
    got_imp, batches = read_all_windows(storage_uri, job_name, "per_tweet_1h", "impressions",
                                        keys, P)
    got_clk, _ = read_all_windows(storage_uri, job_name, "per_tweet_1h", "clicks", keys, P)
    # one row per (key, hour) holds both states: zero where only the other kind happened
    assert {k: v for k, v in got_imp.items() if v} == as_map(impressions, "tweet_id")
    assert {k: v for k, v in got_clk.items() if v} == as_map(clicks, "tweet_id")
    assert len(batches) == 1  # every partition answered as of the same, last batch

    minute = as_map(window_counts(events, "tweet_id", "time", 60_000, 10_000,
                                  where={"event": "impression"}), "tweet_id")
    got_min, _ = read_all_windows(storage_uri, job_name, "per_tweet_1m", "impressions", keys, P)
    assert got_min == minute
    assert_router_answers(router, job_name, "per_tweet_1m", "impressions", keys, minute)
    assert_router_answers(router, job_name, "per_tweet_1h", "impressions", keys,
                          as_map(impressions, "tweet_id"))
    # top-N of a tumbling window (rank index) and of a sliding one (folded from panes),
    # after late events and across partitions, ties by key
    assert_top_answers(router, job_name, "per_tweet_1h", "impressions",
                       as_map(impressions, "tweet_id"), HOUR, HOUR)
    assert_top_answers(router, job_name, "per_tweet_1m", "impressions", minute, 60_000, 10_000,
                       every=4)
    # what the job's /metrics says it did: every record produced read once (the good, the
    # late and the bad ones), the dead letters by the reasons the reports give
    assert_job_metrics(job_metrics, router, job_name, topic,
                       len(events) + len(late) + len(BAD), dead)


def test_ads_exact_across_a_stop_and_restart(spark, broker, topic, tmp_path: Path,
                                             storage_uri, shards, router) -> None:
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
    drain(spark, cfg, "ads")
    produce(broker.bootstrap, topic,
            events_over_span(wl, 30_000, t0_ms=t0 + 120_000, span_ms=120_000,
                             disorder_ms=4_000, seed=6),
            log_path=log, progress=False)
    drain(spark, cfg, "ads")  # the same checkpoint: resumes after the last committed batch
    events = load_events(log)
    truth = ads_campaign_views(events, wl.mapping)
    campaigns = sorted(set(wl.mapping.values()))
    got, _ = read_all_windows(storage_uri, job_name, "campaign_views_10s", "views", campaigns, P)
    assert got == as_map(truth, "campaign_id")
    assert_router_answers(router, job_name, "campaign_views_10s", "views", campaigns,
                          as_map(truth, "campaign_id"))
    # unique users per campaign and window: a HyperLogLog estimate, within its error
    views = events[events["event_type"] == "view"].assign(
        campaign_id=lambda d: d["ad_id"].map(wl.mapping),
        start=lambda d: d["event_time"] - d["event_time"] % 10_000)
    distinct = views.groupby(["campaign_id", "start"])["user_id"].nunique()
    users, _ = read_all_windows(storage_uri, job_name, "campaign_views_10s", "users",
                                campaigns, P)
    assert set(users) == {(c, int(s)) for c, s in distinct.index}
    for (c, s), n in distinct.items():
        assert abs(users[(c, int(s))] - n) <= max(2, 0.05 * n), (c, s, users[(c, int(s))], n)


def test_merge_mode_answers_what_spark_stateful_aggregation_answers(
        spark, broker, topic, tmp_path: Path, storage_uri, shards) -> None:
    """Both modes over one topic, holding on-time events, then events 70-140 s behind the
    newest (late for some or all of their one-minute windows), then on-time events again.
    All of it is in the topic before either job starts, and batches are capped the same, so
    both see the same batches: every (key, window) must be equal."""
    wl = Tweets(keys=300, seed=9)
    log = tmp_path / "events.jsonl"
    t0 = BOUNDARY - 2 * 60_000
    produce(broker.bootstrap, topic, events_over_span(
        wl, 12_000, t0_ms=t0, span_ms=180_000, disorder_ms=3_000, seed=1),
        log_path=log, progress=False)
    produce(broker.bootstrap, topic, late_events(
        wl, 3_000, ref_ms=t0 + 180_000, late_by_ms=70_000, spread_ms=70_000, seed=2),
        log_path=log, progress=False)
    produce(broker.bootstrap, topic, events_over_span(
        wl, 12_000, t0_ms=t0 + 180_000, span_ms=180_000, disorder_ms=3_000, seed=3),
        log_path=log, progress=False)
    names = {}
    for mode in ("merge", "spark-state"):
        names[mode] = f"{mode[:5].replace('-', '')}{topic[-6:]}"
        cfg = JobContext(broker.bootstrap, storage_uri, tmp_path / f"ckpt-{mode}", P,
                         "0 seconds", max_rows_per_trigger=4_000, topic=topic,
                         job=names[mode], shards=[s.address for s in shards],
                         options={"mode": mode})
        drain(spark, cfg)
    events = load_events(log)
    keys = sorted(events["tweet_id"].unique())
    for operator, state in (("per_tweet_1h", "impressions"), ("per_tweet_1h", "clicks"),
                            ("per_tweet_1m", "impressions")):
        got_m, _ = read_all_windows(storage_uri, names["merge"], operator, state, keys, P)
        got_s, _ = read_all_windows(storage_uri, names["spark-state"], operator, state, keys, P)
        assert {k: v for k, v in got_m.items() if v} == {k: v for k, v in got_s.items() if v}, \
            (operator, state)
    # lateness mattered: some rows counted in some of their sliding windows and not others
    naive = as_map(window_counts(events, "tweet_id", "time", 60_000, 10_000,
                                 where={"event": "impression"}), "tweet_id")
    assert sum(got_m.values()) < sum(naive.values())
    assert any(got_m.get(w, 0) not in (0, n) for w, n in naive.items())
