"""Feast over the demo's tweets job, for real (docs/feast.md, run): the page's repository
(``feature_store.yaml``, its feature views) is written as the page has it, pointed at a router
over the session's shards and a tweets job this module runs on the session's Kafka and Spark,
and ``feast apply``-ed by Feast's own command. Events of two hours are produced; what Feast
answers (``FeatureStore.get_online_features``, its async twin, the page's read block, and
``feast serve``'s ``/get-online-features`` over HTTP, a real process) is compared with counts
taken from the events Kafka acknowledged (``loadtest.truth``, which shares no code with
qstate). Then the job is stopped (its last batch still answers), and the router is stopped
(qstate's error, by name, never a zero).
"""

from __future__ import annotations

import ast
import asyncio
import os
import random
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pandas as pd
import pytest
from confluent_kafka import Producer

from loadtest.truth import window_counts
from qstate.client import Client
from qstate.embedded.guard import guarded
from qstate.embedded.ports import free_port, wait_for_port
from qstate.embedded.procs import Child, RouterProcess
from qstate.errors import Unavailable
from qstate.jobs.job import JobContext
from qstate.jobs.runtime.launch import RunningJob, start_job

# Feast over a job on Spark and a `feast serve` process, ~45 s: `make soak`, which CI runs
# (docs/architecture.md §9); tests/feast/test_store.py runs Feast over the shop in make test
pytestmark = pytest.mark.long

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
PAGE = (ROOT / "docs" / "feast.md").read_text()
BLOCKS = re.findall(r"```(yaml|python|bash)\n(.*?)```", PAGE, re.S)
HOUR = 3_600_000
OPERATOR = "per_tweet_1h"
# the page's ids, then ids it never names: digits, so that a feature view over an Int64 join
# key reads the same keys
SHOWN = ["tw-1", "tw-2"]
HIDDEN = [str(n) for n in random.Random(uuid.uuid4().int).sample(range(10**11, 10**12), 24)]
NEVER = str(10**12 + 7)  # no event: not found
TICK = "tick"  # the event that closes the hour before last (run)

# feature views only this test adds beside the page's: the same operator by an Int64 join
# key, and the hour that is over with a ttl it is always past (it ended over an hour ago)
EXTRA = """
from datetime import timedelta

from feast import Entity, FeatureView, Field, FileSource, ValueType
from feast.types import Int64, String

nums = FileSource(name="nums", path="data/tweets.parquet", timestamp_field="event_timestamp")
tweet_num = Entity(name="tweet_num", join_keys=["tweet_num"], value_type=ValueType.INT64)
tweet_hourly_by_num = FeatureView(
    name="tweet_hourly_by_num", entities=[tweet_num], source=nums,
    schema=[Field(name="tweet_num", dtype=Int64), Field(name="impressions", dtype=Int64),
            Field(name="clicks", dtype=Int64)])
tweet_id = Entity(name="tweet_id", join_keys=["tweet_id"], value_type=ValueType.STRING)
tweet_last_hour_strict = FeatureView(
    name="tweet_last_hour_strict", entities=[tweet_id], ttl=timedelta(hours=1), source=nums,
    schema=[Field(name="tweet_id", dtype=String), Field(name="impressions", dtype=Int64)])
"""
EXTRA_MAP = """    tweet_hourly_by_num: {{job: {job}, operator: per_tweet_1h}}
    tweet_last_hour_strict: {{job: {job}, operator: per_tweet_1h, window: closed}}
"""
FEATURES = ["tweet_hourly:impressions", "tweet_hourly:clicks",
            "tweet_last_hour:impressions_last_hour", "tweet_last_hour:clicks_last_hour",
            "tweet_last_hour_strict:impressions"]


@dataclass
class Run:
    job: str
    repo: Path
    running: RunningJob
    router: RouterProcess  # this module's own, stopped by the last test
    events: pd.DataFrame  # as Kafka acknowledged them: tweet_id, event, time
    closed_hour: int  # the start of the hour that is over
    stopped: bool = False

    def stop_job(self) -> None:
        if not self.stopped:
            self.stopped = True
            self.running.stop()

    def truth(self, key: str, window: str) -> tuple[int, int] | None:
        """The key's (impressions, clicks) in its newest hour (``latest``) or in the hour that
        is over (``closed``); None: it had no event there."""
        counts = [window_counts(self.events, "tweet_id", "time", HOUR,
                                where={"event": kind, "tweet_id": key})
                  for kind in ("impression", "url-click")]
        starts = set().union(*(set(c["start"]) for c in counts))
        start = max(starts, default=None) if window == "latest" else self.closed_hour
        if start not in starts:
            return None
        imp, clicks = (int(c.loc[c["start"] == start, "count"].sum()) for c in counts)
        return imp, clicks

    def expected(self, keys: list[str]) -> dict[str, list[int | None]]:
        """FEATURES of ``keys`` (full names), from the events."""
        latest = [self.truth(k, "latest") for k in keys]
        closed = [self.truth(k, "closed") for k in keys]
        return {"tweet_hourly__impressions": [t and t[0] for t in latest],
                "tweet_hourly__clicks": [t and t[1] for t in latest],
                "tweet_last_hour__impressions_last_hour": [t and t[0] for t in closed],
                "tweet_last_hour__clicks_last_hour": [t and t[1] for t in closed],
                "tweet_last_hour_strict__impressions": [None] * len(keys)}

    def store(self) -> Any:
        from feast import FeatureStore

        return FeatureStore(repo_path=str(self.repo))


def produce(producer: Producer, topic: str, rows: list[tuple[str, str, int]]) -> list[dict]:
    """The events, and what Kafka acknowledged of them."""
    out: list[dict] = []

    def delivered(err: object, msg: Any) -> None:
        assert err is None, err
        out.append(orjson.loads(msg.value()))

    for key, kind, ms in rows:
        producer.produce(topic, orjson.dumps({"tweet_id": key, "event": kind, "time": ms}),
                         key.encode(), on_delivery=delivered)
    assert producer.flush(30) == 0 and len(out) == len(rows)
    return out


def hour_of(keys: list[str], start: int, rng: random.Random) -> list[tuple[str, str, int]]:
    """One to five events of each key in the hour from ``start``, in time order, about a
    third of them clicks (so some hours have no impression: a count of 0, not a miss)."""
    rows = [(k, "url-click" if rng.random() < 0.33 else "impression",
             start + 20_000 + rng.randrange(HOUR - 40_000))
            for k in keys for _ in range(rng.randrange(1, 6))]
    return sorted(rows, key=lambda r: r[2])


def shell(block: str, repo: Path) -> subprocess.CompletedProcess[str]:
    """A block of the page, run in the repository as a user runs it (the venv's feast)."""
    return subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=repo,
                          env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"},
                          capture_output=True, text=True, timeout=180)


def write_repo(repo: Path, url: str, job: str, *swap: tuple[str, str]) -> None:
    """The page's repository at ``repo``, reading ``job`` from the router at ``url``, with
    this test's extra feature views (and ``swap``'s replacements in its yaml)."""
    yaml, features = BLOCKS[0][1], BLOCKS[1][1]
    assert "url: http://127.0.0.1:8000" in yaml and yaml.count("job: tweets") == 2
    yaml = yaml.replace("http://127.0.0.1:8000", url).replace("job: tweets", f"job: {job}")
    yaml = yaml.replace("  feature_views:\n", "  feature_views:\n" + EXTRA_MAP.format(job=job))
    for old, new in swap:
        assert old in yaml
        yaml = yaml.replace(old, new)
    (repo / "data").mkdir(parents=True, exist_ok=True)
    (repo / "feature_store.yaml").write_text(yaml)
    (repo / "features.py").write_text(features)
    (repo / "extra.py").write_text(EXTRA)


def test_the_page_has_the_blocks_this_test_runs() -> None:
    assert [k for k, _ in BLOCKS] == ["yaml", "python", "bash", "python", "bash"]
    assert BLOCKS[2][1].strip() == "feast apply"
    assert BLOCKS[4][1].startswith("feast serve --port 6566 &\n")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, spark, broker, storage_uri: str, shards
        ) -> Iterator[Run]:  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("feast")
    job, topic = f"feast_{uuid.uuid4().hex[:6]}", f"t-{uuid.uuid4().hex[:10]}"
    ctx = JobContext(broker.bootstrap, storage_uri, tmp / "ckpt", 4, "500 milliseconds",
                     topic=topic, job=job, shards=[s.address for s in shards])
    # a router of this module's own over the session's shards: the last test stops it
    router = RouterProcess.make(storage_uri, tmp / "logs", "feast-router").start_and_wait()
    running = start_job(spark, "tweets", ctx)
    rng = random.Random(7)
    # the hour before last (closed once the newest events move the watermark past its end)
    # and the last hour: both past, so no event is ahead of the clock
    closed = (int(time.time() * 1000) // HOUR - 2) * HOUR
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    run: Run | None = None
    try:
        # tw-1 and 16 hidden ids in the hour that is over, tw-2 and 16 in the last (8 in both)
        sent = produce(producer, topic, hour_of(["tw-1", *HIDDEN[:16]], closed, rng))
        running.process_all_available()  # counted before a later event moves the watermark
        sent += produce(producer, topic, hour_of(["tw-1", "tw-2", *HIDDEN[8:]],
                                                 closed + HOUR, rng))
        running.process_all_available()
        # a batch's watermark is the one Spark computed from the batches before it
        # (jobs/runtime/pipeline.py), so the hour before last is closed only in a batch after
        # the last hour's: one more event (of a key no test reads, at the newest time) runs it
        sent += produce(producer, topic, [(TICK, "impression", max(e["time"] for e in sent))])
        running.process_all_available()
        repo = tmp / "repo"
        write_repo(repo, router.url, job)
        applied = shell(BLOCKS[2][1], repo)  # the page's `feast apply`
        assert applied.returncode == 0, applied.stdout + applied.stderr
        run = Run(job, repo, running, router, pd.DataFrame(sent), closed)
        yield run
    finally:
        if run is None:
            running.stop()
        else:
            run.stop_job()
        router.stop()


def read(store: Any, keys: list[str]) -> dict[str, list[Any]]:
    return store.get_online_features(features=FEATURES, full_feature_names=True,
                                     entity_rows=[{"tweet_id": k} for k in keys]).to_dict()


def test_get_online_features_answers_the_counts_of_the_events_produced(run: Run) -> None:
    keys = [*HIDDEN, NEVER]
    want = run.expected(keys)
    assert want["tweet_hourly__clicks"].count(None) == 1  # only NEVER: each id had events
    assert 0 < want["tweet_last_hour__impressions_last_hour"].count(None) < len(keys)
    store = run.store()
    got = read(store, keys)
    assert {f: got[f] for f in want} == want
    got = asyncio.run(store.get_online_features_async(
        features=FEATURES, full_feature_names=True,
        entity_rows=[{"tweet_id": k} for k in keys])).to_dict()
    assert {f: got[f] for f in want} == want
    # the same keys by an Int64 join key: their decimal digits
    nums = store.get_online_features(
        features=["tweet_hourly_by_num:impressions", "tweet_hourly_by_num:clicks"],
        entity_rows=[{"tweet_num": int(k)} for k in keys]).to_dict()
    assert [nums["impressions"], nums["clicks"]] == [want["tweet_hourly__impressions"],
                                                     want["tweet_hourly__clicks"]]


def test_the_event_timestamp_is_the_windows_end(run: Run) -> None:
    # in the hour that is over only; in the last hour only; never
    keys = [HIDDEN[0], HIDDEN[-1], NEVER]
    assert [run.truth(k, w) is None for k in keys for w in ("latest", "closed")] == [
        False, False, False, True, True, True]
    resp = run.store().get_online_features(features=FEATURES[:3], full_feature_names=True,
                                           entity_rows=[{"tweet_id": k} for k in keys])
    stamps = {name: [ts.ToMilliseconds() for ts in r.event_timestamps] for name, r in zip(
        resp.proto.metadata.feature_names.val, resp.proto.results, strict=True)}
    over, last = run.closed_hour + HOUR, run.closed_hour + 2 * HOUR  # the two hours' ends
    assert stamps["tweet_hourly__clicks"] == [over, last, 0]  # 0: no timestamp
    assert stamps["tweet_last_hour__impressions_last_hour"] == [over, 0, 0]


def test_the_pages_read_block_prints_the_counts(run: Run) -> None:
    r = shell(f"python - <<'EOF'\n{BLOCKS[3][1]}EOF", run.repo)
    assert r.returncode == 0, r.stderr
    printed = ast.literal_eval(r.stdout.strip().splitlines()[-1])
    want = run.expected(SHOWN)
    assert printed == {"tweet_id": SHOWN, "impressions": want["tweet_hourly__impressions"],
                       "clicks": want["tweet_hourly__clicks"],
                       "impressions_last_hour": want["tweet_last_hour__impressions_last_hour"]}
    assert printed["impressions_last_hour"][1] is None  # tw-2: no event in the hour over


@pytest.fixture(scope="module")
def serve(run: Run, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The page's `feast serve` line, on a free port, in the repository; its URL. Stopped
    by its PID."""
    line = BLOCKS[4][1].split("\n", 1)[0]
    port = free_port()
    line = line.rstrip(" &").replace("6566", str(port)).replace("feast ", f"{BIN}/feast ", 1)
    # under the guard: feast serve's gunicorn forks its worker, which no lifeline reaches
    server = Child("feast-serve", guarded(["bash", "-c", f"cd {run.repo} && exec {line}"]),
                   tmp_path_factory.mktemp("serve") / "serve.log").start()
    try:
        wait_for_port("127.0.0.1", port, 120, server.proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
        assert not server.alive()


def test_feast_serve_answers_the_same_over_http(run: Run, serve: str) -> None:
    curl = BLOCKS[4][1].split("\n", 1)[1]
    r = shell(curl.replace("http://127.0.0.1:6566", serve), run.repo)
    assert r.returncode == 0, r.stderr
    want = run.expected(SHOWN)
    assert columns(orjson.loads(r.stdout)) == {
        "tweet_id": SHOWN, "impressions": want["tweet_hourly__impressions"],
        "clicks": want["tweet_hourly__clicks"]}
    keys = [*HIDDEN, NEVER]
    got = httpx.post(f"{serve}/get-online-features", timeout=30, json={
        "features": FEATURES, "full_feature_names": True, "entities": {"tweet_id": keys}})
    assert got.status_code == 200, got.text
    assert {f: v for f, v in columns(got.json()).items() if f != "tweet_id"} == \
        run.expected(keys)


def columns(answer: dict[str, Any]) -> dict[str, list[Any]]:
    """feast serve's answer as feature -> values (a value not PRESENT as None)."""
    return {name: [v if s == "PRESENT" else None
                   for v, s in zip(col["values"], col["statuses"], strict=True)]
            for name, col in zip(answer["metadata"]["feature_names"], answer["results"],
                                 strict=True)}


def test_a_stopped_job_keeps_answering_its_last_batch(run: Run) -> None:
    run.stop_job()
    with Client(run.router.url) as c:
        stopped_at = c.describe(run.job).operators
    keys = [*HIDDEN, NEVER]
    got = read(run.store(), keys)
    assert {f: got[f] for f in run.expected(keys)} == run.expected(keys)
    with Client(run.router.url) as c:  # nothing moved: these were the last batch's answers
        assert c.describe(run.job).operators == stopped_at


def test_a_router_that_cannot_answer_is_unavailable_by_name_never_a_zero(
        run: Run, serve: str) -> None:
    store = run.store()
    ask = {"features": FEATURES[:2], "entities": {"tweet_id": HIDDEN[:2]}}
    assert httpx.post(f"{serve}/get-online-features", json=ask, timeout=30).status_code == 200
    run.router.stop()
    with pytest.raises(Unavailable, match=f"the qstate router at {run.router.url} cannot be "
                                          "reached") as caught:
        read(store, HIDDEN[:2])
    assert caught.value.reason == "router-unreachable"  # type: ignore[attr-defined]
    with pytest.raises(Unavailable):
        asyncio.run(store.get_online_features_async(
            features=FEATURES[:1], entity_rows=[{"tweet_id": HIDDEN[0]}]))
    # feast serve: the class's status and a body naming it
    r = httpx.post(f"{serve}/get-online-features", json=ask, timeout=30)
    body = orjson.loads(orjson.loads(r.content)) if r.content.startswith(b'"') else r.json()
    assert (r.status_code, body["class"], body["module"]) == (
        503, "Unavailable", "qstate.feast.errors"), r.text
    assert "cannot be reached" in body["message"]
