"""docs/own-job.md, run: its plain Spark job is built, its queryable job is saved as a module,
started as `qstate job` starts it, fed ad events of the demo's shape (with fields the job does
not declare, and a record it dead-letters) and read back through the router; its commands
run, the job's `qstate job` line standing for the job this test started. A page that drifts
from the code fails here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Producer

from qstate.client import Client
from qstate.jobs.job import JobContext
from qstate.jobs.runtime.launch import start_job
from tests.helpers import json_documents
from tests.jobs.test_exactness import dead_letters

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "own-job.md").read_text()
BLOCKS = re.findall(r"```(bash|python)\n(.*?)```", PAGE, re.S)


def test_the_page_has_the_blocks_this_test_runs() -> None:
    assert [k for k, _ in BLOCKS] == ["python", "python", "bash", "bash"]
    help_ = subprocess.run(["bash", "-euo", "pipefail", "-c", BLOCKS[2][1]], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert help_.returncode == 0 and "QueryableJob" in help_.stdout


def test_the_plain_spark_job_builds(spark, broker) -> None:
    scope: dict = {}
    exec(BLOCKS[0][1], scope)
    df = scope["ad_views"](spark, broker.bootstrap)
    assert df.isStreaming and df.columns == ["window", "ad_id", "views", "users"]


# After the first events, those of the window the page's board ranks ("current": the oldest
# window still open at the watermark, docs/architecture.md §5), with one 10 s past them that
# sets the watermark (10 s behind the newest event) to that window's start, so that the window
# of the first ones is final; then LAST, whose batch carries that watermark (a batch's is the
# one the batches before it set, Spark's rule: docs/architecture.md §3).
LATER = [("ad-3", "u4", "view", 51_000), ("ad-3", "u5", "view", 52_000),
         ("ad-3", "u6", "view", 53_000), ("ad-4", "u4", "view", 54_000),
         ("ad-4", "u5", "view", 55_000), ("ad-6", "u6", "view", 56_000),
         ("ad-5", "u7", "view", 57_000), ("ad-5", "u7", "click", 58_000),
         ("ad-9", "u9", "view", 60_000)]
LAST = [("ad-9", "u9", "view", 61_000)]


def current_board(t0: int) -> tuple[int, list[tuple[str, int]]]:
    """The current 10 s window's start, and its three ads with the most views (ties by ad)
    from LATER: a window is open while its end is past the watermark."""
    watermark = t0 + max(ms for *_, ms in LATER) - 10_000
    start = watermark // 10_000 * 10_000
    views = Counter(ad for ad, _, kind, ms in LATER
                    if kind == "view" and start <= t0 + ms < start + 10_000)
    return start, sorted(views.items(), key=lambda kv: (-kv[1], kv[0]))[:3]


# the page's job on Spark against truth: `make soak` (CI; §9)
@pytest.mark.long
def test_the_queryable_job_counts_what_it_says(spark, broker, topic: str, tmp_path: Path,
                                               storage_uri: str, shards, router) -> None:
    (tmp_path / "myads_doc.py").write_text(BLOCKS[1][1])
    sys.path.insert(0, str(tmp_path))
    job = f"doc{topic[-6:]}"
    ctx = JobContext(broker.bootstrap, storage_uri, tmp_path / "ckpt", 4, "500 milliseconds",
                     topic=topic, job=job, shards=[s.address for s in shards])
    try:
        running = start_job(spark, "myads_doc:build", ctx)
    finally:
        sys.path.remove(str(tmp_path))
    t0 = (int(time.time() * 1000) // 10_000 - 30) * 10_000  # a 10 s window, well closed
    events = [  # (ad, user, type, ms into the window): the demo's fields and more
        ("ad-1", "u1", "view", 1_000), ("ad-1", "u2", "view", 2_000),
        ("ad-1", "u1", "view", 3_000), ("ad-1", "u1", "click", 4_000),
        ("ad-2", "u3", "view", 5_000), ("ad-2", "u3", "view", 6_000)]
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    try:
        for ad, user, kind, ms in events:
            producer.produce(topic, orjson.dumps({
                "user_id": user, "page_id": "p", "ad_id": ad, "ad_type": "banner",
                "event_type": kind, "event_time": t0 + ms, "ip_address": "10.0.0.1"}),
                ad.encode())
        producer.produce(topic, b'{"ad_id": "ad-1"}', b"ad-1")  # no user_id: dead-lettered
        assert producer.flush(10) == 0
        running.process_all_available()  # counted before a later event moves the watermark
        for later in (LATER, LAST):  # LAST: in a batch of its own, after LATER's
            for ad, user, kind, ms in later:
                producer.produce(topic, orjson.dumps({
                    "user_id": user, "ad_id": ad, "event_type": kind,
                    "event_time": t0 + ms}), ad.encode())
            assert producer.flush(10) == 0
            running.process_all_available()
        with Client(router.url, timeout=30, retries=40, backoff_s=0.25) as c:
            views = {ad: c.get(job, "ad_views_10s", "views", ad).latest for ad in ("ad-1", "ad-2")}
            users = c.get(job, "ad_views_10s", "users", "ad-1").latest
            session = c.get(job, "user_sessions", "events", "u1").latest
        assert {ad: (w.start, w.value) for ad, w in views.items() if w} == {
            "ad-1": (t0, 3), "ad-2": (t0, 2)}
        assert users is not None and users.value == 2  # u1, u2
        assert session is not None and (session.start, session.value) == (t0 + 1_000, 3)
        [(key, _, headers)] = dead_letters(broker.bootstrap, f"{topic}.dlq")
        assert (key, headers["qstate.kind"]) == (b"ad-1", "missing_field")
        # the page's commands, against this router and this job (its first line started it)
        run = BLOCKS[3][1]
        assert run.splitlines()[0].startswith(".venv/bin/qstate job myads:build")
        commands = "\n".join(run.splitlines()[1:]).replace("localhost:8000", router.url[7:]) \
            .replace("myads", job)
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", commands], cwd=ROOT,
                           env=dict(os.environ), capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        described, board = json_documents(r.stdout)
        assert sorted((o["name"], o["window"]["kind"], o["window"]["size_ms"],
                       o["window"]["gap_ms"], o["partitions"])
                      for o in described["operators"]) == [
            ("ad_views_10s", "tumbling", 10_000, 0, 4), ("user_sessions", "session", 0,
                                                         30_000, 4)]
        start, top3 = current_board(t0)
        assert (board["job"], board["window"]) == (job, {"start": start, "end": start + 10_000})
        assert [(e["key"], e["value"]) for e in board["entries"]] == top3
    finally:
        running.stop()
