"""`qstate job` as a real process with two jobs over a real broker and a real shard server:
a job whose query fails is dropped while the other keeps committing, and a job that is up
but stalled (its shard frozen with SIGSTOP: busy, not dead) reports its lag growing, then
catches up. The stand-in tests in test_supervise.py and test_lag.py cover the edge cases.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from confluent_kafka import Producer

from qstate.embedded.ports import free_port
from qstate.embedded.procs import Child, ShardProcess, qstate_command
from tests.helpers import scrape, wait_until

# long (~80 s: two `qstate job` processes with their own JVMs): `make soak`, which CI runs
pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.long]

# Two jobs of one `qstate job` process: A is the tweets example on its own topic and name; B
# is a user's job with a bug, a filter that raises on the key "boom" (on the executors,
# like any user code), so its query fails when that record arrives.
JOBS_MODULE = '''
from dataclasses import replace

from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType

from qstate.jobs import aggregates as A
from qstate.jobs.examples import tweets
from qstate.jobs.parse import parse_events
from qstate.jobs.queryable import QueryableJob, dlq_topic
from qstate.jobs.source import read_kafka
from qstate.jobs.windows import window

TOPIC_A, TOPIC_B = "{a}", "{b}"


def build_a(spark, ctx):
    return tweets.build(spark, replace(ctx, job="sup_a", topic=TOPIC_A))


def _keep(key):
    if key == "boom":
        raise ValueError("the user's filter cannot handle the key 'boom'")
    return True


def build_b(spark, ctx):
    raw = read_kafka(spark, ctx.bootstrap, TOPIC_B,
                     max_offsets_per_trigger=ctx.max_rows_per_trigger)
    events = parse_events(raw, tweets.FIELDS, keys=tweets.KEYS, dlq_topic=dlq_topic(TOPIC_B),
                          bootstrap=ctx.bootstrap)
    keep = F.udf(_keep, BooleanType())
    job = QueryableJob("sup_b", events.where(keep(F.col("tweet_id"))), event_time="time",
                       watermark=tweets.WATERMARK, topic=TOPIC_B)
    job.operator("per_tweet_1h").groupBy(window("1 hour"), "tweet_id").agg(
        A.count().alias("events"))
    return job
'''


class Events(threading.Thread):
    """Tweets events to both topics, ~``rate``/s each, event time now, until stopped."""

    def __init__(self, bootstrap: str, topics: tuple[str, str], rate: int = 200) -> None:
        super().__init__(daemon=True)
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
        self.topics, self.rate = topics, rate
        self.stop = threading.Event()

    def send(self, topic: str, key: str) -> None:
        event = {"tweet_id": key, "event": "impression", "time": int(time.time() * 1000)}
        self.producer.produce(topic, orjson.dumps(event), key=key.encode())

    def run(self) -> None:
        i = 0
        while not self.stop.wait(1 / 10):
            for _ in range(self.rate // 10):
                i += 1
                for topic in self.topics:
                    self.send(topic, f"tw-{i % 500}")
            self.producer.poll(0)
        self.producer.flush(30)


@pytest.fixture
def running(broker, tmp_path: Path) -> Iterator[tuple[Child, ShardProcess, Events, str]]:
    topics = (f"sup-a-{tmp_path.name[-6:]}", f"sup-b-{tmp_path.name[-6:]}")
    (tmp_path / "supjobs.py").write_text(JOBS_MODULE.format(a=topics[0], b=topics[1]))
    storage = str(tmp_path / "storage")
    shard = ShardProcess.make("sup0", tmp_path / "data", storage, tmp_path / "logs")
    shard.start_and_wait()
    port = free_port()
    # a stalled commit waits; it does not fail the job while this test freezes the shard
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "QSTATE_COMMIT_TIMEOUT_S": "600"}
    job = Child("jobs", qstate_command(
        "job", "supjobs:build_a", "supjobs:build_b", "--bootstrap", broker.bootstrap,
        "--storage", storage, "--checkpoints", str(tmp_path / "ckpt"), "--partitions", "2",
        "--shards", shard.address, "--trigger", "1 second", "--no-live",
        "--metrics-port", str(port)), tmp_path / "logs" / "jobs.log", env=env).start()
    events = Events(broker.bootstrap, topics)
    events.start()
    try:
        yield job, shard, events, f"http://127.0.0.1:{port}"
    finally:
        events.stop.set()
        if shard.alive():
            os.kill(shard.pid, signal.SIGCONT)
        if job.alive():
            job.stop()
        shard.stop()
        events.join(60)


BATCHES = "qstate_job_batches_total"


class Metrics:
    """One sample of the ``qstate job`` process's /metrics. ``value`` is for assertions: a
    scrape that fails, or a sample that is not there, fails the test. ``seen`` is for waits:
    None while the page does not answer (Spark starting) or lacks the sample (before a
    job's first batch), so a wait goes on until its deadline; never a number standing in."""

    def __init__(self, job: Child, url: str) -> None:
        self.job, self.url = job, url

    def _samples(self, name: str, labels: dict[str, str]) -> list[float]:
        assert self.job.alive(), self.job.log_path.read_text()[-3000:]
        found = [float(s.value) for s in scrape(self.url).matching(name, **labels)]
        assert len(found) <= 1, (name, labels, found)
        return found

    def value(self, name: str, **labels: str) -> float:
        found = self._samples(name, labels)
        assert found, f"no sample {name}{labels} on {self.url}/metrics"
        return found[0]

    def seen(self, name: str, **labels: str) -> float | None:
        try:
            found = self._samples(name, labels)
        except httpx.TransportError:
            return None
        return found[0] if found else None


def at_least(got: float | None, floor: float) -> bool:
    return got is not None and got >= floor


def test_a_failed_job_is_dropped_the_other_keeps_committing_and_a_stall_shows_as_lag(
        running) -> None:
    job, shard, events, url = running
    m = Metrics(job, url)
    wait_until(lambda: all(at_least(m.seen(BATCHES, job=name), 2) for name in ("sup_a", "sup_b")),
               240, "both jobs committing")
    # B's bug: one record it cannot handle fails its query
    events.send(events.topics[1], "boom")
    events.producer.flush(10)
    wait_until(lambda: m.seen("qstate_job_up", job="sup_b") == 0, 120, "job B reported down")
    assert "job sup_b failed" in job.log_path.read_text()
    after = m.value(BATCHES, job="sup_a")
    wait_until(lambda: at_least(m.seen(BATCHES, job="sup_a"), after + 3), 120,
               "job A committing after B failed")
    assert m.value("qstate_job_up", job="sup_a") == 1 and job.alive()

    # A stalls: its one shard frozen (a busy or hung server, not a dead one). A stays up,
    # commits nothing, and its lag grows with every event produced meanwhile.
    lag = ("qstate_job_lag_events", {"job": "sup_a", "topic": events.topics[0]})
    os.kill(shard.pid, signal.SIGSTOP)
    try:
        stalled = m.value(BATCHES, job="sup_a")
        first = wait_until(lambda: at_least(v := m.seen(lag[0], **lag[1]), 600) and v, 120,
                           "A's lag past 600 events")
        wait_until(lambda: at_least(m.seen(lag[0], **lag[1]), float(first) + 600),  # type: ignore[arg-type]
                   120, "A's lag still growing")
        # at most the batches under way when the shard froze (one recorded, one waiting)
        assert m.value(BATCHES, job="sup_a") <= stalled + 2
        assert m.value("qstate_job_up", job="sup_a") == 1
    finally:
        os.kill(shard.pid, signal.SIGCONT)
    # back: A catches up
    wait_until(lambda: (v := m.seen(lag[0], **lag[1])) is not None and v < 600, 240,
               "A caught up after the stall")
    assert m.value(BATCHES, job="sup_a") > stalled + 2


def test_sigterm_to_the_whole_group_stops_it_cleanly(running) -> None:
    """systemd stops a service with SIGTERM to every process of its control group, so
    Spark's JVM gets it when the driver does and may be gone before the driver stops its
    queries. The driver still stops, says so and exits 0, as its --help says for SIGTERM
    (Py4J's and PySpark's own threads may log what they were doing when the JVM went)."""
    job, _, _, url = running
    m = Metrics(job, url)
    wait_until(lambda: all(at_least(m.seen(BATCHES, job=name), 2) for name in ("sup_a", "sup_b")),
               240, "both jobs committing")
    seen = len(job.log_path.read_bytes())
    assert job.proc is not None
    os.killpg(job.pid, signal.SIGTERM)
    rc = job.proc.wait(90)
    said = job.log_path.read_bytes()[seen:].decode(errors="replace")
    assert rc == 0, said[-3000:]  # an error left uncaught ends it with 1
    assert "stopped in" in said, said[-3000:]
