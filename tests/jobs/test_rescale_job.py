"""`qstate state rescale` between two runs of a real Spark job (issue 11, item 5): the
tweets job runs at P=4 and stops; its state is split to P=8 while the shards keep serving;
the job restarts from its checkpoint at P=8. Every (key, window), of events before and
after the rescale, equals ground truth computed from the events produced."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.truth import load_events, window_counts
from qstate.control.rescale import rescale
from qstate.core.records.assignment import load_assignment
from qstate.core.records.operator import load_spec
from qstate.core.records.storage import Storage
from qstate.embedded.generate import produce
from qstate.jobs.examples.workloads import Tweets, events_over_span
from qstate.jobs.job import JobContext
from tests.helpers import http_windows, read_all_windows
from tests.jobs.test_exactness import BOUNDARY, HOUR, as_map, drain

P, NEW_P = 4, 8


# a second job on Spark: `make soak` (CI; docs/architecture.md §9)
@pytest.mark.long
def test_the_tweets_job_goes_on_exact_after_its_partition_count_doubles(
        spark, broker, topic, tmp_path: Path, storage_uri, shards, router) -> None:
    log = tmp_path / "events.jsonl"
    wl = Tweets(keys=800, seed=7)
    job = f"rs{topic[-6:]}"

    def context(partitions: int) -> JobContext:
        return JobContext(broker.bootstrap, storage_uri, tmp_path / "ckpt", partitions,
                          "0 seconds", max_rows_per_trigger=8_000, topic=topic, job=job,
                          shards=[s.address for s in shards])

    t0 = BOUNDARY - 7 * 60_000
    produce(broker.bootstrap, topic, events_over_span(wl, 20_000, t0_ms=t0, span_ms=240_000,
                                                      disorder_ms=5_000, seed=1),
            log_path=log, progress=False)
    drain(spark, context(P))
    storage = Storage(storage_uri)
    before = load_assignment(storage, job)
    assert {len(ids) for ids in before.owners.values()} == {P}

    rescaled = rescale(storage, job, NEW_P)  # the job is stopped
    assert {(s.operator, s.partitions) for s in rescaled} == {
        ("per_tweet_1h", NEW_P), ("per_tweet_1m", NEW_P)}
    after = load_assignment(storage, job)
    assert after.epoch == before.epoch + 1 and after.writer.startswith("rescale:")
    assert {len(ids) for ids in after.owners.values()} == {NEW_P}

    produce(broker.bootstrap, topic, events_over_span(wl, 20_000, t0_ms=t0 + 241_000,
                                                      span_ms=240_000, disorder_ms=5_000,
                                                      seed=2),
            log_path=log, progress=False)
    drain(spark, context(NEW_P))  # from its checkpoint, at the new count

    events = load_events(log)
    assert len(events) == 40_000
    keys = sorted(events["tweet_id"].unique())
    hourly = as_map(window_counts(events, "tweet_id", "time", HOUR,
                                  where={"event": "impression"}), "tweet_id")
    got, batches = read_all_windows(storage_uri, job, "per_tweet_1h", "impressions", keys,
                                    NEW_P)
    assert {k: v for k, v in got.items() if v} == hourly
    assert len(batches) == 1  # every partition, old and new, at the same last batch
    minute = as_map(window_counts(events, "tweet_id", "time", 60_000, 10_000,
                                  where={"event": "impression"}), "tweet_id")
    got_min, _ = read_all_windows(storage_uri, job, "per_tweet_1m", "impressions", keys,
                                  NEW_P)
    assert got_min == minute
    spec = load_spec(storage, job, "per_tweet_1m")
    assert spec is not None and spec.partitions == NEW_P
    # and through the router, which routes by the new count
    assert http_windows(router.url, job, "per_tweet_1m", "impressions", keys) == minute
