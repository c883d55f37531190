"""Read your own writes, end to end (issue 27 item 3): a producer writes a record, takes its
offset from Kafka's delivery report, asks the router which batch counted it
(``GET /v1/jobs/{job}/position``), and reads with ``min_batch`` set to that batch: the
answer counts the record, every time, while the job runs live. Ground truth is the producer's
own count of what it wrote for a key no one else writes."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import orjson
from confluent_kafka import Message, Producer

from qstate.client import Client
from qstate.core.errors import Unavailable
from qstate.core.records.manifest import read_manifest
from qstate.core.records.storage import Storage
from qstate.jobs.job import JobContext
from qstate.jobs.runtime.launch import start_job
from tests.helpers import wait_until

P = 8
HOUR = 3_600_000


def produce_one(p: Producer, topic: str, key: str, t_ms: int) -> tuple[int, int]:
    """One impression of ``key``; its (partition, offset) from the delivery report."""
    got: list[Message] = []
    p.produce(topic, orjson.dumps({"tweet_id": key, "event": "impression", "time": t_ms}),
              key.encode(), on_delivery=lambda err, msg: got.append(msg) if not err else None)
    assert p.flush(10) == 0 and got, "not delivered"
    partition, offset = got[0].partition(), got[0].offset()
    assert partition is not None and offset is not None
    return partition, offset


def test_produce_offset_position_min_batch_reads_your_writes(
        spark, broker, topic: str, tmp_path: Path, storage_uri: str, shards, router) -> None:
    job = f"ryw{topic[-6:]}"
    ctx = JobContext(broker.bootstrap, storage_uri, tmp_path / "ckpt", P, "500 milliseconds",
                     topic=topic, job=job, shards=[s.address for s in shards])
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    now = int(time.time() * 1000)
    running = start_job(spark, "tweets", ctx)  # makes the topic
    produce_one(producer, topic, "warm-up", now)
    url = f"{router.url}/v1/state/{job}/per_tweet_1h/impressions"
    try:
        with Client(router.url, timeout=30, retries=60, backoff_s=0.25) as c:
            wait_until(lambda: httpx.get(f"{router.url}/v1/jobs/{job}").status_code == 200,
                       60, "the job's operators registered")
            key = f"mine-{topic[-6:]}"
            for written in range(1, 6):  # the key's count after each record
                partition, offset = produce_one(producer, topic, key, now + written)
                # not read yet: 503 naming where the job is; the client retries 503s
                pos = c.position(job, topic, partition, offset)
                assert (pos.partition, pos.offset) == (partition, offset)
                assert pos.end_offset > offset
                r = httpx.get(f"{url}/{key}", params={"min_batch": pos.batch}, timeout=30)
                assert r.status_code == 200, r.text
                body = r.json()
                assert body["batch"] >= pos.batch
                assert body["windows"][-1]["value"] == written, (written, pos, body)
            # the manifest of the answered batch says it ended past the offset, and the
            # batch before it did not reach it: the first batch that counted the record
            storage = Storage(storage_uri)
            ops = sorted(o["name"] for o in httpx.get(f"{router.url}/v1/jobs/{job}")
                         .json()["operators"])
            m = read_manifest(storage, job, ops[0], pos.batch)
            assert m.offsets[topic][partition] == pos.end_offset > offset
            if pos.batch > 0:
                before = read_manifest(storage, job, ops[0], pos.batch - 1)
                assert before.offsets[topic].get(partition, 0) <= offset
    finally:
        running.stop()
    # what the job never read: a 503 naming the batch it has; what it does not read: 404
    with Client(router.url, retries=0) as c:
        try:
            c.position(job, topic, 0, 10**12)
            raise AssertionError("an offset never written has no batch")
        except Unavailable as exc:
            assert "has not read offset" in exc.message
    missing = httpx.get(f"{router.url}/v1/jobs/{job}/position",
                        params={"topic": "other-topic", "partition": 0, "offset": 0})
    assert missing.status_code == 404 and topic in missing.json()["message"]
    bad = httpx.get(f"{router.url}/v1/jobs/{job}/position",
                    params={"topic": "a b", "partition": 0, "offset": 0})
    assert bad.status_code == 400
